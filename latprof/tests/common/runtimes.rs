//! The runtime tests' checks (tests/runtimes.rs on this kernel, tests/vm_runtimes.rs in the
//! VMs): a fixture that waits inside `outer() -> middle() -> waitHere()` and counts its own
//! sleeps there.

use std::collections::BTreeMap;

use serde_json::Value;

/// The fixtures' waits: a defect of `cargo xtask mutants` made in one event in 4 misses all of
/// them with probability (3/4)^50, under 1e-6 (docs/testing.md).
pub const WAITS: u64 = 50;

/// The sleeps of `doc` (one process's) under user frames that `name` calls `waitHere`,
/// `middle` and `outer`, in that order, innermost first: those of the fixture's waits, and the
/// others (a wait for the runtime's own sake: a safepoint, a collection, a compilation, in the
/// fixture's own count of its switches around the wait). The waits are those with `runtime`
/// (the runtime's frame that enters the wait) below the three, by the one native path from the
/// innermost frame to `runtime`'s that holds the most sleeps: every wait enters it so, and a
/// sleep by another path within the runtime's wait (a safepoint's on the way in or out, an
/// interrupt's) is one of the others. A frame out of place in some walks (a swapped pair, a
/// wrong row of the unwind tables) moves those waits to another path, and that path's
/// count short of the waits.
pub fn sleeps_in_three(
    doc: &Value,
    name: impl Fn(&str) -> Option<&str>,
    runtime: &str,
) -> (u64, u64) {
    let mut paths: BTreeMap<Vec<&str>, u64> = BTreeMap::new();
    let mut others = 0;
    for c in doc["causes"].as_array().expect("causes") {
        let frames: Vec<&str> = c["user_frames"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(at) = frames.iter().position(|f| name(f) == Some("waitHere")) else {
            continue;
        };
        // The runtime's own frames may lie between (Python's evaluation loop between its
        // functions' trampolines).
        let names: Vec<&str> = frames[at..]
            .iter()
            .filter_map(|f| name(f))
            .take(3)
            .collect();
        assert_eq!(names, ["waitHere", "middle", "outer"], "{frames:#?}");
        let count = c["count"].as_u64().expect("count");
        match frames[..at].iter().position(|f| f.contains(runtime)) {
            Some(entry) => *paths.entry(frames[..=entry].to_vec()).or_default() += count,
            None => others += count,
        }
    }
    let waits = paths.values().copied().max().unwrap_or(0);
    let by_other_paths: u64 = paths.values().sum::<u64>() - waits;
    (waits, others + by_other_paths)
}

/// Checks `doc`'s sleeps under the fixture's three functions against its own count (`slept`,
/// its switches around each of its `calls` waits): each wait slept at least once, under the
/// runtime's wait; the fixture's count holds those, and may hold the runtime's own waits
/// between its two reads of its count (under the three functions too), no more.
pub fn check_three(doc: &Value, err: &str, pid: u32, calls: u64, slept: u64, counted: (u64, u64)) {
    let (waits, others) = counted;
    // Each missing sleep once: `own_missing` already holds those recovered without their
    // backtrace (the document is the process's alone, `--pid`, or `dump --pid`'s).
    let missing = super::own_missing(doc, pid);
    assert!(
        waits + missing >= calls,
        "{waits} sleeps in the runtime's wait for {calls} waits ({missing} missing): {doc:#}\n{err}"
    );
    assert!(
        waits <= slept && slept <= waits + others + missing,
        "the fixture slept {slept} times in its waits; latprof counted {waits} in the runtime's \
         wait and {others} others under its functions ({missing} missing): {doc:#}\n{err}"
    );
}

/// Node's name of a JavaScript function in its perf map: `JS:~waitHere /path:15:18` (Node
/// 20; `~` interpreted, `^` baseline, `*` optimized code), `LazyCompile:~waitHere ...` (Node
/// 18, Debian 12's): `waitHere`.
pub fn javascript(frame: &str) -> Option<&str> {
    let name = ["JS:", "LazyCompile:", "Function:"]
        .iter()
        .find_map(|kind| frame.strip_prefix(kind))?;
    let name = name.trim_start_matches(['~', '^', '*', '+']);
    name.split(' ').next()
}

/// Python's name of a function in the perf map `-X perf` writes: `py::waitHere:/tmp/app.py`:
/// `waitHere`.
pub fn python(frame: &str) -> Option<&str> {
    frame.strip_prefix("py::")?.split(':').next()
}

//! Unwind tables (`--user-stacks`) on the real kernel: a C program built with frame pointers
//! waits in glibc's `pthread_cond_timedwait`, which keeps none (it saves the caller's frame
//! pointer and reuses the register: 0 at the futex call), inside `outer -> middle ->
//! wait_here`. A frame-pointer walk ends in libc; with the tables latprof loads for libc the
//! kernel steps through it, and every wait is counted under the whole chain, exactly, in both
//! modes; without them (`--debug-no-unwind-tables`), under none. Needs root and gcc (`cargo
//! xtask test`).
use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
};

use serde_json::Value;

mod common;

use common::{
    LATPROF, TempDir,
    ustacks::{build_fixture, causes_where, function, user_frames},
};

/// The fixture's own functions, innermost first, above glibc's condition wait.
const FRAMES: [&str; 4] = ["wait_here", "middle", "outer", "main"];

/// Runs the fixture (`count` waits of 2 ms) under `latprof stats --user-stacks --all-sleeps
/// --format json --pid PID ARGS`: the JSON, latprof's stderr, the sleeps it reported missing
/// and the waits that slept by the fixture's own count.
fn run(fixture: &Path, count: u32, args: &[&str]) -> (Value, String, u64, u64) {
    let mut child = Command::new(fixture)
        .args([count.to_string().as_str(), "2000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the fixture");
    let pid = child.id().to_string();
    let mut cmd = Command::new(LATPROF);
    cmd.args(["stats", "--user-stacks", "--all-sleeps", "--format", "json"])
        .args(["--duration", "120s", "--pid", &pid])
        .args(args)
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("start the fixture");
    let out = child.wait_with_output().expect("wait for the fixture");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "fixture failed: {said}");
    let waited = common::fact(
        &said
            .split_whitespace()
            .filter_map(|w| {
                let (k, v) = w.split_once('=')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect::<Vec<_>>(),
        "waited",
    );
    let (out, rest) = common::interrupt(latprof, stderr);
    let missing = common::reported_missing(&rest);
    let json = serde_json::from_slice(&out.stdout).expect("stats JSON");
    (json, rest, missing, waited)
}

/// Whether `frames` hold the fixture's chain right above libc's frames, then libc's start.
fn whole_chain(frames: &[String]) -> bool {
    let Some(at) = frames.iter().position(|f| function(f) == FRAMES[0]) else {
        return false;
    };
    at > 0
        && frames[at..].len() > FRAMES.len()
        && frames[at..at + FRAMES.len()]
            .iter()
            .zip(FRAMES)
            .all(|(f, want)| function(f) == want)
        && frames[at + FRAMES.len()].starts_with("__libc_start")
}

/// With the tables, in both modes: every wait that slept under glibc's frames, then
/// `wait_here`, `middle`, `outer`, `main` and libc's start, counted exactly.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_wait_in_glibcs_frameless_code_keeps_its_callers() {
    latprof::probe::check_privileges()
        .expect("unwind table tests need root or CAP_BPF+CAP_PERFMON: run `cargo xtask test`");
    let _serial = common::serial("the user stack tests");
    let dir = TempDir::new("unwind");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ustacks/condwait.c");
    let fixture = build_fixture(&source, &dir.0, "condwait", true);
    for mode in ["lazy", "normal"] {
        let (json, rest, missing, waited) = run(&fixture, 200, &["--mode", mode]);
        assert!(waited > 0, "the fixture never slept");
        let futex = causes_where(&json, "futex", |_| true);
        let whole: Vec<&&Value> = futex
            .iter()
            .filter(|c| whole_chain(&user_frames(c)))
            .collect();
        let counted: u64 = whole
            .iter()
            .map(|c| c["count"].as_u64().expect("count"))
            .sum();
        if let Err(why) = common::exact_count(counted, waited, missing) {
            panic!(
                "{mode}: the waits under {FRAMES:?}: {why}; the futex causes: {futex:#?}\n{rest}"
            );
        }
        for c in &whole {
            let frames = user_frames(c);
            // glibc's own frames first (the condition wait's), named from its symbols.
            assert!(
                frames[0].contains("futex") || frames[0].contains("pthread_cond"),
                "{mode}: innermost user frame is not glibc's wait: {frames:?}"
            );
            assert!(!frames.iter().any(|f| f == "[truncated]"), "{frames:?}");
        }
    }
    // The control: without the tables (what a kernel without bpf_loop does) the walk ends in
    // glibc, so a glibc that kept its frame pointers would not pass the check above unseen.
    let (json, rest, _, waited) = run(&fixture, 50, &["--debug-no-unwind-tables"]);
    assert!(waited > 0, "the fixture never slept");
    let whole = causes_where(&json, "futex", whole_chain);
    assert!(
        whole.is_empty(),
        "whole without the tables: this glibc keeps its frame pointers, so the check above shows \
         nothing of the tables: {whole:#?}\n{rest}"
    );
}

/// `--user-stacks` over the whole machine loads the best programs, the tables' walk in them:
/// the walk under `bpf_loop` is verified once (as a bounded loop, or with its state on the
/// program's stack, the verifier gave up on the best variant and latprof fell back to walking
/// every counted sleep's kernel stack, silently but for a warning).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn user_stacks_machine_wide_load_the_best_programs() {
    latprof::probe::check_privileges()
        .expect("unwind table tests need root or CAP_BPF+CAP_PERFMON: run `cargo xtask test`");
    let _serial = common::serial("the user stack tests");
    let out = Command::new(LATPROF)
        .args(["--user-stacks", "stats", "--duration", "1s"])
        .output()
        .expect("run latprof");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("programs: backtraces at wakeup through the stack cache")
            && !err.contains("not the best variant"),
        "{err}"
    );
}

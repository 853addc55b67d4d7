//! Issue 32: off-CPU stacks of programs a runtime runs (an interpreter, a JIT), with
//! `--user-stacks`, on the real kernel, as a user runs them. Today: what Debian 12's Python
//! 3.11 shows, recorded so that a change is seen (README, "Runtimes"). Needs root and
//! Debian's python3 (`cargo xtask test` installs it).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
};

use serde_json::Value;

mod common;

use common::LATPROF;

/// Debian 12's interpreter (not one a version manager put first on the PATH).
const PYTHON: &str = "/usr/bin/python3.11";

/// Python 3.11 has no perf map of its own (`-X perf` came in 3.12), and it runs the calls
/// from one Python function to another within one C frame of its evaluation loop: a
/// `time.sleep` inside `outer() -> middle() -> wait_here()` is counted exactly, at the kernel's
/// nanosleep, with the interpreter's C frames above it (glibc's `clock_nanosleep`, CPython's
/// `_PyEval_EvalFrameDefault` once), and no Python function's name. What reading the
/// interpreter's own frames would take is in README, "Runtimes".
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn python_3_11_shows_its_interpreter_frames_not_its_functions() {
    assert!(
        std::path::Path::new(PYTHON).exists(),
        "{PYTHON} is missing: `cargo xtask test` installs Debian's python3"
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/runtimes/sleep_in_three.py"
    );
    let count = 30;
    let mut python = Command::new(PYTHON)
        .args([script, &count.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python");
    let pid = python.id();
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--user-stacks", "--all-sleeps", "stats", "--format", "json"])
        .args(["--pid", &pid.to_string()])
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    let mut stdin = python.stdin.take().expect("python's stdin");
    stdin.write_all(b"go\n").expect("start python");
    let mut line = String::new();
    BufReader::new(python.stdout.as_mut().expect("python's stdout"))
        .read_line(&mut line)
        .expect("read python");
    assert_eq!(line.trim(), format!("done slept={count}"));
    drop(stdin);
    assert!(python.wait().expect("wait for python").success());
    let (out, err) = common::interrupt(latprof, stderr);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stats' JSON");
    // Every nanosleep counted once, short only by those whose wakeup the kernel hid (this
    // host's service threads): recovered without their backtrace, under a cause of their own
    // (the document is the process's alone: `--pid`), or lost, each one checked by latprof
    // against the hidden switches.
    let counted = common::nanosleeps_of(&doc);
    let missing = common::own_missing(&doc, pid) + common::recovered_blind(&doc);
    common::reported_missing(&err);
    if let Err(why) = common::exact_count(counted, count, missing) {
        panic!("{why}: {doc:#}\n{err}");
    }
    let naps: Vec<&Value> = doc["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| {
            c["kind"] == "sleep"
                && c["frames"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == "hrtimer_nanosleep"))
        })
        .collect();
    assert_eq!(naps.len(), 1, "one nanosleep cause: {naps:#?}\n{err}");
    let nap = naps[0];
    let user: Vec<&str> = nap["user_frames"]
        .as_array()
        .expect("user frames")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = |name: &str| user.iter().position(|f| f.starts_with(name));
    let (libc, eval) = (at("__GI___clock_nanosleep"), at("_PyEval_EvalFrameDefault"));
    assert!(
        libc == Some(0) && eval.is_some(),
        "glibc's clock_nanosleep first, CPython's evaluation loop above it: {user:#?}"
    );
    assert_eq!(
        user.iter()
            .filter(|f| f.starts_with("_PyEval_EvalFrameDefault"))
            .count(),
        1,
        "three Python calls, one C frame: {user:#?}"
    );
    assert!(
        !user.iter().any(|f| ["outer", "middle", "wait_here"]
            .iter()
            .any(|n| f.contains(n))),
        "a Python function named: README's Runtimes is out of date: {user:#?}"
    );
}

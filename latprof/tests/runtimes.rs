//! Issue 32: off-CPU stacks of programs a runtime runs (an interpreter, a JIT), with
//! `--user-stacks`, on the real kernel, as a user runs them. Today: what Debian 12's Python
//! 3.11 shows, recorded so that a change is seen (docs/guide/user-stacks.md, "Runtimes"), and JIT code named from
//! a perf map. Needs root, Debian's python3 and gcc (`cargo xtask test` installs them). One
//! test at a time: each counts a process's every sleep.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
};

use serde_json::Value;

mod common;

use common::{
    LATPROF, roots,
    runtimes::{WAITS, check_three, javascript, python, sleeps_in_three},
};

/// Debian 12's interpreter (not one a version manager put first on the PATH).
const PYTHON: &str = "/usr/bin/python3.11";

/// Python 3.11 has no perf map of its own (`-X perf` came in 3.12), and it runs the calls
/// from one Python function to another within one C frame of its evaluation loop: a
/// `time.sleep` inside `outer() -> middle() -> waitHere()` is counted exactly, at the kernel's
/// nanosleep, with the interpreter's C frames above it (glibc's `clock_nanosleep`, CPython's
/// `_PyEval_EvalFrameDefault` once), and no Python function's name. What reading the
/// interpreter's own frames would take is in docs/guide/user-stacks.md, "Runtimes".
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn python_3_11_shows_its_interpreter_frames_not_its_functions() {
    let _guard = common::serial("the runtime tests");
    assert!(
        std::path::Path::new(PYTHON).exists(),
        "{PYTHON} is missing: `cargo xtask test` installs Debian's python3"
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/runtimes/sleep_in_three.py"
    );
    let count = WAITS;
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
    assert!(line.starts_with("done slept="), "python said {line:?}");
    drop(stdin);
    assert!(python.wait().expect("wait for python").success());
    let (out, err) = common::interrupt(latprof, stderr);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stats' JSON");
    // Every nanosleep counted once, short only by those whose wakeup the kernel hid (this
    // host's service threads): recovered without their backtrace, under a cause of their own,
    // or lost, each one checked by latprof against the hidden switches. `own_missing` takes
    // each once (with `--pid` the recovered ones are the document's own causes).
    let counted = common::nanosleeps_of(&doc);
    let missing = common::own_missing(&doc, pid);
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
    // The first call takes another C path than the later ones (before CPython specializes
    // the call): one cause or two.
    assert!(
        !naps.is_empty() && naps.len() <= 2,
        "one or two nanosleep causes: {naps:#?}\n{err}"
    );
    for nap in naps {
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
            !user.iter().any(|f| ["outer", "middle", "waitHere"]
                .iter()
                .any(|n| f.contains(n))),
            "a Python function named: docs/guide/user-stacks.md's Runtimes is out of date: {user:#?}"
        );
    }
}

/// JIT code (a small JIT built here, tests/fixtures/runtimes/jit.c): each function it makes is
/// named from its perf map, the second one made only after latprof read that map (the map is
/// read again as it grows), each function's sleeps counted exactly, its frames under a
/// `[jit]` module in JSON (`user_modules`) and a `[jit]` mapping of their own in pprof.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn jit_functions_are_named_even_when_made_after_latprof_started() {
    let _guard = common::serial("the runtime tests");
    let dir = common::TempDir::new("jit");
    let jit = dir.file("jit");
    let status = Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&jit)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/runtimes/jit.c"
        ))
        .status()
        .expect("gcc (cargo xtask test installs it)");
    assert!(status.success(), "gcc jit.c");
    // Two functions' sleeps: 50 in all (`WAITS`).
    let count = WAITS / 2;
    let (out, err, pid) = under_stats(&jit, count, "json");
    let doc: Value = serde_json::from_slice(&out).expect("stats' JSON");
    // Short only by the sleeps whose wakeup the kernel hid (this host's service threads), each
    // checked by latprof against the hidden switches: lost, or recovered without their
    // backtrace, each taken once by `own_missing` (with `--pid`, the document's own causes).
    let missing = common::own_missing(&doc, pid);
    for name in ["jit_first", "jit_second"] {
        let causes: Vec<&Value> = doc["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .filter(|c| c["user_frames"][0] == name)
            .collect();
        assert_eq!(causes.len(), 1, "{name}: {causes:#?}\n{err}");
        let cause = causes[0];
        let counted = cause["count"].as_u64().expect("count");
        if let Err(why) = common::exact_count(counted, count, missing) {
            panic!("{name}: {why}: {cause:#}");
        }
        assert_eq!(cause["user_modules"][0], "[jit]", "{cause:#}");
        // Its caller, the C program with frame pointers, named from its symbols.
        let caller = cause["user_frames"][1].as_str().unwrap_or("");
        assert!(caller.starts_with("run (jit.c:"), "{cause:#}");
        assert_eq!(cause["user_modules"][1].as_str(), jit.to_str(), "{cause:#}");
    }
    let (out, _, _) = under_stats(&jit, count, "pprof");
    let profile = latprof::export::pprof::decode(&out).expect("a profile");
    let jit_mapping = profile
        .mapping
        .iter()
        .find(|m| profile.string(m.filename) == "[jit]")
        .expect("a [jit] mapping");
    let mut in_jit: Vec<&str> = profile
        .location
        .iter()
        .filter(|l| l.mapping_id == jit_mapping.id)
        .flat_map(|l| &l.line)
        .filter_map(|line| profile.function.iter().find(|f| f.id == line.function_id))
        .map(|f| profile.string(f.name))
        .collect();
    in_jit.sort_unstable();
    assert_eq!(in_jit, ["jit_first", "jit_second"]);
}

/// Runs the JIT at `jit` (two functions, `count` sleeps each) under `stats --user-stacks --pid
/// --format FORMAT`; returns latprof's output, its stderr and the JIT's pid.
fn under_stats(jit: &std::path::Path, count: u64, format: &str) -> (Vec<u8>, String, u32) {
    let mut work = Command::new(jit)
        .args([&count.to_string(), "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the jit");
    let pid = work.id();
    let mut cmd = Command::new(LATPROF);
    cmd.args([
        "--user-stacks",
        "--all-sleeps",
        "stats",
        "--pid",
        &pid.to_string(),
    ])
    .args(["--format", format])
    .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    let mut stdin = work.stdin.take().expect("the jit's stdin");
    let mut stdout = BufReader::new(work.stdout.take().expect("the jit's stdout"));
    for name in ["jit_first", "jit_second"] {
        // The second function is made, and its line added to the perf map, after latprof
        // read the map for the first.
        stdin.write_all(b"make\n").expect("ask the jit");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the jit");
        assert_eq!(line.trim(), format!("made {name} slept={count}"));
    }
    drop(stdin);
    assert!(work.wait().expect("wait for the jit").success());
    let (out, err) = common::interrupt(latprof, stderr);
    common::reported_missing(&err);
    (out.stdout, err, pid)
}

/// How latprof watches the runtime in `while_it_lives`.
enum Via {
    /// `stats --format json --pid PID`.
    Stats,
    /// `record` (the whole machine, with `top`'s histograms and run-queue waits), then `dump
    /// --format json --pid PID` of its last snapshot, taken while the runtime lives.
    Record,
}

/// Runs `runtime` (a fixture that sleeps once a line comes on stdin, says `done slept=N`,
/// then lives until its stdin closes) under `latprof --user-stacks --all-sleeps ARGS`, as
/// `via` says; `before_naming` runs with its pid once it said it is done, before latprof
/// names the frames (while it lives). Returns the JSON, latprof's stderr, the pid and the
/// sleeps the fixture counted.
fn while_it_lives(
    runtime: &mut Command,
    args: &[&str],
    via: &Via,
    before_naming: impl FnOnce(u32),
) -> (Value, String, u32, u64) {
    let mut work = runtime
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the runtime");
    let pid = work.id();
    reading_stdin(pid);
    let dir = common::TempDir::new("runtime-record");
    let recording = dir.file("run.lpr");
    let mut cmd = Command::new(LATPROF);
    // Every frame (the runtime's waits for its own sake can be deep): the fixture's
    // functions are found in each of its sleeps that has them.
    cmd.args(["--user-stacks", "--all-sleeps", "--stack-depth", "127"])
        .args(args)
        .stdout(Stdio::piped());
    let ready = match via {
        Via::Stats => {
            cmd.args(["stats", "--format", "json", "--pid", &pid.to_string()]);
            "attached"
        }
        Via::Record => {
            cmd.args(["record", "--interval", "200ms", "-o"])
                .arg(&recording);
            "recording to"
        }
    };
    let (latprof, stderr) = common::start(&mut cmd, ready);
    let mut stdin = work.stdin.take().expect("the runtime's stdin");
    stdin.write_all(b"go\n").expect("start the runtime");
    let mut line = String::new();
    BufReader::new(work.stdout.as_mut().expect("the runtime's stdout"))
        .read_line(&mut line)
        .expect("read the runtime");
    let slept = line
        .trim()
        .strip_prefix("done slept=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the runtime said {line:?}"));
    before_naming(pid);
    if let Via::Record = via {
        // Snapshots after the work, taken while the runtime lives (a recording names the
        // frames of each snapshot as it is written).
        std::thread::sleep(std::time::Duration::from_millis(600));
    }
    let (out, err) = common::interrupt(latprof, stderr);
    drop(stdin);
    assert!(work.wait().expect("wait for the runtime").success());
    common::reported_missing(&err);
    let json = match via {
        Via::Stats => out.stdout,
        Via::Record => common::output_of(Command::new(LATPROF).arg("dump").arg(&recording).args([
            "--format",
            "json",
            "--pid",
            &pid.to_string(),
        ])),
    };
    let doc: Value = serde_json::from_slice(&json).expect("latprof's JSON");
    (doc, err, pid, slept)
}

/// Waits until process `pid` sleeps in a read of its stdin (the fixture's wait for its go
/// line): the runtime has started (a JVM takes seconds), and a command that execs into it
/// (`chroot`) has exec'd, before latprof reads its memory map and attaches.
fn reading_stdin(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        // Any of its threads (a JVM's main method runs on a thread of its own).
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| dir.filter_map(Result::ok).collect::<Vec<_>>())
            .unwrap_or_default();
        if threads.iter().any(|t| {
            std::fs::read_to_string(t.path().join("syscall")).is_ok_and(|s| s.starts_with("0 0x0 "))
        }) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the runtime (pid {pid}) never read its stdin"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Node running the fixture: `Atomics.wait` `WAITS` times inside `outer() -> middle() ->
/// waitHere()`.
fn node() -> Command {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/runtimes/sleep_in_three.js"
    );
    let mut node = Command::new("node");
    // In a folder of its own: V8 writes an isolate-*-v8.log where it runs.
    node.current_dir(std::env::temp_dir()).args([
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
        script,
        &WAITS.to_string(),
    ]);
    node
}

/// Node with `--perf-basic-prof --interpreted-frames-native-stack`: an `Atomics.wait` inside
/// `outer() -> middle() -> waitHere()` is counted exactly under those three JavaScript
/// functions, in order, above V8's wait (glibc's condition wait, which keeps no frame pointer,
/// stepped through by the unwind tables). Named while it lives: V8 buffers its perf map.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn node_names_the_javascript_functions_that_wait() {
    let _guard = common::serial("the runtime tests");
    let (doc, err, pid, slept) = while_it_lives(&mut node(), &[], &Via::Stats, |_| {});
    let counted = sleeps_in_three(&doc, javascript, "Builtin_AtomicsWait");
    check_three(&doc, &err, pid, WAITS, slept, counted);
}

/// The same in a recording of the whole machine (`record`, then `dump`): `top`'s, `record`'s
/// and `serve`'s programs (histograms, run-queue waits) walk through glibc by the unwind
/// tables too.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recording_names_the_javascript_functions_that_wait() {
    let _guard = common::serial("the runtime tests");
    let (doc, err, pid, slept) = while_it_lives(&mut node(), &[], &Via::Record, |_| {});
    assert!(
        !err.contains("not the best variant"),
        "record loads the best programs:\n{err}"
    );
    let counted = sleeps_in_three(&doc, javascript, "Builtin_AtomicsWait");
    check_three(&doc, &err, pid, WAITS, slept, counted);
}

/// Python 3.13 (Debian 13's, in a root debootstrap made: kept in
/// /var/cache/latprof-tests/roots) with `-X perf`: a `time.sleep` inside `outer() -> middle()
/// -> waitHere()` is counted exactly under those three functions, in order, above glibc's
/// `clock_nanosleep`, named from the perf map Python writes in its own `/tmp` (the root's,
/// read through the process's root), the walk stepping through the interpreter (no frame
/// pointers: its unwind table) and its trampolines (one row of their own, `trampolines.rs`).
#[test]
#[ignore = "needs root and debootstrap: run `cargo xtask test`"]
fn python_3_13_names_its_functions_with_x_perf() {
    let _guard = common::serial("the runtime tests");
    let root = roots::bootstrapped("trixie-python3", "trixie", &["python3"]);
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/runtimes/sleep_in_three.py"
        ),
        root.join("tmp/sleep_in_three.py"),
    )
    .expect("copy the fixture into the root");
    let (doc, err, pid, slept) = while_it_lives(
        &mut roots::in_root(
            &root,
            &[
                "python3",
                "-X",
                "perf",
                "/tmp/sleep_in_three.py",
                &WAITS.to_string(),
            ],
        ),
        &[],
        &Via::Stats,
        |_| {},
    );
    // Python leaves its map behind.
    let _ = std::fs::remove_file(root.join(format!("tmp/perf-{pid}.map")));
    let counted = sleeps_in_three(&doc, python, "clock_nanosleep");
    check_three(&doc, &err, pid, WAITS, slept, counted);
}

/// A Java method's name in the JIT's perf map: `void SleepInThree.waitHere(long)`:
/// `waitHere`.
fn java(frame: &str) -> Option<&str> {
    let name = frame.split('(').next()?;
    name.strip_prefix("void SleepInThree.")
}

/// OpenJDK 17 with `-XX:+PreserveFramePointer`, the fixture's methods compiled once (`-Xbatch
/// -XX:TieredStopAtLevel=1`, no inlining, nothing else compiled) and named from the perf map `jcmd PID
/// Compiler.perfmap` writes: a `Thread.sleep` inside
/// `outer() -> middle() -> waitHere()` is counted exactly under those three methods, in order,
/// above the JVM's `JVM_Sleep`, in lazy and normal mode.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn java_names_the_methods_that_sleep() {
    let _guard = common::serial("the runtime tests");
    let dir = common::TempDir::new("java");
    let status = Command::new("javac")
        .arg("-d")
        .arg(&dir.0)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/runtimes/SleepInThree.java"
        ))
        .status()
        .expect("javac (cargo xtask test installs openjdk-17-jdk-headless)");
    assert!(status.success(), "javac SleepInThree.java");
    for mode in ["lazy", "normal"] {
        let (doc, err, pid, slept) = while_it_lives(
            Command::new("java")
                .args(["-XX:+PreserveFramePointer", "-XX:-Inline"])
                // The fixture's methods compiled, once each (C1 only), as soon as they are due
                // (its warm-up calls), the thread waiting for it: a method compiled again
                // leaves the perf map, and the frames of its older code unnamed. Nothing else
                // compiled: no waits for the compiler elsewhere.
                .args(["-Xbatch", "-XX:TieredStopAtLevel=1"])
                .arg("-XX:CompileCommand=quiet")
                .arg("-XX:CompileCommand=compileonly,SleepInThree::*")
                .arg("-cp")
                .arg(&dir.0)
                .args(["SleepInThree", &WAITS.to_string()]),
            &["--mode", mode],
            &Via::Stats,
            |pid| {
                let status = Command::new("jcmd")
                    .args([&pid.to_string(), "Compiler.perfmap"])
                    .stdout(Stdio::null())
                    .status()
                    .expect("jcmd");
                assert!(status.success(), "jcmd {pid} Compiler.perfmap");
            },
        );
        let counted = sleeps_in_three(&doc, java, "JVM_Sleep");
        check_three(&doc, &format!("{mode}\n{err}"), pid, WAITS, slept, counted);
    }
}

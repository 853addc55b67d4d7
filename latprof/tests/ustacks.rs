//! Issue 17: user-space backtraces (`--user-stacks`) on the real kernel. A C server built
//! here with gcc waits for requests on a pipe (`main -> serve_requests -> wait_for_request ->
//! read`); latprof must name those frames in order above the kernel's pipe read, with the
//! exact count, after the server exited, from another mount namespace, and say where a
//! program without frame pointers leaves the backtrace unknown. A Rust program built with
//! frame pointers gets its names demangled. Needs root and gcc (`cargo xtask test`).
use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard},
};

use serde_json::Value;

mod common;

use common::{
    LATPROF, TempDir,
    ustacks::{SERVER_FRAMES, build_server, causes_where, function, user_frames},
};

/// One latprof at a time: the tests count everything the machine does.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn root() {
    latprof::probe::check_privileges()
        .expect("user stack tests need root or CAP_BPF+CAP_PERFMON: run `cargo xtask test`");
}

/// What a run of the server said: its reads and those that found no request yet (each
/// slept once in the kernel's pipe read).
struct Served {
    served: u64,
    waited: u64,
}

/// Parses what a server printed at its end.
fn served(out: &std::process::Output) -> Served {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "server failed ({}): {text}",
        out.status
    );
    let value = |key: &str| -> u64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("server said no {key}=: {text}"))
    };
    Served {
        served: value("served"),
        waited: value("waited"),
    }
}

/// Runs `server` (started with `wait`: it waits for a line on stdin) to its end under
/// `latprof ARGS --pid PID`: it has exited before latprof prints. Returns latprof's stdout,
/// its stderr, the sleeps it reported missing (hidden by the kernel: see `reported_missing`)
/// and what the server said.
fn run_on(server: &mut Command, args: &[&str]) -> (Vec<u8>, String, u64, Served) {
    let mut child = server
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the server");
    let pid = child.id().to_string();
    let mut cmd = Command::new(LATPROF);
    cmd.args(args).args(["--pid", &pid]).stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    child
        .stdin
        .take()
        .expect("server stdin")
        .write_all(b"go\n")
        .expect("start the server");
    let served = served(&child.wait_with_output().expect("wait for the server"));
    let (out, rest) = common::interrupt(latprof, stderr);
    let missing = common::reported_missing(&rest);
    (out.stdout, rest, missing, served)
}

/// `run_on` under `latprof stats --user-stacks --all-sleeps --format json ARGS`; the JSON.
fn stats_on(server: &mut Command, args: &[&str]) -> (Value, String, u64, Served) {
    // Every sleep (--all-sleeps): on a loaded machine a 2 ms wait can outlast the cutoff for
    // interruptible sleeps that are not counted. Its own process only (--pid): other tests
    // may run servers of the same name.
    let mut all = vec!["stats", "--user-stacks", "--all-sleeps", "--format", "json"];
    all.extend(["--duration", "120s"]);
    all.extend(args);
    let (out, rest, missing, served) = run_on(server, &all);
    let json = serde_json::from_slice(&out).expect("stats JSON");
    (json, rest, missing, served)
}

fn count(causes: &[&Value]) -> u64 {
    causes
        .iter()
        .map(|c| c["count"].as_u64().expect("count"))
        .sum()
}

/// glibc's names for its `read`, the innermost user frame of each of the server's reads:
/// aliases at one address (`read` and `__read` in its dynamic symbols; `__libc_read` and the
/// hidden `__GI_` forms in its own symbols, where its debug symbols are installed).
fn is_libc_read(frame: &str) -> bool {
    let name = function(frame);
    let name = name.split('@').next().unwrap_or(name);
    matches!(
        name,
        "read" | "__read" | "__libc_read" | "__GI_read" | "__GI___read" | "__GI___libc_read"
    )
}

/// The line of server.c that holds `call`: latprof names a return address by its call
/// instruction (the byte before it), so each of the server's frames shows the line of the
/// call it made.
fn call_line(call: &str) -> usize {
    let source = std::fs::read_to_string(common::ustacks::server_source()).expect("server.c");
    let at = source
        .lines()
        .position(|l| l.contains(call))
        .unwrap_or_else(|| panic!("server.c no longer calls {call}"));
    at + 1
}

/// The server's own frames as latprof must name them when it is built with `-g`: each
/// function with the line of its call, innermost first (`SERVER_FRAMES`).
fn server_frames_with_lines() -> Vec<String> {
    let calls = [
        "read(fd, buf, 1)",
        "wait_for_request(fd, &request)",
        "serve_requests(p[0], count)",
    ];
    SERVER_FRAMES
        .iter()
        .zip(calls)
        .map(|(name, call)| format!("{name} (server.c:{})", call_line(call)))
        .collect()
}

/// Whether `frames` are the server's whole chain: glibc's `read`, the server's three
/// functions (`own`: as the build names them), and libc's start of main, where a walk
/// ends, and nothing else.
fn is_whole_server_chain(frames: &[String], own: &[String]) -> bool {
    frames.len() == own.len() + 2
        && is_libc_read(&frames[0])
        && frames[1..=own.len()] == *own
        && function(&frames[own.len() + 1]).starts_with("__libc_start")
}

/// The pipe-read causes that hold one of the server's own functions below `main`: the
/// sleeps of its reads (its wait for the go line, also a pipe read, goes through `main`
/// alone, if latprof saw it begin).
fn server_reads(json: &Value) -> Vec<&Value> {
    causes_where(json, "pipe_read", |frames| {
        frames
            .iter()
            .any(|f| ["wait_for_request", "serve_requests"].contains(&function(f)))
    })
}

/// Every pipe-read sleep of the server's reads is counted under its whole chain, named with
/// the lines of its calls, exactly as many as the server counted itself.
fn check_server_run(json: &Value, missing: u64, served: &Served, rest: &str) {
    assert!(served.waited > 0, "the server never waited");
    let own = server_frames_with_lines();
    let reads = server_reads(json);
    for c in &reads {
        let frames = user_frames(c);
        assert!(
            is_whole_server_chain(&frames, &own),
            "a read of the server not under its whole chain (glibc's read, {own:?}, libc's \
             start): {frames:?}\n{rest}"
        );
    }
    if let Err(why) = common::exact_count(count(&reads), served.waited, missing) {
        panic!(
            "the server's reads that slept ({} reads) under {SERVER_FRAMES:?}: {why}; causes: \
             {reads:#?}\n{rest}",
            served.served
        );
    }
}

/// With frame pointers, in both modes: the server's functions in order above libc's read,
/// counted exactly, named after the server exited (latprof printed after it was gone).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn c_server_frames_named_in_order_with_the_exact_count() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-c");
    let server = build_server(&dir.0, "server", true);
    for mode in ["lazy", "normal"] {
        let (json, rest, missing, served) = stats_on(
            Command::new(&server).args(["300", "2000", "wait"]),
            &["--mode", mode],
        );
        check_server_run(&json, missing, &served, &rest);
    }
    // The folded lines put the user frames outermost, from libc's start of main in.
    let mut cmd = Command::new(LATPROF);
    cmd.args([
        "stats",
        "--user-stacks",
        "--format",
        "folded",
        "--duration",
        "120s",
    ])
    .stdout(Stdio::piped());
    let (child, stderr) = common::start(&mut cmd, "attached");
    served(
        &Command::new(&server)
            .args(["100", "2000"])
            .output()
            .expect("server"),
    );
    let (out, _) = common::interrupt(child, stderr);
    let text = String::from_utf8_lossy(&out.stdout);
    // Outermost first: main, serve_requests, wait_for_request, then libc's read.
    let outward: Vec<&str> = SERVER_FRAMES.iter().rev().copied().collect();
    let line = text
        .lines()
        .find(|l| {
            let frames: Vec<&str> = l.split(';').map(function).collect();
            frames.windows(3).any(|w| w == outward.as_slice())
        })
        .unwrap_or_else(|| panic!("no folded line with the server's chain:\n{text}"));
    assert!(line.starts_with("__libc_start"), "{line}");
    assert!(
        line.contains("pipe_read "),
        "kernel frames innermost: {line}"
    );
}

/// A Rust program built with frame pointers: its functions demangled (path::to::function).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn rust_frames_are_demangled() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-rust");
    let bin = dir.file("rust-server");
    let status = Command::new("rustc")
        .args(["--edition", "2024", "--crate-name", "rust_server", "-O"])
        .args(["-C", "force-frame-pointers=yes", "-o"])
        .arg(&bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ustacks/server.rs"))
        .status()
        .expect("rustc");
    assert!(status.success(), "rustc failed");
    let (json, rest, missing, served) =
        stats_on(Command::new(&bin).args(["300", "2000", "wait"]), &[]);
    let chain = causes_where(&json, "pipe_read", |frames| {
        frames
            .iter()
            .any(|f| function(f) == "rust_server::requests::wait_for_request")
    });
    let counted = count(&chain);
    if let Err(why) = common::exact_count(counted, served.waited, missing) {
        panic!("the Rust server's sleeps: {why}: {chain:#?}\n{rest}");
    }
    // Each of them, not only the first: the server's two functions in the order it called
    // them, below them nothing of the server's own (std's read path and libc's), and every
    // name demangled.
    for c in &chain {
        let frames = user_frames(c);
        let at = frames
            .iter()
            .position(|f| function(f) == "rust_server::requests::wait_for_request")
            .expect("found above");
        assert_eq!(
            frames.get(at + 1).map(|f| function(f)),
            Some("rust_server::requests::serve_requests"),
            "{frames:?}"
        );
        assert!(
            !frames[..at]
                .iter()
                .any(|f| function(f).starts_with("rust_server::")),
            "the server's own frames below its read: {frames:?}"
        );
        assert!(
            !frames
                .iter()
                .any(|f| f.starts_with("_ZN") || f.starts_with("_R")),
            "mangled names: {frames:?}"
        );
    }
}

/// The server run from a private mount namespace, from a path that exists only there:
/// named through the process's own view of its files.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn server_in_another_mount_namespace_is_named() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-ns");
    let server = build_server(&dir.0, "server", true);
    // Mounted over in the namespace only: on the host this directory stays empty.
    let hidden = dir.file("only-in-namespace");
    std::fs::create_dir(&hidden).expect("mkdir");
    let script = format!(
        "mount -t tmpfs latprof-test {h} && cp {s} {h}/ns-server && exec {h}/ns-server 300 2000 wait",
        h = hidden.display(),
        s = server.display()
    );
    let (json, rest, missing, served) = stats_on(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        &[],
    );
    assert!(
        std::fs::read_dir(&hidden)
            .expect("read dir")
            .next()
            .is_none(),
        "the namespace's mount showed on the host"
    );
    check_server_run(&json, missing, &served, &rest);
}

/// The server reached by two execs from a shell that slept first (`sh -> env -> server`, in
/// one pid, as the hardening tests' gated workloads run): the server's map may take the
/// address of the shell's, freed at the first exec, and its frames are still its own, named
/// and counted (they were `[address space gone]`: the layout memo kept the shell's). Ten
/// runs: where a new map lands is the allocator's choice.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn server_after_two_execs_is_named() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-execs");
    let server = build_server(&dir.0, "server", true);
    let script = format!("read go; exec env {} 50 2000", server.display());
    for _ in 0..10 {
        let (json, rest, missing, served) = stats_on(Command::new("sh").args(["-c", &script]), &[]);
        check_server_run(&json, missing, &served, &rest);
    }
}

/// A server built without frame pointers (optimized, `-fomit-frame-pointer`). Walked by frame
/// pointers only (`--debug-no-unwind-tables`: as on a kernel without `bpf_loop`), the frames
/// found over the stack words kept are shown, then `[truncated]`, counted; nothing outside the
/// server's own chain. With the unwind tables (its optimized functions save the frame pointer
/// register and use it for something else, so it gets a table, as libc does) the chain is
/// whole, every sleep counted under it.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn no_frame_pointers_truncated_by_frame_pointers_whole_by_tables() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-nofp");
    let server = build_server(&dir.0, "server-nofp", false);
    let (json, rest, missing, served) = stats_on(
        Command::new(&server).args(["300", "2000", "wait"]),
        &["--debug-no-unwind-tables"],
    );
    let cut = causes_where(&json, "pipe_read", |frames| {
        frames
            .iter()
            .any(|f| function(f).starts_with("wait_for_request"))
    });
    let counted = count(&cut);
    if let Err(why) = common::exact_count(counted, served.waited, missing) {
        panic!("the server's sleeps, counted truncated: {why}: {cut:#?}\n{rest}");
    }
    for c in &cut {
        let frames = user_frames(c);
        // Only what the server's chain really is, in its order: glibc's read, the server's
        // function that called it, the one that called that where the stack words kept reach
        // its return address (gcc may suffix a clone's name), and the mark; never `main`,
        // whose return address lies past serve_requests' 2 KiB frame.
        let names: Vec<&str> = frames.iter().map(|f| function(f)).collect();
        let cut_chain = match names.as_slice() {
            [read, own @ .., last] if *last == latprof::ustacks::TRUNCATED => {
                is_libc_read(read)
                    && matches!(own, [w] | [w, _] if w.starts_with("wait_for_request"))
                    && own[1..].iter().all(|f| f.starts_with("serve_requests"))
            }
            _ => false,
        };
        assert!(cut_chain, "not the server's chain cut short: {frames:?}");
    }
    assert!(
        json["counters"]["user_stack_truncated"].as_u64() >= Some(1),
        "truncated backtraces not counted: {}",
        json["counters"]
    );
    let (json, rest, missing, served) =
        stats_on(Command::new(&server).args(["300", "2000", "wait"]), &[]);
    // Built without -g: its functions named without lines.
    let own: Vec<String> = SERVER_FRAMES.iter().map(|&f| f.to_owned()).collect();
    let reads = server_reads(&json);
    for c in &reads {
        let frames = user_frames(c);
        assert!(
            is_whole_server_chain(&frames, &own),
            "a read of the server not under its whole chain by the unwind tables: {frames:?}"
        );
    }
    if let Err(why) = common::exact_count(count(&reads), served.waited, missing) {
        panic!(
            "the server's sleeps under its whole chain by the unwind tables: {why}: {:#}\n{rest}",
            json["causes"]
        );
    }
}

/// Without `--user-stacks` nothing of it shows: no user frames, no walks.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn without_the_flag_no_user_frames() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-off");
    let server = build_server(&dir.0, "server", true);
    let mut cmd = Command::new(LATPROF);
    cmd.args(["stats", "--format", "json", "--duration", "120s"])
        .stdout(Stdio::piped());
    let (child, stderr) = common::start(&mut cmd, "attached");
    served(
        &Command::new(&server)
            .args(["50", "2000"])
            .output()
            .expect("server"),
    );
    let (out, _) = common::interrupt(child, stderr);
    let json: Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert!(
        json["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .all(|c| c.get("user_frames").is_none()),
        "user frames without --user-stacks"
    );
    assert_eq!(json["counters"]["user_stack_empty"], 0);
    let pipe = causes_where(&json, "pipe_read", |_| true);
    assert_ne!(pipe.len(), 0, "no pipe read counted: {json}");
}

/// `spikes --user-stacks`: each read that slept says where in the server it waited. The spike
/// threshold is latprof's floor (1 us): the server counts every read that slept, however
/// short (one whose request came within microseconds is no long sleep, but a sleep), and
/// latprof counts all but those under 1 us, which it names by process.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn spikes_say_where_in_the_program() {
    root();
    let _serial = serial();
    let dir = TempDir::new("ustacks-spikes");
    let server = build_server(&dir.0, "server", true);
    let (out, rest, missing, served) = run_on(
        Command::new(&server).args(["50", "3000", "wait"]),
        &["--user-stacks", "--all-sleeps", "--spike", "1us", "spikes"],
    );
    let text = String::from_utf8_lossy(&out);
    let reads = text
        .lines()
        .filter(|l| l.contains(" in wait_for_request (server.c:"))
        .count() as u64;
    // The server's own pid, from the lines' PID column.
    let pid: u32 = text
        .lines()
        .find(|l| l.contains(" in wait_for_request (server.c:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no spike of the server:\n{text}"));
    let short = common::own_short(&rest, pid);
    // Each read that slept: a spike each, but those under 1 us and those reported missing.
    assert!(
        reads <= served.waited && reads + missing + short >= served.waited,
        "{} reads slept, {reads} spikes say where ({missing} missing, {short} under 1us):\n{text}\n{rest}",
        served.waited
    );
}

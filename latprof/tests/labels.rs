//! pprof sample labels of whose sleeps they are (issue 28): `pid`, `thread_name` and
//! `container_id`, by default, in `stats`, `serve` and `dump`. The hard case is a task gone
//! before any read saw it: the kernel merges its records into the global table without its
//! pid, and only the exited tasks' log (`EXITED`) still tells them. A storm of short-lived
//! threads, each sleeping once and exiting, must come out labelled with its process and its
//! threads' name, every counted sleep once, none left untold.
//!
//! Root only: `#[ignore]`d for a plain `cargo test`, run by `cargo xtask test`.
use std::{collections::BTreeMap, process::Command};

mod common;

use common::{
    LATPROF, Workload,
    cgroups::{Cgroups, move_into},
    serve::{Serve, missing_so_far, nanosleeps, temp_dir},
};

/// The storm: 300 threads named `storm`, 8 at a time, each sleeping 2 ms once.
const STORM: [&str; 7] = [
    "exit-storm",
    "--count",
    "300",
    "--batch",
    "8",
    "--sleep",
    "2ms",
];

/// Whose sleeps a sample is, by its labels: pid, thread name, container id ("" where none).
type Whose = (String, String, String);

/// The nanosleep samples of a gzipped profile, summed by their labels.
fn nanosleeps_by_thread(gz: &[u8]) -> BTreeMap<Whose, u64> {
    let p = latprof::export::pprof::decode(gz).expect("a profile");
    let mut out = BTreeMap::new();
    for s in &p.sample {
        if !p.frame_names(s).contains(&"hrtimer_nanosleep") {
            continue;
        }
        let label = |key: &str| {
            s.label
                .iter()
                .find(|l| p.string(l.key) == key)
                .map_or(String::new(), |l| p.string(l.str).to_owned())
        };
        let whose = (label("pid"), label("thread_name"), label("container_id"));
        *out.entry(whose).or_default() += u64::try_from(s.value[0]).expect("a count");
    }
    out
}

/// The sleeps of process `pid` (its label) a gzipped profile holds under "[wakeup hidden from
/// tracing]": recovered without their backtrace where the kernel hid their wakeup.
fn recovered_blind(gz: &[u8], pid: u32) -> u64 {
    let p = latprof::export::pprof::decode(gz).expect("a profile");
    let pid = pid.to_string();
    p.sample
        .iter()
        .filter(|s| {
            p.frame_names(s)
                .contains(&latprof::symbols::Backtrace::WAKEUP_HIDDEN)
                && s.label
                    .iter()
                    .any(|l| p.string(l.key) == "pid" && p.string(l.str) == pid)
        })
        .map(|s| u64::try_from(s.value[0]).expect("a count"))
        .sum()
}

/// The storm's sleeps in `gz` are all told under its pid, `storm` and `container` (its
/// container's full id, or ""), and add up with what latprof said it missed of the process
/// (`missing`) to what it slept; no nanosleep goes out untold.
fn check_told(what: &str, gz: &[u8], whose: &Whose, slept: u64, missing: u64) {
    let by = nanosleeps_by_thread(gz);
    let told = by.get(whose).copied().unwrap_or(0);
    if let Err(why) = common::exact_count(told, slept, missing) {
        panic!("{what}: the storm's sleeps told as {whose:?}: {why}; by labels: {by:?}");
    }
    let untold = by
        .iter()
        .filter(|(k, _)| k.0.is_empty())
        .map(|(_, n)| n)
        .sum::<u64>();
    assert_eq!(untold, 0, "{what}: nanosleeps without a pid: {by:?}");
    eprintln!("{what}: {told} of {slept} storm sleeps told as {whose:?}");
}

/// The storm's labels: its pid, `storm`, and the container id where it runs in one.
fn storm(pid: u32, container: &str) -> Whose {
    (pid.to_string(), "storm".to_owned(), container.to_owned())
}

/// `stats --format pprof` (normal mode) and `serve` (lazy mode) on the storm's process: every
/// sleep of the threads, each gone before the read that counts it, carries the process and
/// the threads' name.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn exited_threads_are_told_by_process_and_name() {
    let _guard = common::serial("the label tests");
    let dir = temp_dir("labels");
    let file = dir.join("storm.pb.gz");

    // In a cgroup named as docker's systemd driver names a container's: its id is the
    // container_id label, in full.
    let id = format!("{:016x}", latprof::time::monotonic_ns()).repeat(4);
    let parent = format!("latprof-labels-{}", std::process::id());
    let scope = format!("{parent}/docker-{id}.scope");
    let cgroups = Cgroups::make(&[&parent, &scope]);
    let mut work = Workload::spawn(&STORM);
    let pid = work.pid();
    move_into(&work, cgroups.path(1));
    let out = std::fs::File::create(&file).expect("profile file");
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--mode", "normal", "stats", "--pid"])
        .arg(pid.to_string())
        .args(["--all-sleeps", "--duration", "60s", "--format", "pprof"])
        .stdout(out);
    let (child, stderr) = common::start(&mut cmd, "attached");
    work.go();
    let slept = work.wait_fact("slept");
    let (_, rest) = common::interrupt(child, stderr);
    work.release();
    drop(cgroups);
    let profile = std::fs::read(&file).expect("the profile");
    // Short only by the storm's sleeps latprof lost, or recovered without their backtrace,
    // where the kernel hid their wakeup (as serve's counters say below), and those under 1 us.
    check_told(
        "stats",
        &profile,
        &storm(pid, &id),
        slept,
        common::own_lost(&rest, pid)
            + common::own_short(&rest, pid)
            + recovered_blind(&profile, pid),
    );

    let mut work = Workload::spawn(&STORM);
    let pid = work.pid();
    let serve = Serve::start(&["--pid", &pid.to_string(), "--all-sleeps"]);
    work.go();
    let slept = work.wait_fact("slept");
    let metrics = serve.wait_for(30, "the storm's sleeps", |m| {
        nanosleeps(m) + missing_so_far(m) >= slept
    });
    let r = serve.get("/debug/pprof/offcpu?seconds=60");
    assert_eq!(r.status, 200, "{}", r.text());
    check_told(
        "serve",
        &r.body,
        &storm(pid, ""),
        slept,
        common::serve::missing(&metrics),
    );
    drop(serve);
    work.release();
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
}

/// A recording of the whole machine: `dump --format pprof` tells the storm's sleeps from
/// everything else by its pid label; `--profile-labels state` leaves the threads out.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recording_tells_exited_threads_apart() {
    let _guard = common::serial("the label tests");
    let dir = temp_dir("labels-dump");
    let recording = dir.join("run.lpr");
    let mut work = Workload::spawn(&STORM);
    let pid = work.pid();
    let (slept, rest) = common::record_while(&mut work, &recording);
    work.release();
    let dump = |labels: &str| -> Vec<u8> {
        let out = Command::new(LATPROF)
            .arg("dump")
            .arg(&recording)
            .args(["--format", "pprof", "--profile-labels", labels])
            .output()
            .expect("latprof dump");
        assert!(
            out.status.success(),
            "dump --format pprof: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let gz = dump("state,pid,thread_name,container_id");
    let by = nanosleeps_by_thread(&gz);
    let told = by.get(&storm(pid, "")).copied().unwrap_or(0);
    let missing =
        common::own_lost(&rest, pid) + common::own_short(&rest, pid) + recovered_blind(&gz, pid);
    if let Err(why) = common::exact_count(told, slept, missing) {
        panic!("dump: the storm's sleeps told: {why}; by labels: {by:?}");
    }
    // Without thread labels, one sample per backtrace and state again: the same sleeps.
    let bare = nanosleeps_by_thread(&dump("state"));
    assert_eq!(bare.keys().collect::<Vec<_>>(), [&Whose::default()]);
    assert_eq!(
        bare.values().sum::<u64>(),
        by.values().sum::<u64>(),
        "the same sleeps either way"
    );
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
}

//! Issue 16: who ended each sleep, on the real kernel: workloads whose wakers are known (a
//! pipe ping-pong between two named processes, a nanosleep loop, a futex released by a named
//! thread, UDP on loopback), `stats --format json` and `--format folded --wakers` as a user
//! runs them. Needs root (`cargo xtask test` runs these).
use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

use serde_json::Value;

mod common;

use common::{LATPROF, Workload};

/// Runs `latprof ARGS stats --all-sleeps` (JSON unless ARGS say otherwise) around `work`;
/// returns stdout and stderr.
fn stats(args: &[&str], work: impl FnOnce()) -> (String, String) {
    let mut cmd = Command::new(LATPROF);
    cmd.args(["stats", "--all-sleeps", "--duration", "120s"])
        .args(args)
        .stdout(Stdio::piped());
    let (child, stderr) = common::start(&mut cmd, "attached");
    work();
    let (out, rest) = common::interrupt(child, stderr);
    assert!(out.status.success(), "latprof failed: {rest}");
    // Any sleep lost or recovered must have overlapped a stretch where the kernel hid
    // switches (latprof checks each one and says so when one did not).
    common::reported_missing(&rest);
    (String::from_utf8(out.stdout).expect("utf-8"), rest)
}

/// One workload's run under `stats`.
struct Run<T> {
    /// stdout (parsed for `json_around`).
    out: T,
    /// stderr after the first line.
    err: String,
    /// The workload's pid.
    pid: u64,
    /// What the workload reported about its work (`key=value`).
    facts: Vec<(String, u64)>,
}

impl<T> Run<T> {
    /// The fact `key`, which the workload must have reported.
    fn fact(&self, key: &str) -> u64 {
        common::fact(&self.facts, key)
    }
}

/// Runs `stats ARGS` around one workload (`work`: its arguments), which it starts and lets
/// exit.
fn around(work: &[&str], args: &[&str]) -> Run<String> {
    let mut work = Workload::spawn(work);
    let pid = u64::from(work.pid());
    let mut facts = Vec::new();
    let (out, err) = stats(args, || {
        work.go();
        facts = work.wait_done();
    });
    work.release();
    Run {
        out,
        err,
        pid,
        facts,
    }
}

/// `around` with `--format json --wakers` and ARGS.
fn json_around(work: &[&str], args: &[&str]) -> Run<Value> {
    let mut all = vec!["--format", "json", "--wakers"];
    all.extend_from_slice(args);
    let run = around(work, &all);
    Run {
        out: serde_json::from_str(&run.out).expect("stats' JSON"),
        err: run.err,
        pid: run.pid,
        facts: run.facts,
    }
}

fn json(args: &[&str], work: impl FnOnce()) -> (Value, String) {
    let mut all = vec!["--format", "json", "--wakers"];
    all.extend_from_slice(args);
    let (out, err) = stats(&all, work);
    (serde_json::from_str(&out).expect("stats' JSON"), err)
}

/// One (sleeper, cause, waker) entry of the JSON's `wakers`.
#[derive(Debug, Clone)]
struct Entry {
    sleeper: u64,
    frames: Vec<String>,
    kind: String,
    pid: Option<u64>,
    comm: Option<String>,
    count: u64,
    backtraces: Vec<Vec<String>>,
}

fn entries(doc: &Value) -> Vec<Entry> {
    doc["wakers"]
        .as_array()
        .expect("wakers")
        .iter()
        .map(|w| Entry {
            sleeper: w["sleeper_pid"].as_u64().expect("sleeper_pid"),
            frames: w["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|f| f.as_str().expect("frame").to_owned())
                .collect(),
            kind: w["kind"].as_str().expect("kind").to_owned(),
            pid: w["pid"].as_u64(),
            comm: w["comm"].as_str().map(str::to_owned),
            count: w["count"].as_u64().expect("count"),
            backtraces: w["backtraces"].as_array().map_or_else(Vec::new, |bts| {
                bts.iter()
                    .map(|b| {
                        b["frames"]
                            .as_array()
                            .expect("frames")
                            .iter()
                            .map(|f| f.as_str().expect("frame").to_owned())
                            .collect()
                    })
                    .collect()
            }),
        })
        .collect()
}

/// The entries of `sleeper`'s sleeps at causes with a frame starting with `frame`.
fn of(all: &[Entry], sleeper: u64, frame: &str) -> Vec<Entry> {
    all.iter()
        .filter(|e| e.sleeper == sleeper && e.frames.iter().any(|f| f.starts_with(frame)))
        .cloned()
        .collect()
}

fn counter(doc: &Value, name: &str) -> u64 {
    doc["counters"][name].as_u64().expect("counter")
}

/// Of `entries` (process `pid`'s sleeps at one cause, `slept` of them by the workload's own
/// count), the count woken by what `who` accepts. Every sleep is counted once (short only by
/// the process's own sleeps lost where the kernel hid their wakeup), and each one not woken by
/// `who` is one of the process's own whose waking the kernel hid (its waker "unseen", each
/// checked against the hidden switches), or its task's first traced sleep, whose waking may
/// have come before latprof made the task's entry.
fn share(
    entries: &[Entry],
    doc: &Value,
    pid: u64,
    slept: u64,
    who: impl Fn(&Entry) -> bool,
    what: &str,
) -> u64 {
    let pid = u32::try_from(pid).expect("pid");
    let total: u64 = entries.iter().map(|e| e.count).sum();
    let theirs: u64 = entries.iter().filter(|e| who(e)).map(|e| e.count).sum();
    let unseen: u64 = entries
        .iter()
        .filter(|e| e.kind == "unseen")
        .map(|e| e.count)
        .sum();
    if let Err(why) = common::judge(doc, pid, total, slept) {
        panic!("{what}: {why}: {entries:#?}");
    }
    assert_eq!(theirs + unseen, total, "{what}: {entries:#?}");
    let known = common::own_unseen(doc, pid);
    assert!(
        unseen <= known,
        "{what}: {unseen} wakings unseen, {known} of them where the kernel hid switches or at a task's first sleep: {entries:#?}"
    );
    theirs
}

/// The pipe reads of `sleeper` (`pipe_read`, `anon_pipe_read` since 6.16).
fn pipe_reads(all: &[Entry], sleeper: u64) -> Vec<Entry> {
    of(all, sleeper, "pipe_read")
        .into_iter()
        .chain(of(all, sleeper, "anon_pipe_read"))
        .collect()
}

/// pong: the process (not ping) with the most pipe reads ping ended (the test itself reads
/// ping's stdout through a pipe too, once). By ping's pid: another test's ping-pong, beside
/// this one, has a ping too.
fn pong_of(all: &[Entry], ping: u64) -> Option<u64> {
    all.iter()
        .filter(|e| e.pid == Some(ping) && e.comm.as_deref() == Some("ping") && e.sleeper != ping)
        .filter(|e| e.frames.iter().any(|f| f.ends_with("pipe_read")))
        .max_by_key(|e| e.count)
        .map(|e| e.sleeper)
}

/// Two processes named ping and pong pass a byte over pipes, each on its own CPU: every pipe
/// sleep of each (the workload counts each side's) is counted once and ended by the other, in
/// JSON and in the folded wakers.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn pipe_ping_pong_is_woken_by_the_other_side() {
    let run = json_around(
        &[
            "pingpong",
            "--processes",
            "--named",
            "--apart",
            "--count",
            "2000",
        ],
        &["--waker-stacks"],
    );
    let (doc, ping) = (&run.out, run.pid);
    let all = entries(doc);
    let pong =
        pong_of(&all, ping).unwrap_or_else(|| panic!("no pipe read woken by ping: {}", run.err));
    for (sleeper, other, name, slept) in [
        (ping, pong, "pong", run.fact("ping_slept")),
        (pong, ping, "ping", run.fact("pong_slept")),
    ] {
        let pipe = pipe_reads(&all, sleeper);
        share(
            &pipe,
            doc,
            sleeper,
            slept,
            |e| e.kind == "task" && e.pid == Some(other) && e.comm.as_deref() == Some(name),
            &format!("pid {sleeper}'s pipe reads"),
        );
        // The waker wrote to the pipe: its backtrace says so.
        for e in pipe.iter().filter(|e| e.kind == "task") {
            assert!(
                e.backtraces
                    .iter()
                    .all(|b| b.iter().any(|f| f.contains("pipe_write"))),
                "{e:#?}"
            );
        }
    }
    assert_eq!(counter(doc, "waker_table_full"), 0);
}

/// A 2 ms nanosleep loop is woken by the timer interrupt, never by a task: every nanosleep
/// that slept (the workload counts its voluntary switches) is counted once.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn nanosleep_is_woken_by_the_timer() {
    let run = json_around(&["sleep", "--count", "200", "--interval", "2ms"], &[]);
    let naps = of(&entries(&run.out), run.pid, "hrtimer_nanosleep");
    share(
        &naps,
        &run.out,
        run.pid,
        run.fact("slept"),
        |e| e.kind == "timer",
        "nanosleeps",
    );
}

/// A futex wait released by a thread named futex-waker: each of the waiter's waits that slept
/// (the workload counts them) is woken by that thread, whose backtrace (`--waker-stacks`) is
/// the futex wake path; the folded wakers say the same.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_futex_is_woken_by_the_thread_that_releases_it() {
    let run = json_around(
        &["futex", "--count", "100", "--interval", "1ms"],
        &["--waker-stacks"],
    );
    let (doc, pid) = (&run.out, run.pid);
    // The waiter's waits only: the workload's main thread waits for its threads on a pipe,
    // and their wait for the release ends after latprof stopped.
    let futex = of(&entries(doc), pid, "futex_wait");
    share(
        &futex,
        doc,
        pid,
        run.fact("waited"),
        |e| e.kind == "task" && e.comm.as_deref() == Some("futex-waker"),
        "futex waits",
    );
    for e in futex.iter().filter(|e| e.kind == "task") {
        assert_eq!(e.pid, Some(pid), "the waker is a thread of the workload");
        assert!(!e.backtraces.is_empty(), "no waker backtrace: {e:#?}");
        for b in &e.backtraces {
            assert_eq!(
                b.first().map(String::as_str),
                Some("try_to_wake_up"),
                "{b:?}"
            );
            assert!(b.iter().any(|f| f == "futex_wake"), "{b:?}");
        }
    }
    // Folded: `waker;waker frames;--;sleeper frames value`.
    let Run {
        out: folded, pid, ..
    } = around(
        &["futex", "--count", "50", "--interval", "1ms"],
        &["--format", "folded", "--wakers", "--waker-stacks"],
    );
    let line = folded
        .lines()
        .find(|l| {
            l.starts_with(&format!("futex-waker [{pid}/"))
                && l.split_once(";--;")
                    .is_some_and(|(_, s)| s.contains("futex_wait"))
        })
        .unwrap_or_else(|| panic!("no futex-waker line:\n{folded}"));
    let (frames, value) = line.rsplit_once(' ').expect("value");
    let waker_part = frames.split(";--;").next().expect("waker part");
    assert!(
        waker_part.ends_with(";futex_wake;wake_up_q;try_to_wake_up"),
        "{line}"
    );
    assert!(value.parse::<u64>().expect("microseconds") > 0, "{line}");
}

/// UDP on loopback: each receive that waited (the workload counts them) is ended by the
/// network stack's softirq, which runs in the sending thread's context: not attributed to
/// that thread.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_udp_receive_is_woken_by_the_softirq_not_the_sender() {
    let run = json_around(&["udp", "--count", "100", "--interval", "2ms"], &[]);
    // Under __skb_wait_for_more_packets, or __skb_recv_udp where the wait is inlined (each
    // entry once: the first holds the second too).
    let rx: Vec<Entry> = entries(&run.out)
        .into_iter()
        .filter(|e| {
            e.sleeper == run.pid
                && e.frames.iter().any(|f| {
                    f.starts_with("__skb_wait_for_more_packets") || f.starts_with("__skb_recv_udp")
                })
        })
        .collect();
    share(
        &rx,
        &run.out,
        run.pid,
        run.fact("waited"),
        |e| e.kind == "softirq",
        "UDP receives",
    );
}

/// A waker table too small for the run: the overflow is counted (and said), and each cause's
/// sleeps whose waker found no room go to its "other" waker, not lost: a cause's wakers, its
/// "other" included, add up to its count, time and longest sleep exactly, and the "other"
/// rows to the overflow counted. The workload forks 200 children one at a time and waits for
/// each, whose exit wakes it: 200 wakers of one cause, for a table of 8. Only it is traced
/// (`--pid`), so that the table of other wakers (8 keys too, one per cause and sleeping
/// process) holds its few causes with room to spare; on a whole machine other processes' take
/// that table's 8 keys first, and the sleeps of a cause with no key there are the counter's
/// only.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_full_waker_table_is_counted_not_silent() {
    const TABLE: usize = 8;
    let mut work = Workload::spawn(&["forks", "--count", "200", "--sleep", "1ms"]);
    let pid = u64::from(work.pid());
    let (doc, err) = json(
        &[
            "--max-wakers",
            &TABLE.to_string(),
            "--pid",
            &pid.to_string(),
        ],
        || {
            work.go();
            work.wait_done();
        },
    );
    work.release();
    let full = counter(&doc, "waker_table_full");
    assert!(
        full > 0,
        "the table of {TABLE} never filled: {}",
        doc["wakers"]
    );
    let all = entries(&doc);
    assert!(all.iter().all(|e| e.sleeper == pid), "{:#?}", doc["wakers"]);
    // Every sleep counted at "other" is one the table had no room for, and the reverse.
    let other: u64 = all
        .iter()
        .filter(|e| e.kind == "other")
        .map(|e| e.count)
        .sum();
    assert_eq!(other, full, "{:#?}", doc["wakers"]);
    // The table holds no more wakers than its size.
    let kept = all.iter().filter(|e| e.kind != "other").count();
    assert!(kept <= TABLE, "{kept} wakers kept: {:#?}", doc["wakers"]);
    // Each cause's wakers against its count. A sleep whose wakeup the kernel hid and that
    // latprof recovered at the task's next switch is counted with no waker at all (the
    // wakeup, where the waker is noted, never came): the only sleeps a cause may have more
    // of, all of them the workload's (`--pid`).
    let recovered = counter(&doc, "sleeps_recovered");
    let process = doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("no process {pid}: {doc:#}"));
    let mut short = 0;
    let mut overflowed = false;
    for cause in process["causes"].as_array().expect("causes") {
        if cause["kind"] == "runqueue" {
            continue;
        }
        let n = |v: &Value, key: &str| v[key].as_u64().expect("a count");
        let wakers = cause["wakers"].as_array().expect("wakers");
        let count: u64 = wakers.iter().map(|w| n(w, "count")).sum();
        let total: u64 = wakers.iter().map(|w| n(w, "total_ns")).sum();
        let max = wakers.iter().map(|w| n(w, "max_ns")).max().unwrap_or(0);
        overflowed |= wakers.iter().any(|w| w["kind"] == "other");
        assert!(
            count <= n(cause, "count") && total <= n(cause, "total_ns"),
            "wakers counted twice: {cause:#}"
        );
        if count == n(cause, "count") {
            assert_eq!(
                (total, max),
                (n(cause, "total_ns"), n(cause, "max_ns")),
                "{cause:#}"
            );
        }
        short += n(cause, "count") - count;
    }
    assert!(overflowed, "no cause has an \"other\" waker: {process:#}");
    assert!(
        short <= recovered,
        "{short} sleeps without a waker, {recovered} recovered: {process:#}"
    );
    assert!(err.contains("raise --max-wakers"), "{err}");
}

/// Normal and lazy mode, attached at once to the same workload, give the same waker numbers.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn normal_and_lazy_mode_give_the_same_wakers() {
    let mut work = Workload::spawn(&["pingpong", "--processes", "--named", "--count", "500"]);
    let ping = u64::from(work.pid());
    let mut lazy = Command::new(LATPROF);
    lazy.args(["--mode", "lazy", "--wakers", "stats", "--format", "json"])
        .args(["--all-sleeps", "--duration", "120s"])
        .stdout(Stdio::piped());
    let (lazy, lazy_err) = common::start(&mut lazy, "attached");
    // Both stop after the workload exited: none of its sleeps ends after one stopped.
    let (normal_out, _) = json(&["--mode", "normal"], || {
        work.go();
        work.wait_done();
        work.release();
    });
    let (lazy_out, _) = common::interrupt(lazy, lazy_err);
    let lazy_out: Value = serde_json::from_slice(&lazy_out.stdout).expect("JSON");
    let table = |doc: &Value| -> BTreeMap<(u64, Vec<String>, String, Option<String>), u64> {
        let all = entries(doc);
        let pong = pong_of(&all, ping);
        let mut out = BTreeMap::new();
        for e in all
            .into_iter()
            .filter(|e| e.sleeper == ping || Some(e.sleeper) == pong)
        {
            *out.entry((e.sleeper, e.frames, e.kind, e.comm))
                .or_default() += e.count;
        }
        out
    };
    let (n, l) = (table(&normal_out), table(&lazy_out));
    assert!(!n.is_empty());
    assert_eq!(n, l);
}

/// The folded waker chains are by cause: `--by cgroup` with them is one line and exit 2,
/// before anything loads (stats) or is read (dump).
#[test]
fn waker_chains_are_by_cause_only() {
    for args in [
        &["--wakers", "stats", "--format", "folded", "--by", "cgroup"][..],
        &[
            "stats",
            "--waker-stacks",
            "--format",
            "folded",
            "--by",
            "cgroup",
        ],
        &[
            "dump",
            "/nonexistent.lpr",
            "--wakers",
            "--format",
            "folded",
            "--by",
            "cgroup",
        ],
    ] {
        let out = Command::new(LATPROF).args(args).output().expect("latprof");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("latprof: error: --wakers"),
            "{args:?}: {err}"
        );
    }
}

/// Without `--wakers` nothing is attributed: no waker programs, empty lists, no counters.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn wakers_are_opt_in() {
    let Run { out, .. } = around(
        &["sleep", "--count", "20", "--interval", "2ms"],
        &["--format", "json"],
    );
    let doc: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(doc["wakers"], Value::Array(Vec::new()));
    assert!(
        doc["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .all(|c| c["wakers"] == Value::Array(Vec::new())),
        "{out}"
    );
    assert_eq!(counter(&doc, "waker_unseen"), 0);
}

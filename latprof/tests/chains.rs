//! Issue 31: wait chains (`--chains`) on the real kernel, as a user runs them (`stats
//! --format json` and `--format folded`), around workloads whose processes measure their own
//! waits (`latprof-workload chain2`, `chain3`) and whose chains are therefore known. Needs root
//! (`cargo xtask test` runs these).
//!
//! Tolerance: a share latprof gives and the one the workload's clocks give differ by the
//! clocks' own slack, which latprof does not count as the sleep (the system call's entry and
//! exit around each wait, the wait for a CPU after each wakeup: a few tens of microseconds of
//! each 20 ms wait on this 2-CPU machine with three processes). Shares are compared within
//! `SHARE_TOLERANCE`.
use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

use serde_json::Value;

mod common;

use common::{LATPROF, Workload};

/// How far a share latprof gives may be from the workload's own (see the module's doc).
const SHARE_TOLERANCE: f64 = 0.05;

/// How far a time `top` shows may be from the same time in a `stats` beside it, as a part of
/// it. Both take each sleep's ends from the same switch and wakeup, each in its own program,
/// one after the other: under a microsecond apart (latprof's BPF time per event with
/// `--chains`, 397 to 639 ns in docs/bench-chains.md), so that over `top`'s 250 waits of
/// 20 ms the two differ by well under a millisecond, 0.0001 of their 5 s. 0.01 (50 ms) leaves
/// room for a vCPU taken away between two of the programs.
const BESIDE: f64 = 0.01;

/// One run of `stats --all-sleeps --chains ARGS` around a workload (`work`: its arguments).
struct Run {
    out: String,
    err: String,
    pid: u32,
    facts: Vec<(String, u64)>,
    /// The time the hypervisor took, while the workload ran, from the CPUs that its process
    /// named by the fact `syncer` ran on (`chain2`'s; `None` for a workload without one).
    syncer_stolen_ns: Option<u64>,
}

impl Run {
    fn fact(&self, key: &str) -> u64 {
        common::fact(&self.facts, key)
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.out).expect("stats' JSON")
    }
}

/// One test at a time (each measures shares on the machine's two CPUs).
fn around(work: &[&str], args: &[&str]) -> Run {
    let _guard = common::serial("the chain tests");
    let mut work = Workload::spawn(work);
    let pid = work.pid();
    let mut cmd = Command::new(LATPROF);
    cmd.args(["stats", "--all-sleeps", "--chains", "--duration", "120s"])
        .args(args)
        .stdout(Stdio::piped());
    let (child, stderr) = common::start(&mut cmd, "attached");
    let before = steal_by_cpu();
    work.go();
    let facts = work.wait_done();
    let after = steal_by_cpu();
    // Read while the syncer lives (until the release), after its last fsync.
    let syncer_stolen_ns = facts
        .iter()
        .find_map(|(k, v)| (k == "syncer").then_some(*v))
        .map(|syncer| {
            cpus_ran_on(u32::try_from(syncer).expect("pid"))
                .iter()
                .map(|cpu| {
                    let at = |steal: &BTreeMap<usize, u64>| steal.get(cpu).copied().unwrap_or(0);
                    at(&after).saturating_sub(at(&before))
                })
                .sum()
        });
    let (out, err) = common::interrupt(child, stderr);
    work.release();
    assert!(out.status.success(), "latprof failed: {err}");
    common::reported_missing(&err);
    Run {
        out: String::from_utf8(out.stdout).expect("utf-8"),
        err,
        pid,
        facts,
        syncer_stolen_ns,
    }
}

/// Each CPU's steal so far (`cpuN` lines of /proc/stat), in ns, by CPU: the time the
/// hypervisor took from it. A thread's clock of its time on a CPU does not count it, so that
/// a thread that measures its sleeps as the time it was neither on a CPU nor waiting for one
/// counts it as asleep.
fn steal_by_cpu() -> BTreeMap<usize, u64> {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    // SAFETY: no arguments.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("USER_HZ");
    stat.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let cpu = words.next()?.strip_prefix("cpu")?.parse().ok()?;
            // user nice system idle iowait irq softirq steal
            let ticks: u64 = words.nth(7)?.parse().ok()?;
            Some((cpu, ticks * 1_000_000_000 / hz))
        })
        .collect()
}

/// The CPUs process `pid` (alive) has run on since it started: the one it is on where it never
/// migrated (`se.nr_migrations` in /proc/PID/sched, where the kernel has that file), else
/// every CPU its affinity allows.
fn cpus_ran_on(pid: u32) -> Vec<usize> {
    let migrations: Option<u64> = std::fs::read_to_string(format!("/proc/{pid}/sched"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("se.nr_migrations"))?
                .split_once(':')?
                .1
                .trim()
                .parse()
                .ok()
        });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the syncer's stat");
    // Field 39, the CPU it last ran on (the 37th after the name's closing parenthesis).
    let on: usize = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').nth(36)?.parse().ok())
        .unwrap_or_else(|| panic!("no CPU in {stat}"));
    if migrations == Some(0) {
        return vec![on];
    }
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the syncer's status");
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_else(|| panic!("no Cpus_allowed_list in {status}"));
    list.trim()
        .split(',')
        .flat_map(|range| {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let n = |t: &str| -> usize { t.parse().unwrap_or_else(|_| panic!("CPU list {list}")) };
            n(first)..=n(last)
        })
        .collect()
}

/// Process `pid`'s causes in `doc` with a frame that starts with one of `frames`.
fn causes_of<'a>(doc: &'a Value, pid: u32, frames: &[&str]) -> Vec<&'a Value> {
    doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(u64::from(pid)))
        .flat_map(|p| p["causes"].as_array().expect("causes"))
        .filter(|c| has_frame(c, frames))
        .collect()
}

fn has_frame(v: &Value, frames: &[&str]) -> bool {
    v["frames"].as_array().is_some_and(|fs| {
        fs.iter()
            .filter_map(Value::as_str)
            .any(|f| frames.iter().any(|want| f.starts_with(want)))
    })
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {v:#}"))
}

fn parts(v: &Value) -> Vec<&Value> {
    v["behind"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn waker_pid(part: &Value) -> Option<u64> {
    part["waker"]["pid"].as_u64()
}

/// Checks the parts of `cause` (process `pid`'s) add up to its whole time, and that any part
/// "woken by unseen" is one of the process's own wakings the kernel hid (each checked
/// against the hidden switches). Returns the parts.
fn whole<'a>(doc: &Value, pid: u32, cause: &'a Value, live: bool) -> Vec<&'a Value> {
    let ps = parts(cause);
    let sum: u64 = ps.iter().map(|p| u(p, "time_ns")).sum();
    assert_eq!(sum, u(cause, "total_ns"), "parts of {cause:#}");
    let unseen: u64 = ps
        .iter()
        .filter(|p| p["kind"] == "woken_by" && p["woken_by"] == "unseen")
        .map(|p| u(p, "count"))
        .sum();
    assert!(
        !live || unseen <= common::own_unseen(doc, pid),
        "{unseen} wakings unseen, more than the kernel hid: {cause:#}"
    );
    ps
}

/// The one cause of `pid` at `frames`, its count judged against the workload's `slept`.
fn the_cause<'a>(doc: &'a Value, pid: u32, frames: &[&str], slept: u64, err: &str) -> &'a Value {
    let causes = causes_of(doc, pid, frames);
    assert_eq!(causes.len(), 1, "{frames:?} of {pid}: {causes:#?}\n{err}");
    let cause = causes[0];
    if let Err(why) = common::judge(doc, pid, u(cause, "count"), slept) {
        panic!("{frames:?} of {pid}: {why}: {cause:#}");
    }
    cause
}

#[expect(clippy::cast_precision_loss, reason = "shares")]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b as f64
}

const PIPE: [&str; 2] = ["pipe_read", "anon_pipe_read"];
const FSYNC: [&str; 4] = [
    "ext4_sync_file",
    "vfs_fsync_range",
    "do_fsync",
    "file_write_and_wait",
];

/// Two levels: a reader's pipe wait behind the fsync of the process that writes the pipe.
/// The part the syncer slept is exactly its sleeps as latprof counts them (each fsync starts
/// once the reader sleeps, so that the reader's wait holds it whole), close to what its own
/// schedstat says it slept, most of it under the fsync's backtraces; the rest is the
/// syncer running or waiting for a CPU. The issue asked for 90% behind the fsync: on this
/// machine's disk the syncer's own CPU time in write and fsync is about 40% of them (its
/// schedstat), so the share is what the syncer measured, not a fixed 90%.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_pipe_wait_is_behind_the_writers_fsync() {
    let dir = common::disk_dir();
    // 60 waits: a defect made in one event in 4 meets one of them but with a chance of
    // (3/4)^60, under 1e-6 (docs/testing.md, the mutants).
    let run = around(
        &["chain2", "--count", "60", "--dir", &dir],
        &["--format", "json"],
    );
    let doc = run.json();
    let syncer = run.fact("syncer");
    let cause = the_cause(&doc, run.pid, &PIPE, run.fact("waited"), &run.err);
    let total = u(cause, "total_ns");
    let (mut slept, mut fsync, mut unseen) = (0, 0, 0);
    for p in whole(&doc, run.pid, cause, true) {
        if p["kind"] == "woken_by" {
            // A waking the kernel hid (this host's service threads): no chain.
            unseen += u(p, "time_ns");
            continue;
        }
        assert_eq!(waker_pid(p), Some(syncer), "only the syncer woke it: {p:#}");
        match p["kind"].as_str() {
            Some("slept" | "slept_uncounted") => {
                slept += u(p, "time_ns");
                if has_frame(p, &FSYNC) {
                    fsync += u(p, "time_ns");
                }
            }
            Some("running" | "waiting_for_cpu") => {}
            other => panic!("{other:?}: {p:#}"),
        }
    }
    let own = run.fact("fsync_slept_ns");
    let syncer_causes = causes_of(&doc, u32::try_from(syncer).expect("pid"), &[""]);
    let of_kind = |kind: &str| -> u64 {
        syncer_causes
            .iter()
            .filter(|c| c["kind"] == kind)
            .map(|c| u(c, "total_ns"))
            .sum()
    };
    // Its sleeps whose wakeup the kernel hid are recovered under their own cause: counted, but
    // with no end the chains could see.
    let (recovered, counted) = (
        of_kind("recovered"),
        of_kind("sleep") + of_kind("recovered"),
    );
    // Every sleep of the syncer's in its fsyncs lies within a wait of the reader's (each fsync
    // starts once the reader has switched out in its read; the syncer lives on, so its sleeps
    // are its own in the snapshot): the chains put all its counted sleeps behind the reader
    // but those the workload saw outside its fsyncs, those of rounds in which it slept more
    // often than the kernel keeps a waker's sleeps (the earlier ones count as running), those
    // the kernel hid, and those within the reader's waits whose wakings it hid. In 20 runs
    // here all of those were 0 and the two equal.
    let allowed = run.fact("outside_slept_ns") + run.fact("crowded_slept_ns") + recovered + unseen;
    assert!(
        slept <= counted && counted - slept <= allowed,
        "{slept} ns behind the syncer, which latprof counted {counted} ns of sleeps ({allowed} \
         ns of them allowed elsewhere: {:?}): {cause:#}",
        run.facts
    );
    let stolen_ns = run
        .syncer_stolen_ns
        .expect("chain2 reports its syncer's pid");
    eprintln!(
        "the syncer slept {:.4} of the pipe wait ({:.4} under fsync), by its schedstat {:.4} ({stolen_ns} ns stolen from its CPUs)",
        ratio(slept, total),
        ratio(fsync, total),
        ratio(own, total),
    );
    // Its own account (its CPU time clock, its waits for a CPU: schedstat) says it slept 0.01
    // to 0.025 of the reader's waits more than latprof counts it asleep, in 22 runs here, and
    // 0.050 once, just after a build: its clock of its time on a CPU stops as the scheduler
    // takes it off its run queue, latprof's sleep starts at the switch, after the scheduler
    // has picked the next task (which, on a CPU going idle, includes balancing the CPUs'
    // loads): a microsecond or two per sleep, more on a busy machine, always that way round.
    // Twice the tolerance, then, from those 23 runs. What the hypervisor stole from the
    // syncer's CPU while it ran counts as asleep in its account too: at most the steal of the
    // CPUs it ran on over the run (one, where it never migrated), added. Allowed: latprof at
    // most the tolerance over its account, at most twice the tolerance and that steal under it.
    let (got, want) = (ratio(slept, total), ratio(own, total));
    let stolen = ratio(stolen_ns, total);
    assert!(
        got <= want + SHARE_TOLERANCE && want <= got + 2.0 * SHARE_TOLERANCE + stolen,
        "the syncer's sleeps: latprof {got:.4}, its schedstat {want:.4} ({stolen:.4} stolen \
         from its CPUs): {cause:#}"
    );
    // Most of its sleeps are the fsync's: now and then one of its writes sleeps too (a page
    // of the file's, a journal buffer), under another backtrace.
    assert!(
        fsync * 2 >= slept,
        "{fsync} of {slept} ns under fsync: {cause:#}"
    );
    assert_eq!(u(&doc["counters"], "chain_table_full"), 0);
}

/// Three levels: a futex wait behind the lock holder's pipe wait, behind the nanosleep of the
/// process that writes the pipe, which the timer ends: each level's share of the futex wait
/// matches the workload's clocks.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_futex_wait_is_behind_a_pipe_wait_behind_a_nanosleep() {
    let run = around(
        &["chain3", "--count", "20", "--interval", "20ms"],
        &["--format", "json"],
    );
    three_levels(&run.json(), run.pid, &run.facts, &run.err, true);
}

/// The three-level workload's chains in `doc` (its process `a`, its facts), as
/// `a_futex_wait_is_behind_a_pipe_wait_behind_a_nanosleep` says. Returns the futex wait's
/// cause and, two levels below it, chain-c's nanosleep.
fn three_levels<'a>(
    doc: &'a Value,
    a: u32,
    facts: &[(String, u64)],
    err: &str,
    live: bool,
) -> (&'a Value, &'a Value) {
    let fact = |key: &str| common::fact(facts, key);
    let (b, c) = (fact("b"), fact("c"));
    let cause = the_cause(doc, a, &["futex_wait"], fact("a_waited"), err);
    let total = u(cause, "total_ns");
    let ps = whole(doc, a, cause, live);
    let pipe: Vec<&Value> = ps
        .iter()
        .copied()
        .filter(|p| p["kind"] == "slept" && has_frame(p, &PIPE))
        .collect();
    assert_eq!(pipe.len(), 1, "{cause:#}");
    let pipe = pipe[0];
    assert_eq!(waker_pid(pipe), Some(b), "{pipe:#}");
    // A waker's clock around its sleep ends when it has a CPU again: latprof's part of its
    // sleep and of its wait for a CPU right after.
    let of_kind = |level: &[&Value], kind: &str, waker: Option<u64>| -> u64 {
        level
            .iter()
            .filter(|p| p["kind"] == kind && waker_pid(p) == waker)
            .map(|p| u(p, "time_ns"))
            .sum()
    };
    // Where the kernel hid a waking (this host's service threads), latprof cannot say whose
    // that sleep was behind (`woken_by` "unseen", each one the process's own, checked against
    // the hidden switches): its time may be missing from the share, no more.
    let unseen = |level: &[&Value], pid: u64| -> u64 {
        let ps: Vec<&&Value> = level
            .iter()
            .filter(|p| p["kind"] == "woken_by" && p["woken_by"] == "unseen")
            .collect();
        let n: u64 = ps.iter().map(|p| u(p, "count")).sum();
        let pid = u32::try_from(pid).expect("pid");
        // A recording keeps no per-process log of hidden wakings (live only): checked live.
        assert!(
            !live || n <= common::own_unseen(doc, pid),
            "{n} wakings of {pid} unseen"
        );
        ps.iter().map(|p| u(p, "time_ns")).sum()
    };
    // Below the first level a share is an average over the waker cause's sleeps (docs/guide/chains.md, Wait
    // chains), not the one sleep that overlapped: twice the tolerance there (one run in 12
    // here was 0.053 off at the second level).
    let share = |got: u64, hidden: u64, want: f64, what: &str, tolerance: f64| {
        let (got, hidden) = (ratio(got, total), ratio(hidden, total));
        assert!(
            got <= want + tolerance && got + hidden >= want - tolerance,
            "{what}: latprof {got:.4} (and {hidden:.4} unseen), the workload's clocks {want:.4}: {doc:#}"
        );
    };
    share(
        u(pipe, "time_ns") + of_kind(&ps, "waiting_for_cpu", Some(b)),
        unseen(&ps, u64::from(a)),
        ratio(fact("ab_ns"), fact("a_ns")),
        "chain-b's pipe wait",
        SHARE_TOLERANCE,
    );
    let level2 = parts(pipe);
    let nap: Vec<&Value> = level2
        .iter()
        .copied()
        .filter(|p| p["kind"] == "slept" && has_frame(p, &["hrtimer_nanosleep", "do_nanosleep"]))
        .collect();
    assert_eq!(nap.len(), 1, "{pipe:#}");
    let nap = nap[0];
    assert_eq!(waker_pid(nap), Some(c), "{nap:#}");
    share(
        u(nap, "time_ns") + of_kind(&level2, "waiting_for_cpu", Some(c)),
        unseen(&ps, u64::from(a)) + unseen(&level2, b),
        ratio(fact("abc_ns"), fact("a_ns")),
        "chain-c's nanosleep",
        2.0 * SHARE_TOLERANCE,
    );
    // The timer ends the nanosleep (or its waking was hidden): no task, no chain below it.
    let below = parts(nap);
    let timer = of_kind(&below, "woken_by", None);
    let hidden = unseen(&below, c);
    // Each part below is scaled on its own, cut to whole nanoseconds.
    let nap_ns = u(nap, "time_ns");
    assert!(
        timer <= nap_ns && timer + below.len() as u64 >= nap_ns,
        "{nap:#}"
    );
    assert!(
        below
            .iter()
            .all(|p| p["woken_by"] == "timer" || p["woken_by"] == "unseen"),
        "{nap:#}"
    );
    assert!(hidden <= timer, "{nap:#}");
    (cause, nap)
}

/// `record --chains` keeps the chains (format 10): `dump --format json` of the recording shows
/// the three levels as `stats` does, and `dump --chains --format folded` the futex wait, then
/// chain-b's pipe wait, then chain-c's nanosleep.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recording_keeps_the_chains() {
    let rec = Recorded::around(
        "chains-record",
        &["chain3", "--count", "20", "--interval", "20ms"],
    );
    let doc: Value = serde_json::from_str(&rec.dump(&["--format", "json"])).expect("dump's JSON");
    three_levels(&doc, rec.pid, &rec.facts, &rec.err, false);
    let folded = rec.dump(&["--chains", "--format", "folded"]);
    let chained = folded.lines().any(|l| {
        let levels: Vec<&str> = l.split(";--;").collect();
        levels.len() == 3
            && levels[0].split(';').any(|f| f.starts_with("futex_wait"))
            && levels[1]
                .split(';')
                .any(|f| PIPE.iter().any(|p| f.starts_with(p)))
            && levels[2]
                .split(';')
                .any(|f| f.starts_with("hrtimer_nanosleep"))
    });
    assert!(chained, "no futex;--;pipe;--;nanosleep line:\n{folded}");
}

/// No false chains: in a ping-pong, each side's waker slept just before (the wakee's own
/// write woke it), but not during the wakee's wait: each pipe wait is its waker running or
/// waiting for a CPU (but for pong's start). A nanosleep, which the timer ends, has no chain.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn no_chain_where_the_waker_did_not_sleep() {
    let run = around(
        &[
            "pingpong",
            "--processes",
            "--named",
            "--apart",
            "--count",
            "2000",
        ],
        &["--format", "json"],
    );
    let doc = run.json();
    let ping = run.pid;
    let cause = the_cause(&doc, ping, &PIPE, run.fact("ping_slept"), &run.err);
    let ps = whole(&doc, ping, cause, true);
    let pong = ps
        .iter()
        .find_map(|p| waker_pid(p))
        .unwrap_or_else(|| panic!("no waker: {cause:#}"));
    // Pong's pipe reads, which ping's own writes ended, are never behind ping's waits. Pong
    // sleeps otherwise only as it starts (pinning itself to its CPU waits for the migration):
    // behind ping's first waits, a real chain.
    let mut other = 0;
    for p in &ps {
        match p["kind"].as_str() {
            Some("running" | "waiting_for_cpu") => assert_eq!(waker_pid(p), Some(pong), "{p:#}"),
            Some("woken_by") => {}
            Some("slept") => {
                assert!(
                    !has_frame(p, &PIPE),
                    "pong's pipe read behind ping's: {cause:#}"
                );
                other += u(p, "count");
            }
            kind => panic!("{kind:?}: {cause:#}"),
        }
    }
    assert!(
        other <= 2,
        "{other} of ping's waits behind pong's sleeps: {cause:#}"
    );
    let run = around(
        &["sleep", "--count", "200", "--interval", "2ms"],
        &["--format", "json"],
    );
    let doc = run.json();
    let cause = the_cause(
        &doc,
        run.pid,
        &["hrtimer_nanosleep"],
        run.fact("slept"),
        &run.err,
    );
    for p in whole(&doc, run.pid, cause, true) {
        assert_eq!(p["kind"], "woken_by", "{cause:#}");
        assert!(
            p["woken_by"] == "timer" || p["woken_by"] == "unseen",
            "{p:#}"
        );
    }
}

/// Folded chains (`dump --chains --format folded` of a `record --chains`): the reader's pipe
/// wait, then `--`, then the syncer's fsync frames, outermost first; their lines add up to
/// what the same recording's JSON puts behind the fsync (each line cut to whole
/// microseconds).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn folded_chains_put_the_fsync_under_the_pipe_wait() {
    let dir = common::disk_dir();
    let rec = Recorded::around("chains-folded", &["chain2", "--count", "20", "--dir", &dir]);
    let folded = rec.dump(&["--chains", "--format", "folded"]);
    let (mut lines, mut us) = (0u64, 0u64);
    for l in folded.lines() {
        let Some((frames, value)) = l.rsplit_once(' ') else {
            panic!("no value: {l}");
        };
        let Some((sleeper, rest)) = frames.split_once(";--;") else {
            continue;
        };
        // The waker's part first (its own parts, deeper, follow it on the same line).
        let waker = rest.split(";--;").next().unwrap_or_default();
        if sleeper
            .split(';')
            .any(|f| PIPE.iter().any(|w| f.starts_with(w)))
            && waker
                .split(';')
                .any(|f| FSYNC.iter().any(|w| f.starts_with(w)))
        {
            lines += 1;
            us += value.parse::<u64>().expect("microseconds");
        }
    }
    let doc: Value = serde_json::from_str(&rec.dump(&["--format", "json"])).expect("JSON");
    let ns: u64 = doc["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| has_frame(c, &PIPE))
        .flat_map(|c| parts(c))
        .filter(|p| p["kind"] == "slept" && has_frame(p, &FSYNC))
        .map(|p| u(p, "time_ns"))
        .sum();
    assert!(
        lines > 0 && ns > 0,
        "no pipe wait behind an fsync:\n{folded}"
    );
    assert!(
        us <= ns / 1000 && us + lines >= ns / 1000,
        "{us} us on {lines} folded lines, {ns} ns in JSON:\n{folded}"
    );
}

/// `serve --chains`: the profile's `chained_off_cpu` samples hold the chains `stats` gives.
/// The futex wait's chained time is its off-CPU time, exactly (both of the same reads, under
/// the sleeper's pid label), and the sample `futex;--;pipe;--;nanosleep` (with chain-c's wait
/// for a CPU right after it) holds chain-c's share of it, as the workload's clocks say
/// (`three_levels`' tolerance at that level).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn serve_profiles_the_chains() {
    use latprof::export::pprof;
    let _guard = common::serial("the chain tests");
    // The whole machine is traced: a table of 8 times the default links, so that the rest of
    // the machine's links never fill it before the workload's (a mutants run found the
    // workload's futex wait "woken by a task: link not kept (chain table full)" once).
    let max_chains = (latprof::probe::MAX_CHAINS * 8).to_string();
    let serve = common::serve::Serve::start(&[
        "--all-sleeps",
        "--chains",
        "--max-chains",
        &max_chains,
        "--interval",
        "200ms",
    ]);
    let mut work = Workload::spawn(&["chain3", "--count", "20", "--interval", "20ms"]);
    let a = work.pid().to_string();
    work.go();
    let facts = work.wait_done();
    work.release();
    // Two reads after the workload's processes are gone: each of their sleeps is in the window.
    let reads = |t: &str| common::serve::sample(t, "latprof_collections_total").unwrap_or(0.0);
    let now = reads(&serve.metrics());
    serve.wait_for(30, "two more reads", |t| reads(t) >= now + 2.0);
    let reply = serve.get("/debug/pprof/offcpu?seconds=300");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let p = pprof::decode(&reply.body).expect("a profile");
    let types: Vec<&str> = p.sample_type.iter().map(|t| p.string(t.r#type)).collect();
    assert_eq!(types, ["sleeps", "off_cpu", "chained_off_cpu"]);
    // A's samples: each level's frames innermost first, the sleeper's last.
    let of_a = p.sample.iter().filter(|s| {
        s.label
            .iter()
            .any(|l| p.string(l.key) == "pid" && p.string(l.str) == a)
    });
    let (mut off, mut chained) = (0i64, 0i64);
    let mut levels_of: Vec<(Vec<Vec<&str>>, i64)> = Vec::new();
    for s in of_a {
        let frames = p.frame_names(s);
        let levels: Vec<Vec<&str>> = frames.split(|f| *f == "--").map(<[&str]>::to_vec).collect();
        let futex = levels
            .last()
            .is_some_and(|l| l.iter().any(|f| f.starts_with("futex_wait")));
        if !futex {
            continue;
        }
        assert!(
            s.value[0] == 0 || s.value[2] == 0,
            "{:?}: {:?}",
            frames,
            s.value
        );
        off += s.value[1];
        chained += s.value[2];
        if s.value[2] > 0 {
            levels_of.push((levels, s.value[2]));
        }
    }
    assert!(off > 0, "no futex wait of {a} in the profile");
    assert_eq!(chained, off, "the futex wait's chains: {levels_of:#?}");
    let c = common::fact(&facts, "c").to_string();
    let below_pipe = |levels: &[Vec<&str>], leaf: &dyn Fn(&[&str]) -> bool| {
        levels.len() == 3
            && leaf(&levels[0])
            && levels[1]
                .iter()
                .any(|f| PIPE.iter().any(|p| f.starts_with(p)))
    };
    let nap: i64 = levels_of
        .iter()
        .filter(|(levels, _)| {
            below_pipe(levels, &|l| {
                l.iter()
                    .any(|f| f.starts_with("hrtimer_nanosleep") || f.starts_with("do_nanosleep"))
                    || l == [format!("[chain-c [{c}]: waiting for a CPU]").as_str()]
            })
        })
        .map(|(_, ns)| ns)
        .sum();
    let unseen: i64 = levels_of
        .iter()
        .filter(|(levels, _)| levels[0].iter().any(|f| f.contains("waker not seen")))
        .map(|(_, ns)| ns)
        .sum();
    let (got, hidden) = (
        ratio(nap.unsigned_abs(), off.unsigned_abs()),
        ratio(unseen.unsigned_abs(), off.unsigned_abs()),
    );
    let want = ratio(common::fact(&facts, "abc_ns"), common::fact(&facts, "a_ns"));
    eprintln!("serve: chain-c's nanosleep {got:.4} (and {hidden:.4} unseen), its clocks {want:.4}");
    assert!(
        got <= want + 2.0 * SHARE_TOLERANCE && got + hidden >= want - 2.0 * SHARE_TOLERANCE,
        "chain-c's nanosleep: {got:.4} (and {hidden:.4} unseen), its clocks {want:.4}: {levels_of:#?}"
    );
    let (status, _) = serve.stop(libc::SIGTERM);
    assert!(status.success());
}

/// A `record --chains --all-sleeps` made around a workload, in a folder of its own.
struct Recorded {
    _dir: common::TempDir,
    path: std::path::PathBuf,
    pid: u32,
    facts: Vec<(String, u64)>,
    err: String,
}

impl Recorded {
    /// `tag` names its folder (one per test: the tests of a binary share its pid).
    fn around(tag: &str, work: &[&str]) -> Self {
        let _guard = common::serial("the chain tests");
        let dir = common::TempDir::new(tag);
        let path = dir.file("run.lpr");
        let mut work = Workload::spawn(work);
        let pid = work.pid();
        let mut cmd = Command::new(LATPROF);
        cmd.args([
            "record",
            "--all-sleeps",
            "--chains",
            "--interval",
            "200ms",
            "-o",
        ])
        .arg(&path)
        .stdout(Stdio::null());
        let (child, stderr) = common::start(&mut cmd, "recording to");
        work.go();
        let facts = work.wait_done();
        // The recorder's last snapshot, taken as it stops, holds all of the work: once the
        // workload is blocked in its read of stdin, a last wait of it whose wakeup the kernel
        // hid has been recovered at that switch too.
        work.wait_blocked();
        let (_, err) = common::interrupt(child, stderr);
        work.release();
        Self {
            _dir: dir,
            path,
            pid,
            facts,
            err,
        }
    }

    fn dump(&self, args: &[&str]) -> String {
        let out = common::output_of(Command::new(LATPROF).arg("dump").arg(&self.path).args(args));
        String::from_utf8(out).expect("utf-8")
    }
}

/// `top --chains`: the detail of the lock waiter's futex wait says what it was behind, in a
/// real terminal: chain-b's pipe wait, and below it chain-c's nanosleep, which the timer
/// ended; with the numbers of a `stats --chains` beside it on the same events (which
/// `three_levels` judges against the workload's own clocks): the waits' count and total, and
/// the nanosleep's share of them and its time.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_shows_what_a_wait_was_behind() {
    let _guard = common::serial("the chain tests");
    let mut work = Workload::spawn(&["chain3", "--count", "250", "--interval", "20ms"]);
    let a = work.pid();
    let pid = a.to_string();
    let tmux = common::tmux::Tmux::start(&format!(
        "{LATPROF} top --chains --all-sleeps --interval 300ms; echo LATPROF-EXIT=$?; sleep 60"
    ));
    tmux.wait_for(&["Global causes"]);
    let mut stats = Command::new(LATPROF);
    stats
        .args(["stats", "--all-sleeps", "--chains", "--format", "json"])
        .args(["--duration", "120s"])
        .stdout(Stdio::piped());
    let (stats, stats_err) = common::start(&mut stats, "attached");
    work.go();
    let facts = work.wait_done();
    let (out, err) = common::interrupt(stats, stats_err);
    common::reported_missing(&err);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stats' JSON");
    let (cause, nap) = three_levels(&doc, a, &facts, &err, true);
    let count = u(cause, "count");
    // top reads every 300 ms: its row holds the whole run once it counts what stats counted.
    // Both count each wait once, on the same events (a wait whose wakeup the kernel hid is
    // lost or recovered alike in both), and both attached before the workload began.
    let reason = "Userspace lock contention";
    tmux.keys(&["/"]);
    tmux.keys(&[&pid, "Enter"]);
    tmux.wait_until(|screen| match cause_count(screen, reason) {
        Some(n) if n == count => Ok(()),
        n => Err(format!(
            "top's row {reason:?} of {pid} counts {n:?}, stats {count}"
        )),
    });
    tmux.open_cause(&pid, reason);
    let (b, c) = ("chain-b [", "chain-c [");
    let screen = tmux.wait_for(&[
        "Behind it",
        c,
        // The pane wraps a long line: the reason's first words.
        "Application requested",
        &format!("< {b}"),
        "Waiting for a pipe",
    ]);
    // The leaf first: chain-c's nanosleep, behind chain-b's pipe wait (within the next lines:
    // the pane may wrap the leaf's line).
    let lines: Vec<&str> = screen.lines().collect();
    let leaf = lines
        .iter()
        .position(|l| l.contains(c) && l.contains("Application requested"))
        .unwrap_or_else(|| panic!("no nanosleep leaf:\n{screen}"));
    assert!(
        lines[leaf + 1..(leaf + 3).min(lines.len())]
            .iter()
            .any(|l| l.contains(&format!("< {b}")) && l.contains("Waiting for a pipe")),
        "the nanosleep is not shown behind chain-b's pipe wait:\n{screen}"
    );
    // The detail's numbers: `count N  total T  average A  max M`.
    let (shown, total) = screen
        .lines()
        .find_map(|l| {
            let (n, rest) = l.split_once("count ")?.1.split_once("  total ")?;
            Some((
                n.trim().parse::<u64>().ok()?,
                rest.split_whitespace().next()?,
            ))
        })
        .unwrap_or_else(|| panic!("no count line in the detail:\n{screen}"));
    assert_eq!(shown, count, "the detail's count:\n{screen}");
    near(total, u(cause, "total_ns"), "the waits' total", &screen);
    // The leaf's `P% T`: its share of the waits, cut to a whole percent, and its time. Below
    // the nanosleep only the timer (or a hidden waking) ended it: all of its time is its own,
    // as in stats' part.
    let before = lines[leaf].split_once(c).expect("the leaf").0;
    let mut words = before
        .rsplit('│')
        .next()
        .unwrap_or(before)
        .split_whitespace();
    let pct: u64 = words
        .next()
        .and_then(|w| w.strip_suffix('%')?.parse().ok())
        .unwrap_or_else(|| panic!("no share on the leaf's line:\n{screen}"));
    let time = words
        .next()
        .unwrap_or_else(|| panic!("no time on the leaf's line:\n{screen}"));
    near(time, u(nap, "time_ns"), "the nanosleep's time", &screen);
    let share = 100.0 * nap["share"].as_f64().expect("share");
    #[expect(clippy::cast_precision_loss, reason = "a percent")]
    let pct = pct as f64;
    assert!(
        pct - 100.0 * BESIDE <= share && share < pct + 1.0 + 100.0 * BESIDE,
        "top shows the nanosleep at {pct}% of the waits, stats at {share:.3}%:\n{screen}"
    );
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    work.release();
}

/// The count on top's row `reason` in the causes pane on `screen`, if shown.
fn cause_count(screen: &str, reason: &str) -> Option<u64> {
    screen
        .lines()
        .find_map(|l| l.split_once(&format!("││{reason}")))?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Checks that `text`, a time as top prints it (`4.85s`, `512ms`, `5.55ms`, `42us`), is `ns`:
/// within what its printing cut off (half its last digit) and `BESIDE`.
fn near(text: &str, ns: u64, what: &str, screen: &str) {
    let at = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or_else(|| panic!("{what}: no unit in {text:?}"));
    let (number, unit) = text.split_at(at);
    let scale = match unit {
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => panic!("{what}: unit of {text:?}"),
    };
    let value: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("{what}: not a duration: {text:?}"));
    let decimals = number.split_once('.').map_or(0, |(_, d)| d.len());
    let cut = 0.5 * scale / 10f64.powi(i32::try_from(decimals).expect("decimals"));
    #[expect(clippy::cast_precision_loss, reason = "nanoseconds of a short test")]
    let ns = ns as f64;
    assert!(
        (value * scale - ns).abs() <= cut + ns * BESIDE,
        "{what}: top shows {text}, stats {ns} ns:\n{screen}"
    );
}

//! Privileged tests (they load latprof's real eBPF object into the running kernel and run
//! workloads they spawn themselves; root or CAP_BPF + CAP_PERFMON, so `#[ignore]`d for a plain
//! `cargo test`: `cargo xtask test` runs them; without privileges they fail).
//!
//! What latprof counts, against each workload's own count: nanosleeps in both modes and
//! every program variant, reads during exit and fork storms, fsync, a pipe ping-pong, the stack
//! cache against walked backtraces, the cutoff and the 1 us floor, and full kernel tables
//! counted, never silent.
use std::{
    collections::{HashMap, HashSet},
    process::{Command, Stdio},
    time::Duration,
};

use latprof::{
    collect::{Collector, Snapshot},
    model::{self, Cause},
    probe::{Backtraces, DebugConfig, Mode, Probe, ProbeConfig},
    symbols::{Backtrace, Kallsyms},
};
use latprof_common::{Counter, GlobalRecord};

mod common;

use common::{
    Workload, fact,
    probe::{MS, accounted, attach, defaults, frames_with, serial, total},
};

/// Runs 200 x nanosleep(2 ms) in a child and returns the nanosleep cause seen while the child
/// lives (global and per-process view) and after it exited (global view).
/// What the workload measured itself around its nanosleeps.
#[derive(Clone, Copy, Debug)]
struct OwnClock {
    max_ns: u64,
    total_ns: u64,
    /// The nanosleeps that really slept: on a busy machine a 2 ms timer can expire before the
    /// task leaves the CPU, and then there is no sleep to count.
    slept: u64,
    /// latprof's longest run-queue wait of the workload: a stall after the wakeup (woken on
    /// time, then no CPU for milliseconds) is there, not in the sleep.
    runq_max_ns: u64,
}

type Measured = (Cause, Cause, Cause, Snapshot, OwnClock);

fn nanosleep_causes(mode: Mode) -> Measured {
    nanosleep_causes_with(mode, true)
}

fn nanosleep_causes_with(mode: Mode, btf_wakeup: bool) -> Measured {
    let syms = Kallsyms::load().expect("kallsyms");
    let mut work = Workload::spawn(&["sleep", "--count", "200", "--interval", "2ms"]);
    // Every sleep counts: a delayed wakeup on this shared machine must not drop one of the 200.
    let probe = Probe::attach(ProbeConfig {
        mode,
        pid: Some(work.pid()),
        inter_cutoff: None,
        btf_wakeup,
        ..defaults()
    })
    .expect("attach latprof");
    work.go();
    let facts = work.wait_done();
    let own = |k: &str| {
        facts
            .iter()
            .find(|(key, _)| key == k)
            .map_or(0, |(_, v)| *v)
    };
    let pid = work.pid();
    // One collector for the probe, as a command has: it drains the hidden-switch log.
    let mut collector = Collector::new();
    let live = collector.snapshot(&probe).expect("snapshot");
    let live_global = model::global_causes(&live, &syms, 12);
    let live_process = model::process_causes(&live, pid, &syms, 12);
    let own_clock = OwnClock {
        max_ns: own("max_ns"),
        total_ns: own("total_ns"),
        slept: own("slept"),
        runq_max_ns: live_process
            .iter()
            .filter(|c| c.backtrace == latprof::symbols::Backtrace::WaitingForCpu)
            .map(|c| c.max_ns)
            .max()
            .unwrap_or(0),
    };
    work.release();
    // The exit tracepoint runs before the parent's wait() returns.
    let after = collector.snapshot(&probe).expect("snapshot");
    assert!(
        after.tasks.iter().all(|t| t.tgid != pid),
        "exited task still tracked"
    );
    let after_global = model::global_causes(&after, &syms, 12);
    let one = |causes: &[Cause], what: &str| -> Cause {
        let found = frames_with(causes, "nanosleep");
        assert_eq!(
            found.len(),
            1,
            "{what}: one nanosleep cause expected in {causes:#?}"
        );
        found[0].clone()
    };
    (
        one(&live_global, "global while alive"),
        one(&live_process, "process while alive"),
        one(&after_global, "global after exit"),
        after,
        own_clock,
    )
}

/// The 200 sleeps are all counted, except those the kernel never ran latprof for (then
/// latprof says so in a counter; see `Counter::SleepLost`) and those under 1 us, which
/// latencytop does not count either (`common::not_counted`). Either is rare: at most 5 (3 seen
/// in one CI run, this host's service threads hiding the wakeups; a sleep that vanished is
/// still caught by the exact count below, lost ones included).
/// Total between 200 x 2 ms and 200 x 3 ms and max below 10 ms, as the workload's own clock
/// saw them; when this shared VM stalled the workload itself past those bounds (its own clock
/// says so), latprof must report that stall: its max, with the longest run-queue wait of the
/// workload, within 1 ms of the workload's.
fn check_nanosleep(cause: &Cause, lost: u64, own: OwnClock) {
    assert!(lost <= 5, "{lost} sleeps lost");
    assert_eq!(cause.count + lost, own.slept, "{cause:?}, {lost} lost");
    assert!(
        own.slept >= 190,
        "the workload slept only {} times",
        own.slept
    );
    assert_eq!(cause.backtrace.lines()[0], "hrtimer_nanosleep", "{cause:?}");
    // latprof measures from the switch-out to the wakeup, inside the workload's own interval.
    assert!(
        cause.total_ns <= own.total_ns,
        "latprof's total {} ns exceeds the workload's own {} ns",
        cause.total_ns,
        own.total_ns
    );
    assert!(
        cause.max_ns <= own.max_ns,
        "latprof's max {} ns exceeds the workload's own {} ns",
        cause.max_ns,
        own.max_ns
    );
    if own.total_ns <= 600 * MS {
        assert!(
            (400 * MS..=600 * MS).contains(&(cause.total_ns + lost * 2 * MS)),
            "total {} ns not within 200 x 2..3 ms",
            cause.total_ns
        );
    }
    if own.max_ns < 10 * MS {
        assert!(cause.max_ns < 10 * MS, "max {} ns", cause.max_ns);
    } else if lost > 0 {
        // The stalled sleep may be the one whose wakeup was hidden (lost, or recovered under
        // its own line): this cause need not hold it.
        eprintln!(
            "the workload itself saw a {} ns sleep; {lost} of its sleeps are not under this cause",
            own.max_ns
        );
    } else {
        eprintln!(
            "the workload itself saw a {} ns sleep (machine stall)",
            own.max_ns
        );
        // The stall is in the sleep, or in the wait for a CPU after it (seen in CI: a
        // 10.7 ms nanosleep of which latprof's sleep was 2.1 ms, the rest a run-queue wait).
        assert!(
            cause.max_ns + own.runq_max_ns + MS >= own.max_ns,
            "latprof's max {} ns (and longest run-queue wait {} ns) misses the workload's {} ns",
            cause.max_ns,
            own.runq_max_ns,
            own.max_ns
        );
    }
}

/// Checks the three views of a measurement (global and process while alive, global after
/// exit) and returns the number of lost sleeps.
fn check_measured(m: &Measured) -> u64 {
    let (live_global, live_process, after, snap, own) = m;
    let lost = common::not_counted(snap);
    for cause in [live_global, live_process, after] {
        check_nanosleep(cause, lost, *own);
    }
    lost
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn lazy_counts_nanosleep_while_alive_and_after_exit() {
    let _guard = serial();
    lazy_nanosleep_attempt();
}

fn lazy_nanosleep_attempt() {
    let measured = nanosleep_causes(Mode::Lazy);
    check_measured(&measured);
    let (live_global, _, after, snap, _) = measured;
    assert_eq!(live_global, after, "lazy merge at exit changed the numbers");
    assert!(
        snap.counters.get(Counter::ExitMerges) >= 1,
        "no exit merge counted"
    );
    // Nothing else lost: every table was large enough. (Sleeps lost and run-queue waits not
    // measured come from hidden wakeups, which check_measured accepts only where switches
    // were hidden.)
    let losses: Vec<_> = snap
        .counters
        .losses()
        .into_iter()
        .filter(|l| !l.contains("sleeps lost") && !l.contains("wakeup was hidden"))
        .collect();
    assert!(losses.is_empty(), "{losses:?}");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn raw_tracepoint_fallback_counts_the_same() {
    let _guard = serial();
    raw_fallback_attempt();
}

fn raw_fallback_attempt() {
    // Kernels without BTF tracepoints: stacks walked at switch-out by the raw sched_switch.
    check_measured(&nanosleep_causes_with(Mode::Lazy, false));
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn normal_and_lazy_agree() {
    let _guard = serial();
    normal_and_lazy_attempt();
}

/// Normal and lazy mode attached to the same work at once see the same sleeps: the same
/// counts (each less what it lost), and totals and maxima that differ only by where each
/// program read the clock within the same events.
fn normal_and_lazy_attempt() {
    let syms = Kallsyms::load().expect("kallsyms");
    let mut work = Workload::spawn(&["sleep", "--count", "200", "--interval", "2ms"]);
    let probe = |mode| {
        Probe::attach(ProbeConfig {
            mode,
            pid: Some(work.pid()),
            inter_cutoff: None,
            ..defaults()
        })
        .expect("attach latprof")
    };
    let (normal, lazy) = (probe(Mode::Normal), probe(Mode::Lazy));
    work.go();
    let slept = work.wait_fact("slept");
    let nap = |snap: &Snapshot| -> Cause {
        let causes = model::global_causes(snap, &syms, 12);
        let found = frames_with(&causes, "nanosleep");
        assert_eq!(found.len(), 1, "{causes:#?}");
        found[0].clone()
    };
    // One collector per probe, as a command has: each drains its probe's hidden-switch log.
    let (mut normal_reader, mut lazy_reader) = (Collector::new(), Collector::new());
    let (normal_live, lazy_live) = (
        normal_reader.snapshot(&normal).expect("snapshot"),
        lazy_reader.snapshot(&lazy).expect("snapshot"),
    );
    work.release();
    let (normal_after, lazy_after) = (
        normal_reader.snapshot(&normal).expect("snapshot"),
        lazy_reader.snapshot(&lazy).expect("snapshot"),
    );
    assert_eq!(normal_after.counters.get(Counter::ExitMerges), 0);
    assert!(lazy_after.counters.get(Counter::ExitMerges) >= 1);
    let (normal_lost, lazy_lost) = (
        common::not_counted(&normal_after),
        common::not_counted(&lazy_after),
    );
    for (what, n, l) in [
        ("live", nap(&normal_live), nap(&lazy_live)),
        ("after exit", nap(&normal_after), nap(&lazy_after)),
    ] {
        assert_eq!(n.backtrace, l.backtrace, "{what}");
        assert_eq!(n.count + normal_lost, slept, "{what}: normal {n:?}");
        assert_eq!(l.count + lazy_lost, slept, "{what}: lazy {l:?}");
        if normal_lost == 0 && lazy_lost == 0 {
            // The two programs run one after the other on the same events: a few
            // microseconds apart per sleep of 2 ms, or, where this VM's vCPU was stopped
            // between them for one event, that stop once (73 us on a 2.2 ms max in one run).
            let close = |a: u64, b: u64| a.abs_diff(b) <= (a.max(b) / 50).max(250_000);
            assert!(close(n.total_ns, l.total_ns), "{what}: {n:?} {l:?}");
            assert!(close(n.max_ns, l.max_ns), "{what}: {n:?} {l:?}");
        }
    }
}

/// What lazy-mode snapshots read while tasks exit must keep (`Collector::snapshot` retries a
/// read that overlapped an exit merge, and drops a task the map returned twice): each tid
/// once; cumulative numbers that never go back (a task read and then merged into the global
/// table within one read counts twice, and once in the next); a read that could not settle
/// says so.
#[derive(Default)]
struct Cumulative {
    prev: Option<HashMap<u64, GlobalRecord>>,
    reads: u32,
    retried: u32,
    unsettled: u32,
    compared: u32,
}

impl Cumulative {
    fn check(&mut self, snap: &Snapshot) {
        let mut tids = HashSet::new();
        for t in &snap.tasks {
            assert!(tids.insert(t.tid), "tid {} twice in one snapshot", t.tid);
        }
        self.reads += 1;
        self.retried += u32::from(snap.retries > 0);
        if snap.unsettled {
            assert!(
                snap.losses()
                    .iter()
                    .any(|l| l.contains("exits kept moving records")),
                "an unsettled read not said: {:?}",
                snap.losses()
            );
            self.unsettled += 1;
            // It may hold an exiting task twice or not at all: no base for the next.
            self.prev = None;
            return;
        }
        let cur = snap.global_records();
        if let Some(prev) = &self.prev {
            self.compared += 1;
            for (stack, p) in prev {
                let c = cur.get(stack).copied().unwrap_or_default();
                assert!(
                    c.count >= p.count && c.total_ns >= p.total_ns,
                    "cause {stack:x} ({}) went back from {p:?} to {c:?} (retries {}; {} tasks)",
                    Kallsyms::load().map_or_else(
                        |_| String::new(),
                        |syms| Backtrace::of(
                            *stack,
                            snap.stacks.get(stack).map(Vec::as_slice),
                            &syms,
                            12
                        )
                        .join(" ")
                    ),
                    snap.retries,
                    snap.tasks.len()
                );
            }
        }
        self.prev = Some(cur);
    }
}

/// Runs `work` (started) to its end in a thread while `read` takes snapshots; returns the
/// workload and its facts.
fn read_while_it_runs(work: Workload, mut read: impl FnMut()) -> (Workload, Vec<(String, u64)>) {
    let mut work = work;
    let waiter = std::thread::spawn(move || {
        let facts = work.wait_done();
        (work, facts)
    });
    while !waiter.is_finished() {
        read();
    }
    waiter.join().expect("the workload's waiter")
}

/// Issue 12 section 4: lazy mode read during a storm of exits. 3000 threads of one process,
/// 8 at a time, each sleeping 200 us once and exiting (each exit merges its records into the
/// global table); a lazy and a normal probe on the process, read over and over while it runs.
/// Every lazy read keeps the invariants of [`Cumulative`]; at the end both modes count every
/// sleep the threads slept (less those lost to hidden wakeups).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn lazy_reads_during_an_exit_storm_stay_exact() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let mut work = Workload::spawn(&["exit-storm", "--count", "3000", "--batch", "8"]);
    let probe = |mode| {
        Probe::attach(ProbeConfig {
            mode,
            pid: Some(work.pid()),
            inter_cutoff: None,
            ..defaults()
        })
        .expect("attach latprof")
    };
    let (lazy, normal) = (probe(Mode::Lazy), probe(Mode::Normal));
    let (mut lazy_reader, mut normal_reader) = (Collector::new(), Collector::new());
    let (mut lazy_seen, mut normal_seen) = (Cumulative::default(), Cumulative::default());
    work.go();
    let (work, facts) = read_while_it_runs(work, || {
        lazy_seen.check(&lazy_reader.snapshot(&lazy).expect("snapshot"));
        normal_seen.check(&normal_reader.snapshot(&normal).expect("snapshot"));
    });
    let slept = facts
        .iter()
        .find_map(|(k, v)| (k == "slept").then_some(*v))
        .expect("slept=");
    let (lazy_end, normal_end) = (
        lazy_reader.snapshot(&lazy).expect("snapshot"),
        normal_reader.snapshot(&normal).expect("snapshot"),
    );
    lazy_seen.check(&lazy_end);
    work.release();
    eprintln!(
        "{} lazy reads during the storm: {} retried, {} unsettled, {} compared",
        lazy_seen.reads, lazy_seen.retried, lazy_seen.unsettled, lazy_seen.compared
    );
    assert!(lazy_seen.compared >= 10, "too few reads to compare");
    // An unsettled read is said (checked above), and the read after the storm is exact
    // (below). While 8 threads at a time exit, a read may not settle within its retries: a
    // stated tolerance of half the reads, measured at 11% (26 of 246) here and 10% under CI's
    // load, the fork storm's 25% once (its own test); a retry that did not work would leave
    // most unsettled.
    assert!(
        lazy_seen.unsettled * 2 <= lazy_seen.reads,
        "{} of {} reads unsettled",
        lazy_seen.unsettled,
        lazy_seen.reads
    );
    assert!(lazy_end.counters.get(Counter::ExitMerges) >= slept);
    let nap = |snap: &Snapshot| -> u64 {
        let causes = model::global_causes(snap, &syms, 12);
        frames_with(&causes, "nanosleep")
            .iter()
            .map(|c| c.count)
            .sum()
    };
    let (lazy_lost, normal_lost) = (
        common::lost_where_hidden(&lazy_end),
        common::lost_where_hidden(&normal_end),
    );
    assert_eq!(
        nap(&lazy_end) + lazy_lost,
        slept,
        "lazy: {:?}",
        lazy_end.counters
    );
    assert_eq!(
        nap(&normal_end) + normal_lost,
        slept,
        "normal: {:?}",
        normal_end.counters
    );
}

/// Issue 12 section 4: the same system-wide, while `forks` starts 1500 short-lived processes
/// that each sleep once (a `--pid` filter would not follow them: each is a process of its
/// own). Every read of both modes keeps the invariants of [`Cumulative`] while the whole
/// machine's tasks come and go. (The two modes' totals are not compared here: they include
/// everything else this machine does between the two reads; the exit storm above compares
/// them exactly.)
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn lazy_reads_during_a_fork_storm_never_go_back() {
    let _guard = serial();
    let mut work = Workload::spawn(&["forks", "--count", "1500", "--sleep", "50us"]);
    let (lazy, normal) = (attach(Mode::Lazy, None), attach(Mode::Normal, None));
    let (mut lazy_reader, mut normal_reader) = (Collector::new(), Collector::new());
    let (mut lazy_seen, mut normal_seen) = (Cumulative::default(), Cumulative::default());
    work.go();
    let (work, _) = read_while_it_runs(work, || {
        lazy_seen.check(&lazy_reader.snapshot(&lazy).expect("snapshot"));
        normal_seen.check(&normal_reader.snapshot(&normal).expect("snapshot"));
    });
    work.release();
    let end = lazy_reader.snapshot(&lazy).expect("snapshot");
    lazy_seen.check(&end);
    eprintln!(
        "{} lazy reads during the storm: {} retried, {} unsettled, {} compared",
        lazy_seen.reads, lazy_seen.retried, lazy_seen.unsettled, lazy_seen.compared
    );
    assert!(lazy_seen.compared >= 10, "too few reads to compare");
    // How many reads overlap an exit through every retry depends on how long a read takes
    // against the storm's exit rate (a timing, not an invariant): 0-3% of reads here before
    // the task entry grew by its waker fields, 6-12% since, 25% (43 of 170) once under CI's
    // load; half says the retries work.
    assert!(
        lazy_seen.unsettled * 2 <= lazy_seen.reads,
        "{} of {} reads unsettled",
        lazy_seen.unsettled,
        lazy_seen.reads
    );
    // The storm happened, and was read through: most children slept (and so were tracked and
    // merged at their exit; a child whose 50 us timer expired before it left the CPU never
    // slept).
    let merges = end.counters.get(Counter::ExitMerges);
    assert!(merges >= 1200, "{merges} exit merges");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn fsync_shows_as_uninterruptible_writeback() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let dir = common::disk_dir();
    let mut work = Workload::spawn(&["fsync", "--count", "40", "--dir", &dir]);
    // An interruptible sleep over 1 us is not counted here: what counts is uninterruptible.
    let probe = Probe::attach(ProbeConfig {
        mode: Mode::Lazy,
        pid: Some(work.pid()),
        inter_cutoff: Some(Duration::from_nanos(1)),
        ..defaults()
    })
    .expect("attach latprof");
    work.go();
    work.wait_done();
    let pid = work.pid();
    let snap = Collector::new().snapshot(&probe).expect("snapshot");
    work.release();
    let causes = model::process_causes(&snap, pid, &syms, 12);
    let fsync = frames_with(&causes, "fsync");
    let count: u64 = fsync.iter().map(|c| c.count).sum();
    // Every fsync waits for its write at least once, in D state.
    assert!(count >= 40, "fsync causes {fsync:#?} in {causes:#?}");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn pipe_pingpong_counts_both_sides() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let mut work = Workload::spawn(&["pingpong", "--count", "2000"]);
    let probe = attach(Mode::Lazy, Some(work.pid()));
    work.go();
    let slept = work.wait_fact("slept");
    let pid = work.pid();
    let pipe_counts = |s: &Snapshot| -> Vec<(u32, u64)> {
        s.tasks
            .iter()
            .filter(|t| t.tgid == pid)
            .map(|t| {
                let count = t
                    .records
                    .iter()
                    .filter(|r| {
                        s.stacks
                            .get(&r.stack_id)
                            // anon_pipe_read since 6.16, pipe_read before.
                            .is_some_and(|raw| {
                                syms.cause_frames(raw, 12)
                                    .first()
                                    .is_some_and(|f| f.ends_with("pipe_read"))
                            })
                    })
                    .map(|r| r.count)
                    .sum();
                (t.tid, count)
            })
            .collect()
    };
    let snap = Collector::new().snapshot(&probe).expect("snapshot");
    work.release();
    let counts = pipe_counts(&snap);
    let sides: Vec<_> = counts.iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(sides.len(), 2, "pipe_read counts per thread: {counts:?}");
    // Each side sleeps at most once per round trip (plus the helper's final wait for the end).
    assert!(sides.iter().all(|(_, n)| *n <= 2001), "{counts:?}");
    // And every sleep the threads slept (their voluntary switches, nearly all in pipe_read) is
    // counted, or was too short (under 1 us), over the cutoff, or lost where switches were
    // hidden.
    let c = &snap.counters;
    let pipe_total: u64 = sides.iter().map(|(_, n)| n).sum();
    let not_counted = c.get(Counter::SkippedZero)
        + c.get(Counter::SkippedCutoff)
        + common::lost_where_hidden(&snap);
    assert!(
        pipe_total + not_counted + 2 >= slept,
        "the threads slept {slept} times; pipe_read counted {pipe_total}, not counted \
         {not_counted}: {counts:?}"
    );
    let global = model::global_causes(&snap, &syms, 12);
    let pipe = frames_with(&global, "pipe_read");
    assert_eq!(pipe.len(), 1, "{global:#?}");
    assert_eq!(pipe[0].count, sides.iter().map(|(_, n)| n).sum::<u64>());
}

/// The ping-pong of the stack cache's tests (`stack_cache_gives_the_walked_backtraces`).
const PINGPONG_APART: [&str; 5] = ["pingpong", "--count", "2000", "--processes", "--apart"];

/// The stack cache answers a task's repeated sleeps without walking its stack; a second probe
/// that walks every counted sleep sees the same causes, and with `--debug-checks` the cached
/// probe walks every hit too and counts any difference.
fn stack_cache_attempt(work_args: &[&str], min_hits: u64, bounded: bool) {
    let syms = Kallsyms::load().expect("kallsyms");
    let mut work = Workload::spawn(work_args);
    let config = ProbeConfig {
        mode: Mode::Lazy,
        pid: Some(work.pid()),
        inter_cutoff: None,
        debug: DebugConfig {
            checks: true,
            bounded_cache: bounded,
            ..defaults().debug
        },
        ..defaults()
    };
    let cached = Probe::attach(config.clone()).expect("attach latprof");
    let walked = Probe::attach(ProbeConfig {
        stack_cache: false,
        debug: DebugConfig {
            checks: false,
            ..config.debug.clone()
        },
        ..config
    })
    .expect("attach latprof without the stack cache");
    assert_eq!(
        cached.backtraces(),
        if bounded {
            Backtraces::AtWakeupCachedBounded
        } else {
            Backtraces::AtWakeupCached
        },
        "this kernel (x86-64, BTF tracepoints, bpf_loop) should load the stack cache: {:?}",
        cached.fallbacks()
    );
    assert_eq!(walked.backtraces(), Backtraces::AtWakeup);
    work.go();
    work.wait_done();
    let pid = work.pid();
    let a = Collector::new().snapshot(&cached).expect("snapshot");
    let b = Collector::new().snapshot(&walked).expect("snapshot");
    work.release();
    let counters = &a.counters;
    assert_eq!(
        counters.get(Counter::DebugStackCacheWrong),
        0,
        "{counters:?}"
    );
    assert!(
        counters.get(Counter::StackCacheHits) >= min_hits,
        "{counters:?}"
    );
    assert_eq!(b.counters.get(Counter::StackCacheHits), 0);
    // Every counted sleep was walked, but a recovered one (its wakeup hidden by this host's
    // kernel), whose backtrace was to be taken at that wakeup.
    assert!(
        b.counters.get(Counter::StackWalks)
            >= b.counters.get(Counter::Counted) - b.counters.get(Counter::SleepsRecovered),
        "{:?}",
        b.counters
    );
    let causes = |s: &Snapshot| -> std::collections::BTreeMap<Backtrace, u64> {
        model::process_causes(s, pid, &syms, 12)
            .into_iter()
            // Run-queue waits under 1 us are not counted, and each probe's own cost moves
            // them across that line: only the sleeps must agree.
            .filter(|c| c.backtrace != Backtrace::WaitingForCpu)
            .map(|c| (c.backtrace, c.count))
            .collect()
    };
    let (ca, cb) = (causes(&a), causes(&b));
    // Each probe may miss a wakeup the kernel did not run it for (it says so in SleepLost).
    let lost = common::lost_where_hidden(&a) + common::lost_where_hidden(&b);
    let differ: u64 = ca
        .keys()
        .chain(cb.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| {
            let (x, y) = (
                ca.get(k).copied().unwrap_or(0),
                cb.get(k).copied().unwrap_or(0),
            );
            x.abs_diff(y)
        })
        .sum();
    assert!(
        differ <= lost,
        "cached:\n{ca:#?}\nwalked:\n{cb:#?}\n{lost} lost"
    );
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn stack_cache_gives_the_walked_backtraces() {
    let _guard = serial();
    // Two pipe readers sleeping at one place, each syscall at a new random stack offset: two
    // processes, one on each CPU (the parent traced), so that each sleep holds the other's
    // wakeup on the other CPU and is never near the 1 us floor. Two threads free to share a CPU
    // woke each other within a microsecond often enough here that the two probes, timing each
    // sleep at their own instants, counted hundreds of them differently.
    stack_cache_attempt(&PINGPONG_APART, 1000, false);
    // Writes and fsyncs: uninterruptible sleeps at several places in the filesystem.
    let dir = common::disk_dir();
    stack_cache_attempt(&["fsync", "--count", "60", "--dir", &dir], 1, false);
}

/// The stack cache's form for kernels without bpf_loop and bpf_task_pt_regs (a bounded scan,
/// the user registers found from the task's stack), forced here where both forms load: the
/// same backtraces as walking, checked on every hit.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn bounded_stack_cache_gives_the_walked_backtraces() {
    let _guard = serial();
    stack_cache_attempt(&PINGPONG_APART, 1000, true);
    let dir = common::disk_dir();
    stack_cache_attempt(&["fsync", "--count", "60", "--dir", &dir], 1, true);
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn inter_cutoff_and_all_sleeps() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    for cutoff in [Some(Duration::from_millis(5)), None] {
        let mut work = Workload::spawn(&["sleep", "--count", "50", "--interval", "12ms"]);
        let probe = Probe::attach(ProbeConfig {
            pid: Some(work.pid()),
            inter_cutoff: cutoff,
            ..defaults()
        })
        .expect("attach");
        work.go();
        // Each of its 12 ms nanosleeps that slept, and no other sleep of it has ended: its
        // wait for the release is open (the global causes hold the live task's records).
        let slept = work.wait_fact("slept");
        let snap = Collector::new().snapshot(&probe).expect("snapshot");
        work.release();
        let causes = model::global_causes(&snap, &syms, 12);
        let count = frames_with(&causes, "nanosleep")
            .iter()
            .map(|c| c.count)
            .sum::<u64>();
        let lost = common::not_counted(&snap);
        if cutoff.is_some() {
            assert_eq!(count, 0, "cutoff {cutoff:?}: {causes:#?}");
            assert_eq!(
                snap.counters.get(Counter::SkippedCutoff) + lost,
                slept,
                "cutoff {cutoff:?}: {:?}",
                snap.counters
            );
        } else {
            assert_eq!(count + lost, slept, "cutoff {cutoff:?}: {causes:#?}");
        }
    }
}

/// Sleeps under latencytop's 1 us floor are not counted, and each process is told how many
/// of its own were left out, in JSON's `hidden` and on stderr (the allowance of a count judged
/// on a machine-wide run). They are rare; a floor raised to 50 ms (`--debug-min-sleep`) makes
/// each 2 ms nanosleep one: every one the workload slept is left out, by its own pid, or lost
/// where the kernel hid its wakeup, or (stalled past 50 ms) counted. The judgment takes every
/// sleep of the workload from its first nanosleep to its last (`switched`, its own count), not
/// only the nanosleeps': a rare other sleep in between (a page fault's) is left out as well.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn sleeps_under_the_floor_are_told_by_process() {
    let _guard = serial();
    let mut work = Workload::spawn(&["sleep", "--count", "40", "--interval", "2ms"]);
    let pid = work.pid();
    // Its wait for `go` begins before latprof attaches: a wait begun after would end under
    // the floor too, a sleep the workload cannot count.
    work.wait_blocked();
    let (stats, stderr) = common::start(
        Command::new(common::LATPROF)
            .args(["--debug-min-sleep", "50ms", "stats", "--all-sleeps"])
            .args([
                "--pid",
                &pid.to_string(),
                "--format",
                "json",
                "--duration",
                "60s",
            ])
            .stdout(Stdio::piped()),
        "attached",
    );
    work.go();
    // Its wait for the release is still open: every sleep that ended is one it counted.
    let facts = work.wait_done();
    let (slept, switched) = (fact(&facts, "slept"), fact(&facts, "switched"));
    let (out, rest) = common::interrupt(stats, stderr);
    work.release();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("latprof's JSON");
    let short = common::own_hidden(&doc, pid, "under_1us");
    let counters = &doc["counters"];
    assert_eq!(
        (&counters["skipped_zero"], &counters["short_unlogged"]),
        (&serde_json::json!(short), &serde_json::json!(0)),
        "every sleep left out is told by its process: {}\n{rest}",
        doc["hidden"]
    );
    assert_eq!(common::own_short(&rest, pid), short, "{rest}");
    let counted = common::counted_of(&doc);
    assert_eq!(
        counted + common::own_missing(&doc, pid),
        switched,
        "{counted} counted, {short} left out; {slept} of its {switched} sleeps nanosleeps': \
         {}\n{:#}\n{rest}",
        doc["hidden"],
        doc["causes"]
    );
    assert!(short > 0, "none left out: {rest}");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn full_tables_are_counted_not_silent() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    // Two task slots for four threads taking turns at a lock and their main thread, one stack
    // slot for three backtraces (the lock's futex wait, the nanosleep holding it, the main
    // thread's pipe read waiting for the threads): two backtraces at least find no room, even
    // if this host hides one's wakeup (then recovered without a backtrace).
    let mut work = Workload::spawn(&["mutex", "--threads", "4", "--count", "50", "--hold", "1ms"]);
    let probe = Probe::attach(ProbeConfig {
        pid: Some(work.pid()),
        max_tasks: 2,
        max_stacks: 1,
        // Every tracked sleep counts, so a backtrace not stored shows as a counted cause.
        inter_cutoff: None,
        ..defaults()
    })
    .expect("attach");
    work.go();
    // After the exit every tracked sleep has ended and been merged.
    work.release();
    let snap = Collector::new().snapshot(&probe).expect("snapshot");
    let c = &snap.counters;
    assert!(c.get(Counter::TaskTableFull) > 0, "{c:?}");
    let losses = c.losses();
    assert!(
        losses.iter().any(|l| l.contains("--max-tasks")),
        "{losses:?}"
    );
    // With one stack slot, all but one backtrace are unavailable, yet still counted.
    let causes = model::global_causes(&snap, &syms, 12);
    let total: u64 = causes.iter().map(|c| c.count).sum();
    assert_eq!(
        total,
        c.get(Counter::Counted) + c.get(Counter::RunqCounted),
        "{causes:#?} {c:?}"
    );
    assert!(c.get(Counter::StackMissing) > 0, "{c:?}");
    assert!(
        causes.iter().any(|c| c.backtrace == Backtrace::Unavailable),
        "{causes:#?}"
    );
    assert!(
        losses.iter().any(|l| l.contains("--max-stacks")),
        "{losses:?}"
    );
}

/// Events in the histograms, summed over causes.
fn hist_total(snap: &Snapshot) -> u64 {
    snap.histograms
        .values()
        .flat_map(|h| h.iter())
        .map(|&n| u64::from(n))
        .sum()
}

/// Everything counted lost but what the kernel's hidden wakeups explain (sleeps lost and
/// run-queue waits not measured, which `common::lost_where_hidden` accepts only where
/// switches were hidden).
fn lost_otherwise(snap: &Snapshot) -> u64 {
    common::lost_where_hidden(snap);
    let c = &snap.counters;
    c.lost() - c.get(Counter::SleepLost) - c.get(Counter::RunqUnknown)
}

fn said(snap: &Snapshot, needle: &str) -> bool {
    snap.losses().iter().any(|l| l.contains(needle))
}

/// Issue 12 section 4: one thread sleeping at 39 places, more causes than a task's table holds
/// (`TASK_RECORDS`). The causes beyond it go to the global table and are counted
/// (`TaskRecordsFull`) and said, since the task's own view lacks them; the global table (live
/// in lazy mode, at every event in normal mode, and after the exit merge) holds every
/// accounted sleep, and both modes agree cause by cause.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn causes_beyond_a_tasks_table_go_global_and_are_said() {
    let _guard = serial();
    let mut work = Workload::spawn(&["causes", "--rounds", "2"]);
    let pid = work.pid();
    let probe = |mode| {
        Probe::attach(ProbeConfig {
            mode,
            pid: Some(pid),
            inter_cutoff: None,
            ..defaults()
        })
        .expect("attach latprof")
    };
    let (lazy, normal) = (probe(Mode::Lazy), probe(Mode::Normal));
    work.go();
    let facts = work.wait_done();
    let sites = facts
        .iter()
        .find_map(|(k, v)| (k == "sites").then_some(*v))
        .expect("sites=");
    assert!(
        sites > latprof_common::TASK_RECORDS as u64,
        "the workload slept at only {sites} places"
    );
    let mut lazy_reader = Collector::with_details();
    let live = lazy_reader.snapshot(&lazy).expect("snapshot");
    let norm = Collector::with_details()
        .snapshot(&normal)
        .expect("snapshot");
    let task = live
        .tasks
        .iter()
        .find(|t| t.tid == pid)
        .unwrap_or_else(|| panic!("workload not tracked: {:?}", live.tasks));
    assert_eq!(live.tasks.len(), 1, "one thread: {:?}", live.tasks);
    assert_eq!(task.records.len(), latprof_common::TASK_RECORDS);
    let beyond = live.counters.get(Counter::TaskRecordsFull);
    assert!(beyond > 0, "{:?}", live.counters);
    // The same events overflowed both probes' task tables, but for the run-queue record:
    // a wait near 1 us counts in one probe and not the other (each probe's own cost moves it
    // across that line), so that record can take its slot at another moment in each, moving
    // one site's sleeps (2 rounds) between the table and the overflow.
    let norm_beyond = norm.counters.get(Counter::TaskRecordsFull);
    assert!(
        norm_beyond > 0 && norm_beyond.abs_diff(beyond) <= 2,
        "lazy {beyond}, normal {norm_beyond} sleeps beyond the task's table"
    );
    // The task's own records plus the overflow are everything it accounted.
    let own: u64 = task.records.iter().map(|r| r.count).sum();
    assert_eq!(own + beyond, accounted(&live), "{:?}", live.counters);
    // The global view holds all of it, in both modes.
    let (lazy_global, normal_global) = (live.global_records(), norm.global_records());
    assert_eq!(total(&lazy_global), accounted(&live));
    assert_eq!(total(&normal_global), accounted(&norm));
    assert!(
        lazy_global.len() > latprof_common::TASK_RECORDS,
        "{lazy_global:?}"
    );
    // Said, never silent; and nothing was lost.
    for snap in [&live, &norm] {
        assert!(said(snap, "more than 32"), "{:?}", snap.losses());
        assert_eq!(lost_otherwise(snap), 0, "{:?}", snap.losses());
    }
    // Both probes saw the same sleeps, cause by cause (run-queue waits under 1 us aside:
    // each probe's own cost moves them across that line).
    let lost = common::lost_where_hidden(&live) + common::lost_where_hidden(&norm);
    let differ: u64 = lazy_global
        .keys()
        .chain(normal_global.keys())
        .filter(|&&k| k != latprof_common::RUNQ_STACK)
        .collect::<HashSet<_>>()
        .into_iter()
        .map(|k| {
            let n = |m: &HashMap<u64, GlobalRecord>| m.get(k).map_or(0, |r| r.count);
            n(&lazy_global).abs_diff(n(&normal_global))
        })
        .sum();
    assert!(
        differ <= lost,
        "lazy {lazy_global:?}\nnormal {normal_global:?}"
    );
    work.release();
    // After the exit merge the kernel's table alone holds everything.
    let after = lazy_reader.snapshot(&lazy).expect("snapshot");
    assert!(after.tasks.is_empty(), "{:?}", after.tasks);
    let merged: u64 = after.global.iter().map(|(_, r)| r.count).sum();
    assert_eq!(merged, accounted(&after), "{:?}", after.counters);
    assert_eq!(lost_otherwise(&after), 0, "{:?}", after.losses());
}

/// Issue 12 section 4: a global table and histogram table of 8 causes for 39. Normal mode
/// loses one sleep per failed update, and every accounted sleep is either in the table or
/// counted lost: the numbers add up exactly, for the histograms too. Lazy mode loses whole
/// records at the exit merge: every cause missing afterwards is a counted record. Each loss
/// is said, with the flag that avoids it.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_full_global_table_and_histogram_table_are_counted_and_add_up() {
    const SMALL: u32 = 8;
    let _guard = serial();
    let mut work = Workload::spawn(&["causes", "--rounds", "2"]);
    let pid = work.pid();
    let probe = |mode| {
        Probe::attach(ProbeConfig {
            mode,
            pid: Some(pid),
            inter_cutoff: None,
            max_records: SMALL,
            ..defaults()
        })
        .expect("attach latprof")
    };
    let (lazy, normal) = (probe(Mode::Lazy), probe(Mode::Normal));
    work.go();
    work.wait_done();
    let mut lazy_reader = Collector::with_details();
    let live = lazy_reader.snapshot(&lazy).expect("snapshot");
    let norm = Collector::with_details()
        .snapshot(&normal)
        .expect("snapshot");

    // Normal mode: in the table or counted lost, sleep by sleep.
    let c = &norm.counters;
    let full = c.get(Counter::GlobalTableFull);
    assert!(full > 0, "{c:?}");
    assert!(norm.global.len() <= SMALL as usize, "{:?}", norm.global);
    assert_eq!(
        total(&norm.global_records()) + full,
        accounted(&norm),
        "{c:?}"
    );
    // The histograms: one update per accounted event, in the table or counted lost.
    for snap in [&norm, &live] {
        let c = &snap.counters;
        let hist_full = c.get(Counter::HistTableFull);
        assert!(hist_full > 0, "{c:?}");
        assert!(snap.histograms.len() <= SMALL as usize);
        assert_eq!(hist_total(snap) + hist_full, accounted(snap), "{c:?}");
        assert!(said(snap, "histogram updates lost"), "{:?}", snap.losses());
    }
    assert!(said(&norm, "--max-records"), "{:?}", norm.losses());

    // Lazy mode: the task's own 32 records are intact while it lives; what overflowed them
    // went to the small tables at once.
    let live_view = live.global_records();
    work.release();
    let after = lazy_reader.snapshot(&lazy).expect("snapshot");
    let c = &after.counters;
    let full_at_exit =
        c.get(Counter::GlobalTableFull) - live.counters.get(Counter::GlobalTableFull);
    let after_view: HashMap<u64, GlobalRecord> = after.global.iter().copied().collect();
    assert!(after_view.len() <= 2 * SMALL as usize, "{after_view:?}");
    // Each of the task's records missing after the merge is one record counted lost. (Its
    // wakeup at release may add one cause past its table, which can be lost too.)
    let task = live.tasks.iter().find(|t| t.tid == pid).expect("workload");
    let missing = task
        .records
        .iter()
        .filter(|r| !after_view.contains_key(&r.stack_id))
        .count() as u64;
    assert!(missing > 0, "{after_view:?}");
    assert!(
        (missing..=missing + 1).contains(&full_at_exit),
        "{missing} records missing after the exit merge, {full_at_exit} counted lost"
    );
    // What was merged kept its numbers.
    for (stack, rec) in &after_view {
        let before = live_view.get(stack).map_or(0, |r| r.count);
        assert!(rec.count >= before, "{stack:x}: {rec:?} < {before}");
    }
    assert!(
        said(
            &after,
            "records lost: global table full (raise --max-records)"
        ),
        "{:?}",
        after.losses()
    );
}

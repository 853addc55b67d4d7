//! Privileged tests: they load latprof's real eBPF object into the running kernel, run a
//! workload they spawn themselves, and check what the kernel side counted for it.
//!
//! They need root (or CAP_BPF + CAP_PERFMON), so they are `#[ignore]`d for a plain
//! `cargo test`; `cargo xtask test` (and CI, as root) runs them with `--include-ignored`.
//! Without privileges they fail, never pass silently.
use std::{
    collections::{HashMap, HashSet},
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::MutexGuard,
    time::{Duration, Instant},
};

use latprof::{
    collect::{Collector, Snapshot},
    model::{self, Cause},
    probe::{Backtraces, Mode, Probe, ProbeConfig, names},
    symbols::{Backtrace, Kallsyms},
};
use latprof_common::{Counter, GlobalRecord};

mod common;

use common::{LATPROF, Workload};
const MS: u64 = 1_000_000;

/// One test at a time owns the kernel side, so program-id checks see only their own programs.
fn serial() -> MutexGuard<'static, ()> {
    common::serial("privileged tests")
}

/// The probe's defaults, with the defect `LATPROF_TEST_DROP_SLEEPS=N` injects
/// (`--debug-drop-sleeps N`, as `common::start` adds it to latprof's command line): every count
/// test must then fail (see tests/defect.rs).
fn defaults() -> ProbeConfig {
    ProbeConfig {
        drop_sleeps: std::env::var("LATPROF_TEST_DROP_SLEEPS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        ..ProbeConfig::default()
    }
}

fn attach(mode: Mode, pid: Option<u32>) -> Probe {
    Probe::attach(ProbeConfig {
        mode,
        pid,
        ..defaults()
    })
    .expect("attach latprof")
}

fn frames_with<'a>(causes: &'a [Cause], needle: &str) -> Vec<&'a Cause> {
    causes
        .iter()
        .filter(|c| c.backtrace.lines().iter().any(|f| f.contains(needle)))
        .collect()
}

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
/// latprof says so in a counter; see `Counter::SleepLost`). A lost sleep is rare: at most 2.
/// Total between 200 x 2 ms and 200 x 3 ms and max below 10 ms, as the workload's own clock
/// saw them; when this shared VM stalled the workload itself past those bounds (its own clock
/// says so), latprof must report that stall: its max, with the longest run-queue wait of the
/// workload, within 1 ms of the workload's.
fn check_nanosleep(cause: &Cause, lost: u64, own: OwnClock) {
    assert!(lost <= 2, "{lost} sleeps lost");
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
    let lost = common::lost_where_hidden(snap);
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
        common::lost_where_hidden(&normal_after),
        common::lost_where_hidden(&lazy_after),
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
            // microseconds apart per sleep of 2 ms.
            let close = |a: u64, b: u64| a.abs_diff(b) <= a.max(b) / 50;
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
    // A directory on a real disk (not tmpfs): the target directory of this build.
    let dir = std::env::var("LATPROF_FSYNC_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_owned());
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
        debug_checks: true,
        bounded_cache: bounded,
        ..defaults()
    };
    let cached = Probe::attach(config.clone()).expect("attach latprof");
    let walked = Probe::attach(ProbeConfig {
        stack_cache: false,
        debug_checks: false,
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
    // Two pipe readers sleeping at one place, each syscall at a new random stack offset.
    stack_cache_attempt(&["pingpong", "--count", "2000"], 1000, false);
    // Writes and fsyncs: uninterruptible sleeps at several places in the filesystem.
    let dir = std::env::var("LATPROF_FSYNC_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_owned());
    stack_cache_attempt(&["fsync", "--count", "60", "--dir", &dir], 1, false);
}

/// The stack cache's form for kernels without bpf_loop and bpf_task_pt_regs (a bounded scan,
/// the user registers found from the task's stack), forced here where both forms load: the
/// same backtraces as walking, checked on every hit.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn bounded_stack_cache_gives_the_walked_backtraces() {
    let _guard = serial();
    stack_cache_attempt(&["pingpong", "--count", "2000"], 1000, true);
    let dir = std::env::var("LATPROF_FSYNC_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_owned());
    stack_cache_attempt(&["fsync", "--count", "60", "--dir", &dir], 1, true);
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn inter_cutoff_and_all_sleeps() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    for cutoff in [Some(Duration::from_millis(5)), None] {
        let mut work = Workload::spawn(&["sleep", "--count", "20", "--interval", "12ms"]);
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
        let lost = common::lost_where_hidden(&snap);
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

/// Programs a latprof session loads here: the three latency programs and one for each tick
/// tracepoint this kernel has (tracefs tells, independently of latprof).
fn expected_programs() -> usize {
    let tracefs = std::path::Path::new("/sys/kernel/tracing");
    if !tracefs.join("events").exists() {
        let status = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status()
            .expect("mount tracefs");
        assert!(status.success(), "cannot mount tracefs");
    }
    let ticks = [
        "irq_vectors/local_timer_entry",
        "timer/tick_stop",
        "context_tracking/user_enter",
        "context_tracking/user_exit",
    ]
    .iter()
    .filter(|tp| tracefs.join("events").join(tp).exists())
    .count();
    names::LOADED_PROGRAMS + ticks
}

/// Ids of loaded programs that carry latprof's program names.
fn latprof_program_ids() -> HashSet<u32> {
    let ours = names::PROGRAMS;
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            // The kernel keeps 15 characters of a program name.
            p.name_as_str()
                .is_some_and(|n| !n.is_empty() && ours.iter().any(|o| o.starts_with(n)))
        })
        .map(|p| p.id())
        .collect()
}

/// Waits until none of `ids` is loaded. The kernel frees a raw tracepoint program after its
/// link is gone and an RCU grace period has passed, so this can lag a little; 5 s is plenty.
fn assert_unloaded(ids: &HashSet<u32>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = latprof_program_ids().intersection(ids).copied().collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "programs left {what}: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn dropping_the_probe_unloads_everything() {
    let _guard = serial();
    let before = latprof_program_ids();
    let probe = attach(Mode::Lazy, None);
    // Every map user space names exists in the loaded object.
    for map in names::MAPS {
        assert!(
            probe.ebpf().map(map).is_some(),
            "no map {map} in the eBPF object"
        );
    }
    let during: HashSet<u32> = latprof_program_ids().difference(&before).copied().collect();
    assert_eq!(
        during.len(),
        expected_programs(),
        "attached programs: {during:?}"
    );
    // The tick programs that attached are exactly those whose tracepoints exist.
    let ticks = probe.tick_sources().iter().filter(|(_, ok)| *ok).count();
    assert_eq!(names::LOADED_PROGRAMS + ticks, expected_programs());
    drop(probe);
    assert_unloaded(&during, "after drop");
}

/// Runs `latprof stats` as a user would, stops it with `signal`, and checks its output and that
/// none of its programs stay loaded.
fn stats_cli_stops_cleanly_on(signal: i32) {
    let _guard = serial();
    stats_cli_attempt(signal);
}

fn stats_cli_attempt(signal: i32) {
    let mut work = Workload::spawn(&["sleep", "--count", "50", "--interval", "2ms"]);
    let before = latprof_program_ids();
    let mut stats = Command::new(LATPROF);
    if let Some(n) = std::env::var_os("LATPROF_TEST_DROP_SLEEPS") {
        stats.arg("--debug-drop-sleeps").arg(n);
    }
    let mut stats = stats
        .args([
            "stats",
            "--all-sleeps",
            "--duration",
            "60s",
            "--pid",
            &work.pid().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn latprof stats");
    let mut stderr = BufReader::new(stats.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("read stderr");
    assert!(line.contains("attached"), "first stderr line: {line}");
    let during: HashSet<u32> = latprof_program_ids().difference(&before).copied().collect();
    assert_eq!(
        during.len(),
        expected_programs(),
        "programs of latprof stats: {during:?}"
    );
    work.go();
    let facts = work.wait_done();
    let fact = |key: &str| common::fact(&facts, key);
    let (slept, own_total_us) = (fact("slept"), fact("total_ns") / 1000);
    work.release();
    let pid = i32::try_from(stats.id()).expect("pid");
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let out = stats.wait_with_output().expect("wait for latprof stats");
    assert!(out.status.success(), "latprof stats exit: {}", out.status);
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    // A sleep the kernel never ran latprof for is reported on stderr, never silently dropped.
    let rest = String::from_utf8_lossy(&out.stderr);
    let lost = common::reported_missing(&rest);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("Latency Top version : v0.1"));
    let nanosleep: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" hrtimer_nanosleep "))
        .collect();
    assert_eq!(nanosleep.len(), 1, "{text}");
    let fields: Vec<&str> = nanosleep[0].split(' ').collect();
    let count: u64 = fields[0].parse().expect("count");
    assert!(
        lost <= 2 && count + lost == slept,
        "slept {slept}\n{text}\n{rest}"
    );
    let total_us: u64 = fields[1].parse().expect("total");
    // Each real sleep about 2 ms (a little less from the switch-out, timer slack aside), and
    // all of them within what the workload timed around its nanosleeps (a fixed 150 ms bound
    // failed once in CI when this machine stalled the workload).
    assert!(
        (slept * 1_900..=own_total_us + 1).contains(&total_us),
        "slept {slept} in {own_total_us} us by its own clock, total {total_us} us\n{text}"
    );
    assert_unloaded(&during, "after latprof exited");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn stats_cli_sigint() {
    stats_cli_stops_cleanly_on(libc::SIGINT);
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn stats_cli_sigterm() {
    stats_cli_stops_cleanly_on(libc::SIGTERM);
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn stats_cli_kill9_leaves_nothing_loaded() {
    let _guard = serial();
    let before = latprof_program_ids();
    let mut stats = Command::new(LATPROF)
        .args(["stats", "--duration", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn latprof stats");
    let mut line = String::new();
    BufReader::new(stats.stderr.take().expect("stderr"))
        .read_line(&mut line)
        .expect("read stderr");
    assert!(line.contains("attached"), "{line}");
    let during: HashSet<u32> = latprof_program_ids().difference(&before).copied().collect();
    assert_eq!(during.len(), expected_programs());
    stats.kill().expect("kill -9");
    stats.wait().expect("wait");
    assert_unloaded(&during, "after kill -9");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn unprivileged_run_says_what_is_missing() {
    use std::os::unix::process::CommandExt as _;
    let _guard = serial();
    let out = Command::new(LATPROF)
        .args(["stats", "--duration", "1s"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run latprof as nobody");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(
        stderr.contains("root") && stderr.contains("CAP_BPF"),
        "{stderr}"
    );
    assert_eq!(out.stdout, [] as [u8; 0]);
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

/// Sleeps and run-queue waits each probe accounted (every one goes to one record).
fn accounted(snap: &Snapshot) -> u64 {
    snap.counters.get(Counter::Counted) + snap.counters.get(Counter::RunqCounted)
}

fn total(records: &HashMap<u64, GlobalRecord>) -> u64 {
    records.values().map(|r| r.count).sum()
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

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn kernel_threads_stay_out_of_the_global_table() {
    let _guard = serial();
    let probe = attach(Mode::Normal, None);
    let mut work = Workload::spawn(&[
        "fsync",
        "--count",
        "20",
        "--dir",
        env!("CARGO_TARGET_TMPDIR"),
    ]);
    let work_pid = work.pid();
    work.go();
    work.wait_done();
    let snap = Collector::new().snapshot(&probe).expect("snapshot");
    work.release();
    let kthreads: Vec<_> = snap.tasks.iter().filter(|t| t.kthread).collect();
    assert!(
        kthreads.iter().any(|t| t.comm.starts_with("kworker")),
        "no kworker seen among {:?}",
        snap.tasks
            .iter()
            .map(|t| (&t.comm, t.kthread))
            .collect::<Vec<_>>()
    );
    let workload = snap.tasks.iter().find(|t| t.tgid == work_pid);
    assert!(
        workload.is_some_and(|t| !t.kthread),
        "the workload is not a kernel thread"
    );
    let user_stacks: HashSet<u64> = snap
        .tasks
        .iter()
        .filter(|t| !t.kthread)
        .flat_map(|t| t.records.iter().map(|r| r.stack_id))
        .collect();
    let kthread_only: HashSet<u64> = kthreads
        .iter()
        .flat_map(|t| t.records.iter().map(|r| r.stack_id))
        .filter(|s| !user_stacks.contains(s))
        .collect();
    assert!(!kthread_only.is_empty(), "kernel threads recorded nothing");
    let leaked: Vec<_> = snap
        .global
        .iter()
        .filter(|(s, _)| kthread_only.contains(s))
        .collect();
    assert!(
        leaked.is_empty(),
        "kernel-thread causes in the global table: {leaked:?}"
    );
}

/// Runs a system command as root; it must succeed. Returns its stdout.
fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small ext4 filesystem on a loop device, mounted for one test. Its journal thread
/// (`jbd2/loopN-8`) is a kernel thread that the test can make sleep (an fsync there commits
/// the journal: the thread wakes, waits for its writes, sleeps again) and exit (unmount):
/// a kernel thread with a known pid, known causes and a known end.
struct Ext4 {
    image: std::path::PathBuf,
    dir: std::path::PathBuf,
    dev: String,
    mounted: bool,
}

impl Ext4 {
    fn mount(name: &str) -> Self {
        let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("latprof-ext4-{name}-{}", std::process::id()));
        let (image, dir) = (base.with_extension("img"), base.with_extension("mnt"));
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(32 << 20))
            .expect("image file");
        let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
        sh("mkfs.ext4", &["-q", "-F", &path(&image)]);
        let dev = sh("losetup", &["-f", "--show", &path(&image)])
            .trim()
            .to_owned();
        let mut fs = Self {
            image,
            dir,
            dev,
            mounted: false,
        };
        std::fs::create_dir_all(&fs.dir).expect("mount point");
        sh("mount", &[&fs.dev, &path(&fs.dir)]);
        fs.mounted = true;
        fs
    }

    fn dir(&self) -> &str {
        self.dir.to_str().expect("utf-8 path")
    }

    /// The pid of the filesystem's journal thread.
    fn journal_thread(&self) -> u32 {
        let dev = self.dev.rsplit('/').next().expect("device name");
        let comm = format!("jbd2/{dev}-8");
        std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == comm)
            })
            .unwrap_or_else(|| panic!("no journal thread {comm}"))
    }

    /// Unmounts: the journal thread exits.
    fn unmount(&mut self) {
        sh("umount", &[self.dir()]);
        self.mounted = false;
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Issue 12 section 4: a kernel thread, the journal thread of an ext4 filesystem the test
/// mounts, made to sleep by fsyncs there and to exit by the unmount.
///
/// With `--pid` of it, latencytop's rule is that the process asked for is counted whatever it
/// is (/proc/PID/latency has a kernel thread's records too): its sleeps are counted, they are
/// its table and the global table of that run, with no kernel thread's sleep kept out; in lazy
/// mode its exit merges them. `latprof stats --pid` takes its pid and prints them.
///
/// Without `--pid` (lazy mode, system-wide) kernel threads are kept out of the global table:
/// the thread's records are its own while it lives, and its exit merges none of them (the
/// `--debug-checks` counter of such exits says it had records).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_kernel_thread_counts_under_its_pid_and_stays_out_of_the_global_table_otherwise() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let mut fs = Ext4::mount("kthread");
    let jbd = fs.journal_thread();
    let jbd_arg = jbd.to_string();
    let normal = Probe::attach(ProbeConfig {
        mode: Mode::Normal,
        pid: Some(jbd),
        inter_cutoff: None,
        ..defaults()
    })
    .expect("attach latprof on the journal thread");
    let everyone = Probe::attach(ProbeConfig {
        mode: Mode::Lazy,
        inter_cutoff: None,
        debug_checks: true,
        ..defaults()
    })
    .expect("attach latprof");
    let (stats, stats_err) = common::start(
        Command::new(LATPROF)
            .args([
                "stats",
                "--all-sleeps",
                "--duration",
                "60s",
                "--pid",
                &jbd_arg,
            ])
            .stdout(Stdio::piped()),
        "attached",
    );
    let mut work = Workload::spawn(&["fsync", "--count", "20", "--dir", fs.dir()]);
    work.go();
    work.wait_done();
    work.release();
    let kjournald = |snap: &Snapshot| -> u64 {
        frames_with(&model::global_causes(snap, &syms, 12), "kjournald2")
            .iter()
            .map(|c| c.count)
            .sum()
    };

    // Under --pid: the thread is tracked, as a kernel thread, and everything it accounted is
    // in the global table.
    let snap = Collector::new().snapshot(&normal).expect("snapshot");
    let task = snap
        .tasks
        .iter()
        .find(|t| t.tid == jbd)
        .unwrap_or_else(|| panic!("journal thread not tracked: {:?}", snap.tasks));
    assert!(task.kthread, "{task:?}");
    assert!(!task.records.is_empty(), "{task:?}");
    assert!(kjournald(&snap) > 0, "no journal causes under --pid");
    assert_eq!(total(&snap.global_records()), accounted(&snap));
    assert_eq!(snap.counters.get(Counter::KthreadSleeps), 0);

    // System-wide: its records are its own, none global.
    let mut everyone_reader = Collector::new();
    let live = everyone_reader.snapshot(&everyone).expect("snapshot");
    let task = live
        .tasks
        .iter()
        .find(|t| t.tid == jbd)
        .unwrap_or_else(|| panic!("journal thread not tracked system-wide"));
    assert!(task.kthread, "{task:?}");
    assert!(!task.records.is_empty(), "{task:?}");
    assert!(live.counters.get(Counter::KthreadSleeps) > 0);
    assert_eq!(
        kjournald(&live),
        0,
        "a kernel thread's causes in the global view"
    );

    // The thread exits.
    fs.unmount();
    let (out, rest) = common::interrupt(stats, stats_err);
    let after = everyone_reader.snapshot(&everyone).expect("snapshot");
    assert!(
        after.tasks.iter().all(|t| t.tid != jbd),
        "journal thread still tracked"
    );
    assert_eq!(
        kjournald(&after),
        0,
        "the exit merged a kernel thread's records into the global table"
    );
    assert!(after.counters.get(Counter::DebugExitWithRecords) > 0);

    // latprof stats --pid (lazy): the exit merged its records; all it counted is printed.
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let counted: u64 = rest
        .lines()
        .find_map(|l| l.strip_prefix("latprof: ")?.split_once(" sleeps counted"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of sleeps:\n{rest}"));
    let printed: u64 = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .expect("count")
        })
        .sum();
    assert!(counted > 0, "{rest}");
    assert_eq!(printed, counted, "{text}\n{rest}");
    assert!(text.contains(" kjournald2 "), "{text}");
    assert!(!rest.contains("kernel threads"), "{rest}");
}

/// The parent process of `pid`, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

/// The workload sleeping 1 ms in a loop under another name, `other-NAME` (a task's name is its
/// program's: a link to the workload); killed when dropped, even by a failing test.
struct OtherCommand {
    child: std::process::Child,
    link: std::path::PathBuf,
}

impl OtherCommand {
    fn start(name: &str) -> Self {
        let link = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("other-{name}"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(common::workload_bin(), &link).expect("symlink");
        let child = Command::new(&link)
            .args(["sleep", "--count", "1000000", "--interval", "1ms"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the other command");
        Self { child, link }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for OtherCommand {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.link);
    }
}

/// `latprof top ARGS`'s App (what its processes pane shows), fed by `probe`'s snapshots.
fn top_app(args: &[&str], probe: &Probe, syms: &Kallsyms) -> latprof::tui::app::App {
    use clap::Parser as _;
    let cli = latprof::cli::Cli::try_parse_from(
        std::iter::once("latprof")
            .chain(["top"])
            .chain(args.iter().copied()),
    )
    .expect("top's flags");
    let latprof::cli::Command::Top(top) = &cli.command else {
        panic!("not top");
    };
    latprof::tui::app::App::new(
        latprof::tui::app::Settings {
            mode: Mode::Lazy,
            interval_ms: 100,
            depth: 12,
            syms: syms.clone(),
            reasons: latprof::reasons::Reasons::builtin(),
            kernel: latprof::probe::facts::kernel_facts(probe),
            spike_ns: u64::MAX,
            wakers: true,
        },
        latprof::cmd::top::initial_filter(top),
    )
}

/// Issue 12 section 4: who `--pid` and `--comm` take in, with a parent whose two forked
/// children sleep 1 ms in a loop for 1.5 s, and another command sleeping, whose name holds the
/// parent's pid (`other-PID`).
///
/// `--pid P` filters in the kernel on the thread group: P's threads, no other process, and
/// not P's children, which are processes of their own (their own tgid) from their first
/// instruction. That is latencytop's rule: /proc/P/latency holds P's own records, a child's
/// start empty at fork and are in /proc/CHILD/latency. (Where latprof differs on purpose:
/// /proc/P/latency is P's main thread alone, `--pid P` all its threads, as its help says.)
/// So `stats --pid P` prints the parent's waits for its children and none of their thousands
/// of nanosleeps, nor the other command's.
///
/// `top --comm NAME` is a view filter: the processes pane shows every process one of whose
/// threads' names contains NAME. Forked children keep their parent's name, so they are in;
/// the other command is not. `top --pid P` shows P alone: not its children, and not a
/// command whose name holds the digits of P (it did: the pid was matched as part of a name).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn pid_and_comm_take_in_what_latencytop_would() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let mut parent = Workload::spawn(&[
        "sleepers",
        "--procs",
        "2",
        "--interval",
        "1ms",
        "--time",
        "1500ms",
    ]);
    let pid = parent.pid();
    // Another command: the workload under another name (a task's name is its program's).
    let other = OtherCommand::start(&pid.to_string());
    let probe = attach(Mode::Lazy, None);
    let (stats, stats_err) = common::start(
        Command::new(LATPROF)
            .args([
                "stats",
                "--all-sleeps",
                "--duration",
                "60s",
                "--pid",
                &pid.to_string(),
            ])
            .stdout(Stdio::piped()),
        "attached",
    );
    let mut everyone = top_app(&[], &probe, &syms);
    let mut by_comm = top_app(&["--comm", "LATPROF-WORKLOA"], &probe, &syms);
    let mut by_pid = top_app(&["--pid", &pid.to_string()], &probe, &syms);
    parent.go();
    // Until the unfiltered pane shows both children and the other command (each sleeps every
    // millisecond once started).
    let mut collector = Collector::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let children = loop {
        let snap = collector.snapshot(&probe).expect("snapshot");
        for app in [&mut everyone, &mut by_comm, &mut by_pid] {
            app.on_snapshot(snap.clone());
        }
        let shown: HashSet<u32> = everyone.procs.iter().map(|p| p.tgid).collect();
        let children: HashSet<u32> = shown
            .iter()
            .copied()
            .filter(|&t| parent_of(t) == Some(pid))
            .collect();
        if children.len() == 2 && shown.contains(&other.pid()) {
            break children;
        }
        assert!(
            Instant::now() < deadline,
            "children or the other command not shown: {:?}",
            everyone.procs
        );
    };
    let tgids = |app: &latprof::tui::app::App| -> HashSet<u32> {
        app.procs.iter().map(|p| p.tgid).collect()
    };
    let comm = tgids(&by_comm);
    assert!(comm.is_superset(&children), "--comm: {:?}", by_comm.procs);
    assert!(!comm.contains(&other.pid()), "--comm: {:?}", by_comm.procs);
    assert!(
        by_comm
            .procs
            .iter()
            .all(|p| p.comm == common::WORKLOAD_COMM),
        "--comm: {:?}",
        by_comm.procs
    );
    assert!(
        tgids(&by_pid).iter().all(|&t| t == pid),
        "--pid shows another process: {:?}",
        by_pid.procs
    );
    parent.wait_done();
    drop(other);
    let (out, rest) = common::interrupt(stats, stats_err);
    parent.release();
    let text = String::from_utf8(out.stdout).expect("utf-8");
    // The parent waited for its children; their sleeps and the other command's are not its.
    assert!(
        text.lines().any(|l| l.contains(" do_wait ")),
        "no wait for the children:\n{text}\n{rest}"
    );
    assert!(!text.contains("nanosleep"), "{text}");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn own_threads_only_with_include_self() {
    let _guard = serial();
    let me = std::process::id();
    for include_self in [false, true] {
        let probe = Probe::attach(ProbeConfig {
            include_self,
            ..defaults()
        })
        .expect("attach");
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let snap = Collector::new().snapshot(&probe).expect("snapshot");
        let mine = snap.tasks.iter().any(|t| t.tgid == me);
        assert_eq!(mine, include_self, "own threads tracked = {mine}");
    }
}

/// Each CPU's idle time so far (ms), from /proc/stat (USER_HZ ticks).
fn idle_ms() -> Vec<u64> {
    // SAFETY: sysconf has no memory effects.
    let user_hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let idle: u64 = l
                .split_whitespace()
                .nth(4)
                .and_then(|v| v.parse().ok())
                .expect("idle field");
            idle * 1000 / user_hz.max(1)
        })
        .collect()
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn tick_counters_follow_a_busy_and_an_idle_cpu() {
    let _guard = serial();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    assert!(cpus >= 2, "this test needs two CPUs");
    let probe = attach(Mode::Lazy, None);
    let facts = latprof::probe::facts::kernel_facts(&probe);
    // nohz_full as sysfs says (none on this host; the VM test has CPU 1).
    let sysfs = std::fs::read_to_string("/sys/devices/system/cpu/nohz_full").unwrap_or_default();
    assert_eq!(
        facts.nohz_full_cpus,
        latprof::cpus::parse_list(&sysfs).expect("cpulist")
    );
    let mut collector = Collector::new();
    let idle_before = idle_ms();
    let before = collector.snapshot(&probe).expect("snapshot");
    // CPU 1 busy in user space for 1.5 s.
    let spin = Command::new(common::workload_bin())
        .args(["spin", "--time", "1500ms", "--cpu", "1"])
        .output()
        .expect("spin");
    assert!(spin.status.success());
    let after = collector.snapshot(&probe).expect("snapshot");
    let idle: Vec<u64> = idle_ms()
        .iter()
        .zip(&idle_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let secs = (after.taken_ns - before.taken_ns) as f64 / 1e9;
    let cpu = latprof::export::counters::cpu_ticks(&facts, Some(&before), &after);
    assert_eq!(cpu.len(), cpus, "{cpu:?}");
    let hz = f64::from(facts.hz.unwrap_or(100));
    // A busy CPU keeps its tick (no nohz_full here): about HZ per second while it spins.
    assert!(
        cpu[1].timer_ticks as f64 >= 0.5 * hz * 1.5,
        "CPU 1 busy for 1.5 s of {secs:.1} s: {} ticks at HZ {hz}",
        cpu[1].timer_ticks
    );
    // Idle CPUs stop their tick: a CPU that idled a fifth of a second stopped it at least
    // once. (On a machine busy with other work no CPU may idle at all: then there is nothing
    // to check, and the test says so.)
    if idle.iter().any(|&ms| ms >= 200) {
        assert!(
            cpu.iter().map(|c| c.tick_stopped).sum::<u64>() > 0,
            "idle ms per CPU {idle:?}: {cpu:?}"
        );
    } else {
        eprintln!(
            "NOT CHECKED: no CPU idled 200 ms (idle ms per CPU {idle:?}); tick stops unchecked"
        );
    }
    assert!(cpu.iter().all(|c| c.switches > 0), "{cpu:?}");
    let tracefs = |tp: &str| {
        std::path::Path::new("/sys/kernel/tracing/events")
            .join(tp)
            .exists()
    };
    assert_eq!(
        cpu[0].user_enter.is_some(),
        tracefs("context_tracking/user_enter"),
        "context tracking counted exactly where its tracepoints exist"
    );
    drop(probe);

    // The same through the command line, as a user reads it.
    let out = Command::new(LATPROF)
        .args(["stats", "--counters", "--duration", "1s"])
        .output()
        .expect("latprof stats --counters");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.contains("ticks/s"), "{text}");
    assert!(text.contains("nohz_full CPUs: "), "{text}");
    for c in 0..cpus {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{c:<4} "))),
            "no row for CPU {c}:\n{text}"
        );
    }
}

/// This kernel (6.18, x86-64) runs the best variant: no fallback, nothing to say about it.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn the_best_variant_loads_here() {
    let _guard = serial();
    let probe = Probe::attach(defaults()).expect("attach latprof");
    let variant = probe.variant();
    assert_eq!(variant.backtraces, Backtraces::AtWakeupCached);
    assert!(variant.cas);
    assert_eq!(probe.fallbacks(), [] as [String; 0]);
    let walked = Probe::attach(ProbeConfig {
        stack_cache: false,
        ..defaults()
    })
    .expect("attach latprof without the stack cache");
    assert_eq!(walked.variant().backtraces, Backtraces::AtWakeup);
    assert!(walked.variant().cas);
}

/// A program the verifier rejects (forced through a hidden flag): one error line naming the
/// program, quoting the verifier's reason (the end of its log, not its first line) and the
/// rejected instruction, and the whole log in a new file only root reads.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_verifier_rejection_is_said_with_its_reason_and_log() {
    let _guard = serial();
    let out = Command::new(LATPROF)
        .args(["stats", "--debug-force-reject", "--duration", "1s"])
        .output()
        .expect("run latprof");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("latprof: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let error = errors[0];
    assert!(error.contains("verifier rejected sched_switch"), "{error}");
    let path = error.rsplit_once("whole verifier log: ").map_or_else(
        || panic!("no log file named: {error}"),
        |(_, p)| std::path::PathBuf::from(p),
    );
    let log = std::fs::read_to_string(&path).expect("the log file exists");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&path).expect("stat").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    let last = log
        .lines()
        .rfind(|l| {
            !l.trim().is_empty()
                && !["verification time", "stack depth", "processed "]
                    .iter()
                    .any(|p| l.starts_with(p))
        })
        .expect("a verifier log");
    assert!(
        error.contains(&format!(": {last} (at ")),
        "the error does not quote the log's reason {last:?}: {error}"
    );
    // The same for every log this run wrote (one per variant tried).
    for line in stderr.lines() {
        if let Some((_, p)) = line.rsplit_once("whole verifier log: ") {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// D11: a task's name is the one it has now, not the one of its first sleep: a shell child
/// sleeps (waiting for `sleep`) as `sh`, then execs the workload, whose name every line shows;
/// a process that renames itself shows its new name at once (escaped).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn the_name_is_the_current_one() {
    let _guard = serial();
    let probe = attach(Mode::Lazy, None);
    let mut child = Command::new("sh")
        .args([
            "-c",
            &format!(
                "sleep 0.05; exec {} --hold sleep --count 10 --interval 2ms",
                common::workload_bin().display()
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(line.starts_with("done"), "{line}");
    // The nanosleeps that really slept (a 2 ms timer can expire before the task leaves the
    // CPU on a stalled machine).
    let slept: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("slept="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no slept= in {line}"));
    let mut collector = Collector::new();
    let snap = collector.snapshot(&probe).expect("snapshot");
    drop(child.stdin.take());
    let _ = child.wait();
    // A process that sleeps, then renames itself (prctl) and waits on stdin: the snapshot
    // after the rename has the new name, escaped.
    let mut renamer = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import ctypes, sys, time\n\
             for _ in range(5): time.sleep(0.002)\n\
             ctypes.CDLL(None).prctl(15, b'renamed\\x1b[2J', 0, 0, 0)\n\
             print('done', flush=True)\n\
             sys.stdin.read()",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let renamer_pid = renamer.id();
    let mut line = String::new();
    BufReader::new(renamer.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(line.starts_with("done"), "{line}");
    let renamed = collector.snapshot(&probe).expect("snapshot");
    drop(renamer.stdin.take());
    let _ = renamer.wait();
    let comm = renamed
        .tasks
        .iter()
        .find(|t| t.tid == renamer_pid)
        .map(|t| t.comm.as_str());
    assert_eq!(comm, Some("renamed\\x1b[2J"));
    let task = snap
        .tasks
        .iter()
        .find(|t| t.tid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not tracked"));
    // It slept as sh first (waiting for sleep), then as the workload (its nanosleeps, less
    // any this host hid the wakeup of and latprof reported lost).
    let sleeps: u64 = task
        .records
        .iter()
        .filter(|r| r.stack_id != latprof_common::RUNQ_STACK)
        .map(|r| r.count)
        .sum();
    let lost = common::lost_where_hidden(&snap);
    assert!(
        sleeps + lost > slept && slept >= 9,
        "slept {slept}, lost {lost}: {task:?}"
    );
    assert_eq!(task.comm, common::WORKLOAD_COMM, "{task:?}");
}

/// D16: the global table leaves kernel threads out, as latencytop does, and `stats` says how
/// many of their sleeps it left out instead of counting them with no word.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn stats_says_what_it_left_out() {
    let _guard = serial();
    let mut stats = Command::new(LATPROF)
        .args(["stats", "--duration", "3s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn latprof stats");
    let mut stderr = BufReader::new(stats.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("read stderr");
    assert!(line.contains("attached"), "first stderr line: {line}");
    // Writeback wakes kernel threads (kworkers, the journal) that sleep again.
    let mut work = Workload::spawn(&[
        "fsync",
        "--count",
        "20",
        "--dir",
        env!("CARGO_TARGET_TMPDIR"),
    ]);
    work.go();
    work.wait_done();
    work.release();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).expect("stderr");
    assert!(stats.wait().expect("wait").success(), "{rest}");
    let note = rest
        .lines()
        .find(|l| l.contains("sleeps of kernel threads and"))
        .unwrap_or_else(|| panic!("no word of kernel threads:\n{rest}"));
    let kthreads: u64 = note
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{note}"));
    assert!(kthreads > 0, "{note}");
}

/// Issue 12: a sleep whose wakeup the kernel hid is recovered, not lost: found open when its
/// task sleeps again, it was woken at `now - run time since - wait since`. latprof hides about
/// one wakeup in three here (`--debug-hide-wakeups 3`); every sleep the workload slept must be
/// counted, the recovered ones as long as the others. Where the backtrace is taken at the
/// wakeup, the recovered ones have none; where it is taken at switch-out, they keep theirs.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn sleeps_with_a_hidden_wakeup_are_recovered() {
    let _guard = serial();
    for btf_wakeup in [true, false] {
        recovery_attempt(btf_wakeup);
    }
}

/// Issue 12: the check of each lost or recovered sleep against the stretches where switches
/// were hidden can fail. Here the wakeups latprof hides on purpose are not logged as gaps
/// (`--debug-hide-unlogged`): most of the sleeps recovered overlap no gap latprof saw, and it
/// must say so (the other tests require that it never does).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recovered_sleep_no_gap_explains_is_reported() {
    let _guard = serial();
    let mut work = Workload::spawn(&["sleep", "--count", "100", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let (stats, stderr) = common::start(
        Command::new(LATPROF)
            .args([
                "--debug-hide-wakeups",
                "3",
                "--debug-hide-unlogged",
                "stats",
                "--duration",
                "60s",
                "--pid",
                &pid,
            ])
            .stdout(Stdio::null()),
        "attached",
    );
    work.go();
    work.wait_done();
    work.release();
    let (_, rest) = common::interrupt(stats, stderr);
    let number = |needle: &str| -> u64 {
        rest.lines()
            .find(|l| l.contains(needle))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {needle:?} line:\n{rest}"))
    };
    let recovered = number("sleeps recovered");
    let unexplained = number("overlapped no hidden switch");
    // About a third of 100 hidden; a few may fall in a stretch this host's kernel really hid.
    assert!(recovered >= 15, "{recovered} recovered\n{rest}");
    assert!(
        unexplained >= recovered / 2 && unexplained <= recovered + 1,
        "{unexplained} unexplained of {recovered} recovered\n{rest}"
    );
}

fn recovery_attempt(btf_wakeup: bool) {
    let mut work = Workload::spawn(&["sleep", "--count", "300", "--interval", "2ms"]);
    // Every sleep counts: a 2 ms nanosleep stretched past the 5 ms cutoff on this busy machine
    // must not go missing.
    let mut args = vec![
        "--debug-hide-wakeups",
        "3",
        "stats",
        "--all-sleeps",
        "--duration",
        "60s",
    ];
    if !btf_wakeup {
        args.insert(0, "--no-btf-wakeup");
    }
    let pid = work.pid().to_string();
    args.extend(["--pid", &pid]);
    let (stats, stderr) = common::start(
        Command::new(LATPROF).args(&args).stdout(Stdio::piped()),
        "attached",
    );
    work.go();
    let facts = work.wait_done();
    let fact = |key: &str| common::fact(&facts, key);
    let (slept, own_max_us, own_total_us) = (
        fact("slept"),
        fact("max_ns") / 1000,
        fact("total_ns") / 1000,
    );
    // Its last nanosleep, if its wakeup was hidden, is recovered when it sleeps again: in its
    // wait for the release, which then stays open until latprof has stopped.
    work.wait_blocked();
    let (out, rest) = common::interrupt(stats, stderr);
    work.release();
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let line = |needle: &str| -> Option<(u64, u64, u64)> {
        text.lines().find(|l| l.contains(needle)).map(|l| {
            let f: Vec<u64> = l
                .split(' ')
                .take(3)
                .map(|n| n.parse().expect("number"))
                .collect();
            (f[0], f[1], f[2])
        })
    };
    let recovered: u64 = rest
        .lines()
        .find(|l| l.contains("sleeps recovered"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sleeps recovered:\n{rest}"));
    // About a third of the wakeups hidden (random): far from none, far from all.
    assert!(
        (slept / 6..=slept / 2).contains(&recovered),
        "{recovered} of {slept} recovered\n{rest}"
    );
    // Each recovered sleep was checked against the wakeups hidden (gaps of no length, logged
    // where they were hidden): each overlapped one (common's helpers fail on any other).
    let checked: u64 = rest
        .lines()
        .find_map(|l| {
            l.split("; ")
                .nth(1)?
                .strip_suffix(
                    " lost or recovered sleeps overlapped a stretch where switches were hidden",
                )?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no check of the recovered sleeps:\n{rest}"));
    assert!(
        checked >= recovered,
        "{checked} checked, {recovered} recovered\n{rest}"
    );
    let (count, total, max) = line(" hrtimer_nanosleep ").expect("nanosleep line");
    let hidden = line("[wakeup hidden from tracing]");
    let lost = common::reported_lost(&rest);
    if btf_wakeup {
        let (h_count, h_total, h_max) =
            hidden.unwrap_or_else(|| panic!("no recovered line:\n{text}"));
        // Every recovered sleep is under that line, and each nanosleep is counted once.
        assert_eq!(h_count, recovered, "{text}\n{rest}");
        assert_eq!(
            count + h_count + lost,
            slept,
            "{count} + {h_count} recovered + {lost} lost for {slept} slept\n{text}\n{rest}"
        );
        // As long as the others: on an idle machine the averages agree within 0.5% (2,077
        // against 2,076 us); here a stall of a few sleeps, or the last wait on stdin among the
        // recovered, moves a small sample's average, so within 25%; each recovered nanosleep
        // at least the 2 ms it asked for (less 5%), none longer than the workload's own
        // longest. A unit error or a missing term is far outside these.
        let (avg, h_avg) = (total / count, h_total / h_count);
        assert!(
            h_avg.abs_diff(avg) <= avg / 4,
            "average {h_avg} us recovered, {avg} us seen\n{text}"
        );
        assert!(
            h_total >= (h_count - 1) * 1_900,
            "{h_count} recovered in {h_total} us\n{text}"
        );
        assert!(h_max <= own_max_us + 100, "{h_max} > {own_max_us}\n{text}");
    } else {
        // Backtraces taken at switch-out: the recovered sleeps are under their own cause.
        assert!(hidden.is_none(), "{text}");
        assert_eq!(count + lost, slept, "{text}\n{rest}");
        // At least the 2 ms asked for, at most what the workload's own clock saw.
        assert!(
            (slept * 1_900..=own_total_us).contains(&total),
            "slept {slept}, total {total} us, the workload's own {own_total_us} us\n{text}"
        );
        assert!(max <= own_max_us + 100, "{max} > {own_max_us}\n{text}");
    }
}

/// The kernel's own account (`memlock` in /proc/self/fdinfo) of the maps this process holds.
fn maps_memlock() -> u64 {
    std::fs::read_dir("/proc/self/fdinfo")
        .expect("fdinfo")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|info| info.lines().any(|l| l.starts_with("map_type:")))
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// Table sizes are refused up front by what their maps would pin (`--max-tasks 4194304` alone
/// pins 7.4 GiB): the estimate must follow what the kernel allocates, for larger tables than
/// the defaults too. Kernels before 6.4 report `memlock` by a simpler rule (key and value per
/// entry), a few percent under what they allocate: hence 10%.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn the_memory_estimate_matches_the_kernels_account() {
    let _guard = serial();
    let config = ProbeConfig {
        max_tasks: 65536,
        max_records: 32768,
        max_stacks: 16384,
        ..defaults()
    };
    let before = maps_memlock();
    let probe = Probe::attach(config.clone()).expect("attach latprof");
    let pinned = maps_memlock() - before;
    drop(probe);
    let cpus = latprof::cpus::possible();
    let estimate = latprof::probe::memory::estimate(&config, cpus);
    assert!(
        estimate.total.abs_diff(pinned) <= pinned / 10,
        "estimated {estimate:?} for {cpus} possible CPUs, the kernel says {pinned} bytes"
    );
}

/// A task latprof first sees already exiting (its first sleep is exit_aio's wait, after
/// exit_mm) is tracked as the kernel does, not refused: its sleeps count for the task and stay
/// out of the global table (no memory map), and its entry does not outlive the task. The
/// workload and its children run in a cgroup of their own, the only one traced, so the
/// counters are theirs.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_task_first_seen_exiting_is_tracked_and_freed() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    // Direct I/O needs a real disk (not tmpfs): the target directory of this build.
    let dir = std::env::var("LATPROF_FSYNC_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_owned());
    let name = format!("latprof-exiting-{}", std::process::id());
    let groups = common::cgroups::Cgroups::make(&[&name]);
    let mut work = Workload::spawn(&[
        "exit-aio",
        "--count",
        "20",
        "--dir",
        &dir,
        "--no-first-sleep",
    ]);
    common::cgroups::move_into(&work, groups.path(0));
    let probe = Probe::attach(ProbeConfig {
        mode: Mode::Lazy,
        cgroup_filter: vec![groups.path(0).to_path_buf()],
        ..defaults()
    })
    .expect("attach latprof");
    let mut collector = Collector::new();
    work.go();
    work.wait_done();
    let parent = work.pid();
    // Every child has exited and been reaped; each is freed a grace period later.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (snap, leaked) = loop {
        let snap = collector.snapshot(&probe).expect("snapshot");
        let leaked: Vec<u32> = snap
            .tasks
            .iter()
            .filter(|t| t.tgid != parent)
            .filter(|t| !std::path::Path::new(&format!("/proc/{}", t.tid)).exists())
            .map(|t| t.tid)
            .collect();
        if leaked.is_empty() || Instant::now() > deadline {
            break (snap, leaked);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    work.release();
    // No entry outlived its task.
    assert!(leaked.is_empty(), "entries of freed tasks: {leaked:?}");
    let counter = |c: Counter| snap.counters.get(c);
    // Each child's first traced sleep came after its exit began: tracked, not refused (all 20
    // here, a direct read of 8 MiB from disk still in flight; half, should a disk answer
    // sooner).
    let first_seen = counter(Counter::ExitingFirstSeen);
    assert!(
        (10..=20).contains(&first_seen),
        "{first_seen} first seen exiting"
    );
    // Their exit_aio waits counted as their own (no memory map), none in the global table.
    let no_mm = counter(Counter::NoMmSleeps);
    assert!(no_mm >= 10, "{no_mm} sleeps without a memory map");
    let global = model::global_causes(&snap, &syms, 12);
    assert!(
        frames_with(&global, "exit_aio").is_empty(),
        "exit_aio in the global table: {global:#?}"
    );
    drop(probe);
}

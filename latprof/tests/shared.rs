//! Lazy mode's argument for many CPUs, shown on two (issue 30): once a workload's task
//! entries, backtraces and keys exist, latprof's scheduler hooks write no data the CPUs share
//! in lazy mode, and write the global table at every counted sleep in normal mode. The
//! `--debug-checks` counter `debug_shared_writes` counts each such write in the kernel.
//!
//! Root only: `#[ignore]`d for a plain `cargo test`, run by `cargo xtask test`.
use latprof::{
    collect::{Collector, Snapshot},
    probe::{DebugConfig, Mode, Probe, ProbeConfig},
};
use latprof_common::Counter;

mod common;

use common::{
    Workload,
    cgroups::{Cgroups, move_into},
    probe::{defaults, serial},
};

/// Snapshots of `probe` until its counted sleeps reach `at_least`.
fn until_counted(reader: &mut Collector, probe: &Probe, at_least: u64) -> Snapshot {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let snap = reader.snapshot(probe).expect("snapshot");
        if snap.counters.get(Counter::Counted) >= at_least {
            return snap;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ping-pong counted {} sleeps in 60 s",
            snap.counters.get(Counter::Counted)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A ping-pong between two processes, one on each CPU, in a cgroup of its own that the probe
/// alone traces: after 2,000 counted sleeps (every entry, backtrace and key made), the next
/// 20,000 make no shared write in lazy mode and at least one each in normal mode.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn lazy_mode_writes_nothing_shared_once_warm() {
    let _guard = serial();
    let cgroups = Cgroups::make(&[&format!("latprof-shared-{}", std::process::id())]);
    for mode in [Mode::Lazy, Mode::Normal] {
        let mut work =
            Workload::spawn(&["pingpong", "--processes", "--apart", "--count", "100000"]);
        // The child is forked after `go`, into the parent's cgroup.
        move_into(&work, cgroups.path(0));
        let probe = Probe::attach(ProbeConfig {
            mode,
            inter_cutoff: None,
            cgroup_filter: vec![cgroups.path(0).to_owned()],
            debug: DebugConfig {
                checks: true,
                ..defaults().debug
            },
            ..defaults()
        })
        .expect("attach latprof");
        let mut reader = Collector::new();
        work.go();
        let before = until_counted(&mut reader, &probe, 2_000);
        let after = until_counted(
            &mut reader,
            &probe,
            before.counters.get(Counter::Counted) + 20_000,
        );
        let delta = |c: Counter| after.counters.get(c) - before.counters.get(c);
        let (counted, writes) = (delta(Counter::Counted), delta(Counter::DebugSharedWrites));
        // A backtrace first met after the warm-up is a new key: its store (and its histogram's,
        // where kept) is a shared write by design. Seen in a fresh-clone run: one pipe write
        // that found the pipe's lock taken by the reader on the other CPU, once in 20,000.
        let new: Vec<&Vec<u64>> = after
            .stacks
            .iter()
            .filter(|(id, _)| !before.stacks.contains_key(id))
            .map(|(_, frames)| frames)
            .collect();
        eprintln!(
            "{mode:?}: {counted} sleeps counted, {writes} shared writes, {} new backtraces",
            new.len()
        );
        match mode {
            Mode::Lazy => {
                assert!(
                    new.len() <= 3,
                    "not warm: {} new backtraces after the warm-up",
                    new.len()
                );
                assert!(
                    writes <= 2 * new.len() as u64,
                    "lazy mode's shared writes beyond its {} new backtraces ({new:x?}): {after:?}",
                    new.len()
                );
            }
            Mode::Normal => assert!(
                writes >= counted,
                "normal mode: {writes} shared writes for {counted} sleeps"
            ),
        }
        drop(probe);
        let _ = work.wait_done();
        work.release();
    }
}

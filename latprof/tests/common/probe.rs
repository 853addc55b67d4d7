//! Helpers of the privileged tests that attach latprof's programs in-process (counts.rs,
//! lifecycle.rs, tasks.rs, ticks.rs, recovery.rs).
use std::{
    collections::{HashMap, HashSet},
    sync::MutexGuard,
    time::{Duration, Instant},
};

use latprof::{
    collect::Snapshot,
    model::Cause,
    probe::{DebugConfig, Mode, Probe, ProbeConfig, names},
};
use latprof_common::{Counter, GlobalRecord};

pub const MS: u64 = 1_000_000;

/// One test at a time owns the kernel side, so program-id checks see only their own programs.
pub fn serial() -> MutexGuard<'static, ()> {
    super::serial("privileged tests")
}

/// The probe's defaults, with the defect `LATPROF_TEST_DEFECT=NAME` names (`--debug-defect`,
/// which every latprof a test runs takes from the environment): `cargo xtask mutants` sets it.
pub fn defaults() -> ProbeConfig {
    ProbeConfig {
        debug: DebugConfig {
            defect: std::env::var("LATPROF_TEST_DEFECT").ok().map(|name| {
                latprof_common::defect_named(&name).expect("LATPROF_TEST_DEFECT names a defect")
            }),
            ..DebugConfig::default()
        },
        ..ProbeConfig::default()
    }
}

pub fn attach(mode: Mode, pid: Option<u32>) -> Probe {
    Probe::attach(ProbeConfig {
        mode,
        pid,
        ..defaults()
    })
    .expect("attach latprof")
}

/// The causes with a frame that contains `needle`.
pub fn frames_with<'a>(causes: &'a [Cause], needle: &str) -> Vec<&'a Cause> {
    causes
        .iter()
        .filter(|c| c.backtrace.lines().iter().any(|f| f.contains(needle)))
        .collect()
}

/// Sleeps and run-queue waits a probe accounted (every one goes to one record).
pub fn accounted(snap: &Snapshot) -> u64 {
    snap.counters.get(Counter::Counted) + snap.counters.get(Counter::RunqCounted)
}

/// The sleeps in `records`.
pub fn total(records: &HashMap<u64, GlobalRecord>) -> u64 {
    records.values().map(|r| r.count).sum()
}

/// Ids of loaded programs that carry latprof's program names (lifecycle.rs, serve.rs).
pub fn latprof_program_ids() -> HashSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            // The kernel keeps 15 characters of a program name.
            p.name_as_str()
                .is_some_and(|n| !n.is_empty() && names::PROGRAMS.iter().any(|o| o.starts_with(n)))
        })
        .map(|p| p.id())
        .collect()
}

/// Waits until none of `ids` is loaded. The kernel frees a raw tracepoint program after its
/// link is gone and an RCU grace period has passed, so this can lag a little; 5 s is plenty.
pub fn assert_unloaded(ids: &HashSet<u32>, what: &str) {
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

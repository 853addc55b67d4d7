//! Helpers of the privileged tests that attach latprof's programs in-process (counts.rs,
//! lifecycle.rs, tasks.rs, ticks.rs, recovery.rs).
use std::{collections::HashMap, sync::MutexGuard};

use latprof::{
    collect::Snapshot,
    model::Cause,
    probe::{Mode, Probe, ProbeConfig},
};
use latprof_common::{Counter, GlobalRecord};

pub const MS: u64 = 1_000_000;

/// One test at a time owns the kernel side, so program-id checks see only their own programs.
pub fn serial() -> MutexGuard<'static, ()> {
    super::serial("privileged tests")
}

/// The probe's defaults, with the defect `LATPROF_TEST_DROP_SLEEPS=N` injects
/// (`--debug-drop-sleeps N`, as `common::start` adds it to latprof's command line): every count
/// test must then fail (see tests/defect.rs).
pub fn defaults() -> ProbeConfig {
    ProbeConfig {
        drop_sleeps: std::env::var("LATPROF_TEST_DROP_SLEEPS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
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

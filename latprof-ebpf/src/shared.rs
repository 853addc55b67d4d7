//! `--debug-checks`' count of writes to data every CPU shares (`DebugSharedWrites`): a shared
//! record's update, a new entry in a table's shared buckets (per-CPU tables' too: their
//! buckets and element lists are shared), an entry removed. Lazy mode's claim, shown on any
//! number of CPUs: once a workload's entries, backtraces and keys exist, its sleeps write
//! none of it (normal mode writes the global table at each). The event logs (the hidden-switch
//! log, spikes, exits) are not counted: opt-in or rare, outside the accounting. Behind
//! `DEBUG_CHECKS`, so a run without the flag holds none of it after the verifier.

use latprof_common::Counter;

use crate::{maps::count, settings::DEBUG_CHECKS};

/// Counts one write to shared data (with `--debug-checks`).
#[inline(always)]
pub(crate) fn write() {
    if DEBUG_CHECKS.load() == 1 {
        count(Counter::DebugSharedWrites);
    }
}

//! The kernel tables' fill that /metrics shows (`latprof_table_entries` against
//! `latprof_table_capacity`): how close each table is to dropping what it counts.
use crate::{collect::Snapshot, probe::ProbeConfig};

/// Each table in use: its name, the entries `snap` holds and the size it was given.
#[must_use]
pub fn of(snap: &Snapshot, config: &ProbeConfig) -> Vec<(&'static str, u64, u64)> {
    vec![
        (
            "tasks",
            snap.tasks.len() as u64,
            u64::from(config.max_tasks),
        ),
        (
            "records",
            snap.global.len() as u64,
            u64::from(config.max_records),
        ),
        (
            "stacks",
            snap.stacks.len() as u64,
            u64::from(config.max_stacks),
        ),
        // Keyed by (cgroup, stack), as the kernel keeps them.
        (
            "histograms",
            snap.cgroup_histograms.len() as u64,
            u64::from(config.max_records),
        ),
        (
            "cgroups",
            snap.cgroups.len() as u64,
            u64::from(config.max_records),
        ),
    ]
    .into_iter()
    .chain(config.wakers.then(|| {
        (
            "wakers",
            snap.wakers.len() as u64,
            u64::from(config.max_wakers),
        )
    }))
    .chain(config.chains.then(|| {
        (
            "chains",
            snap.chains.len() as u64,
            u64::from(config.max_chains),
        )
    }))
    .collect()
}

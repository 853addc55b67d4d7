//! The chain table (`--chains`), summed over CPUs: one level of each wait chain per row.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use latprof_common::ChainKey;

use super::comm_str;
use crate::probe::Maps;

/// The sleeps of one cause of one process that one process's task woke, by what the waker's
/// most recent sleep was (`ChainKey`): their time, and how much of it the waker slept there
/// and waited for a CPU after.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub key: ChainKey,
    pub count: u64,
    pub total_ns: u64,
    pub behind_ns: u64,
    pub runq_ns: u64,
    /// The waking task's name when first seen.
    pub comm: String,
}

/// Every row of the chain table, its CPUs' parts added, sorted by key.
pub(super) fn read_chains(maps: &Maps) -> Result<Vec<Chain>> {
    let mut out: BTreeMap<ChainKey, Chain> = BTreeMap::new();
    for item in &maps.chains {
        let (key, per_cpu) = item.context("read CHAINS")?;
        let c = out.entry(key).or_insert_with(|| Chain {
            key,
            ..Chain::default()
        });
        for part in per_cpu.iter().filter(|v| v.count > 0) {
            c.count += part.count;
            c.total_ns += part.total_ns;
            c.behind_ns += part.behind_ns;
            c.runq_ns += part.runq_ns;
            if c.comm.is_empty() && part.comm[0] != 0 {
                c.comm = comm_str(&part.comm);
            }
        }
    }
    Ok(out.into_values().filter(|c| c.count > 0).collect())
}

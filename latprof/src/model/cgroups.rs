//! Cgroups: their names as people know them, their rows, a row's histogram in one cgroup.

use latprof_common::{GlobalRecord, RUNQ_STACK};

use super::{Row, rows::minus};
use crate::collect::Snapshot;

/// A cgroup's name as people know it, from the snapshot's paths (`cgroup ID` if unknown).
#[must_use]
pub fn cgroup_name(snap: &Snapshot, id: u64) -> String {
    snap.cgroup_paths
        .get(&id)
        .and_then(|p| p.path.as_deref())
        .map_or_else(|| format!("cgroup {id}"), crate::cgroups::readable_name)
}

/// The full id of the container cgroup `id` is (or is in), from the snapshot's paths; `None`
/// where its path is unknown or names no container.
#[must_use]
pub fn container_id(snap: &Snapshot, id: u64) -> Option<String> {
    snap.cgroup_paths
        .get(&id)
        .and_then(|p| p.path.as_deref())
        .and_then(crate::cgroups::container_id)
}

/// The latency histogram of a row in one cgroup (live snapshots keep them per cgroup;
/// recordings only summed, and then this is empty).
#[must_use]
pub fn row_histogram_in(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    row: &Row,
    cgroup: u64,
) -> latprof_common::Histogram {
    let mut out = [0u32; latprof_common::HIST_BUCKETS];
    for stack in &row.stacks {
        let key = latprof_common::CgroupCause {
            cgroup,
            stack_id: *stack,
        };
        if let Some(h) = cur.cgroup_histograms.get(&key) {
            let b = base.and_then(|b| b.cgroup_histograms.get(&key));
            for (i, n) in h.iter().enumerate() {
                out[i] = out[i].saturating_add(n.saturating_sub(b.map_or(0, |b| b[i])));
            }
        }
    }
    out
}

/// One cgroup's sleeps over an interval, its causes by stack id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRow {
    pub id: u64,
    /// How people know it (`nginx.service`, `docker:0123456789ab`, `cgroup 1234` if never
    /// seen in the file system).
    pub name: String,
    pub path: Option<String>,
    /// Gone from the file system since latprof saw it.
    pub removed: bool,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub records: Vec<(u64, GlobalRecord)>,
}

/// Each cgroup's records in `cur` less `base`'s, the cgroups with the most latency first;
/// `runq` keeps the run-queue waits.
#[must_use]
pub fn cgroups_since(cur: &Snapshot, base: Option<&Snapshot>, runq: bool) -> Vec<CgroupRow> {
    let before = base.map(Snapshot::cgroup_records);
    let mut rows: std::collections::BTreeMap<u64, CgroupRow> = std::collections::BTreeMap::new();
    for (key, rec) in cur.cgroup_records() {
        if !runq && key.stack_id == RUNQ_STACK {
            continue;
        }
        let rec = minus(rec, before.as_ref().and_then(|b| b.get(&key)));
        if rec.count == 0 {
            continue;
        }
        let row = rows.entry(key.cgroup).or_insert_with(|| {
            let place = cur.cgroup_paths.get(&key.cgroup);
            CgroupRow {
                id: key.cgroup,
                name: cgroup_name(cur, key.cgroup),
                path: place.and_then(|p| p.path.clone()),
                removed: place.is_some_and(|p| p.removed),
                count: 0,
                total_ns: 0,
                max_ns: 0,
                records: Vec::new(),
            }
        });
        row.count += rec.count;
        row.total_ns += rec.total_ns;
        row.max_ns = row.max_ns.max(rec.max_ns);
        row.records.push((key.stack_id, rec));
    }
    let mut out: Vec<CgroupRow> = rows.into_values().collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.id.cmp(&b.id)));
    out
}

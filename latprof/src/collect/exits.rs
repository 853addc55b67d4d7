//! The tasks that exited: the probe sends each one's records through its `EXITED` ring buffer
//! as the task goes, and this log sums them by process, thread name, cgroup and cause, from
//! the collector's start. A window's sleeps of tasks gone by its end are then told by process
//! and thread (`model::threads`), where the tables alone know only their sum.

use std::{collections::BTreeMap, sync::Arc};

use latprof_common::{ExitedTask, GlobalRecord};

use super::maps::comm_str;
use crate::probe::Maps;

/// Keys kept: past this, new keys go under [`ExitKey::UNTOLD`] (see [`Exits::snapshot`] for
/// how room is made).
pub const MAX_KEYS: usize = 16_384;

/// What the exited tasks' sleeps are summed by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExitKey {
    /// The process (0: not told, see [`ExitKey::UNTOLD`]).
    pub tgid: u32,
    /// The thread's name when it exited, as the kernel holds it (zeros after its end).
    pub comm: [u8; 16],
    pub cgroup: u64,
    pub stack_id: u64,
}

impl ExitKey {
    /// The process of the sleeps summed past [`MAX_KEYS`]: not told.
    pub const UNTOLD: u32 = 0;

    /// The thread's name, printable.
    #[must_use]
    pub fn thread_name(&self) -> String {
        comm_str(&self.comm)
    }
}

/// The exited tasks' sums, and which keys changed since the last snapshot.
#[derive(Default)]
pub struct Exits {
    sums: Arc<BTreeMap<ExitKey, GlobalRecord>>,
    changed: std::collections::HashSet<ExitKey>,
    /// Exits logged while their task was still in the table a snapshot read: the next one
    /// takes them.
    held: Vec<ExitedTask>,
}

impl Exits {
    /// Drains the log into the sums, between snapshots (the ring holds a few hundred exits).
    pub fn drain(&mut self, maps: &Maps) {
        self.drain_holding(maps, &std::collections::HashSet::new());
    }

    /// Drains the log right after a snapshot read the tables, holding back the exits of
    /// tasks it still read (`live`): each task is sent before its entry goes, so its
    /// snapshot may hold both its records and its exit. Held, it counts in the next.
    pub fn drain_holding(&mut self, maps: &Maps, live: &std::collections::HashSet<u32>) {
        for task in std::mem::take(&mut self.held) {
            self.add(&task);
        }
        let mut ring = maps.exited();
        while let Some(item) = ring.next() {
            if item.len() < size_of::<ExitedTask>() {
                continue;
            }
            // SAFETY: the kernel wrote a whole ExitedTask's header and its first `nr_records`
            // records (size checked); the records past them are never read; the read is
            // unaligned-safe.
            let task = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<ExitedTask>()) };
            if live.contains(&task.tid) {
                self.held.push(task);
            } else {
                self.add(&task);
            }
        }
    }

    fn add(&mut self, task: &ExitedTask) {
        let n = (task.nr_records as usize).min(task.records.len());
        // Zeros after the name's end, whatever the kernel left there: one key per name.
        let mut comm = [0u8; 16];
        let len = task.comm.iter().position(|&b| b == 0).unwrap_or(16);
        comm[..len].copy_from_slice(&task.comm[..len]);
        let sums = Arc::make_mut(&mut self.sums);
        for (i, rec) in task.records[..n].iter().enumerate() {
            // A record kept to the task reaches no global table.
            if latprof_common::task_only(task.task_only, i) {
                continue;
            }
            let mut key = ExitKey {
                tgid: task.tgid,
                comm,
                cgroup: rec.cgroup,
                stack_id: rec.stack_id,
            };
            if sums.len() >= MAX_KEYS && !sums.contains_key(&key) {
                key.tgid = ExitKey::UNTOLD;
                key.comm = [0; 16];
            }
            sums.entry(key).or_default().merge_task(rec);
            self.changed.insert(key);
        }
    }

    /// The sums as a snapshot holds them (shared until the next exit). Past half the bound,
    /// the keys that did not change since the previous snapshot go first: a window between
    /// two consecutive snapshots (serve's reads, a recording's frames) loses nothing by it.
    pub fn snapshot(&mut self) -> Arc<BTreeMap<ExitKey, GlobalRecord>> {
        if self.sums.len() > MAX_KEYS / 2 {
            let changed = &self.changed;
            Arc::make_mut(&mut self.sums)
                .retain(|k, _| changed.contains(k) || k.tgid == ExitKey::UNTOLD);
        }
        self.changed.clear();
        Arc::clone(&self.sums)
    }
}

#[cfg(test)]
mod tests {
    use latprof_common::{LatencyRecord, TASK_RECORDS};

    use super::*;

    fn task(tgid: u32, comm: &str, records: &[(u64, u64)], task_only: u32) -> ExitedTask {
        let mut t = ExitedTask {
            tid: tgid,
            tgid,
            nr_records: u32::try_from(records.len()).unwrap(),
            task_only,
            comm: [0; 16],
            records: [LatencyRecord::default(); TASK_RECORDS],
        };
        t.comm[..comm.len()].copy_from_slice(comm.as_bytes());
        for (slot, &(stack_id, count)) in t.records.iter_mut().zip(records) {
            *slot = LatencyRecord {
                stack_id,
                count,
                total_ns: count * 1000,
                max_ns: 1000,
                cgroup: 7,
            };
        }
        t
    }

    fn key(tgid: u32, name: &str, stack_id: u64) -> ExitKey {
        let mut comm = [0; 16];
        comm[..name.len()].copy_from_slice(name.as_bytes());
        ExitKey {
            tgid,
            comm,
            cgroup: 7,
            stack_id,
        }
    }

    #[test]
    fn threads_of_one_name_sum_and_task_only_records_stay_out() {
        let mut exits = Exits::default();
        exits.add(&task(10, "worker", &[(1, 2), (2, 3)], 0b10));
        exits.add(&task(10, "worker", &[(1, 5)], 0));
        let sums = exits.snapshot();
        assert_eq!(sums.len(), 1);
        assert_eq!(sums[&key(10, "worker", 1)].count, 7);
        assert_eq!(sums[&key(10, "worker", 1)].total_ns, 7000);
    }

    #[test]
    fn past_the_bound_new_keys_are_untold_and_unchanged_ones_go() {
        let mut exits = Exits::default();
        let bound = u32::try_from(MAX_KEYS).unwrap();
        for pid in 1..=bound + 2 {
            exits.add(&task(pid, "a", &[(1, 1)], 0));
        }
        let full = exits.snapshot();
        // Untold past the bound, not lost.
        assert_eq!(full.len(), MAX_KEYS + 1);
        let untold = ExitKey {
            tgid: ExitKey::UNTOLD,
            comm: [0; 16],
            cgroup: 7,
            stack_id: 1,
        };
        assert_eq!(full[&untold].count, 2);
        assert_eq!(
            full.values().map(|r| r.count).sum::<u64>(),
            u64::from(bound) + 2
        );
        // Nothing changed since that snapshot but one key: the next keeps it and the untold.
        exits.add(&task(1, "a", &[(1, 1)], 0));
        let after = exits.snapshot();
        assert_eq!(after.len(), 2);
        assert_eq!(after[&key(1, "a", 1)].count, 2);
        assert_eq!(after[&untold].count, 2);
        // The earlier snapshot still holds its own.
        assert_eq!(full.len(), MAX_KEYS + 1);
    }
}

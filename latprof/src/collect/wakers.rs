//! The wakers (`--wakers`): the per-CPU waker table and its overflow's, summed over CPUs,
//! plus each task's pending waker (`TaskState::waker_pending`: the sleeps of its latest waker
//! that the kernel has not yet added to the table), each key's counts never going back from
//! one snapshot to the next.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::maps::{MapData, PerCpuHashMap};
use latprof_common::{Counter, WAKER_OTHER, WakerKey, WakerValue};

use super::{Counters, Waker, maps::comm_str};
use crate::probe::{Maps, names};

/// The waker tables as read: every key's sums, and how many keys the main table holds.
pub(super) struct WakerTable {
    wakers: BTreeMap<WakerKey, Waker>,
    main_keys: usize,
}

/// The waker tables, summed over CPUs (a waker's name is in the part of the CPU that first
/// saw it; the others are zero-filled). Read before the tasks (`read_tables`), whose pending
/// wakers `with_pending` adds: a pending waker moves into the table when its task's next sleep
/// has another or the task exits, and a move between the two reads then leaves it out of this
/// read (`Seen` keeps what an earlier one had) instead of counting it twice.
pub(super) fn read_wakers(maps: &Maps) -> Result<WakerTable> {
    let mut wakers: BTreeMap<WakerKey, Waker> = BTreeMap::new();
    let mut main_keys = 0;
    for (i, (map, name)) in maps
        .wakers
        .iter()
        .zip([names::MAP_WAKERS, names::MAP_WAKERS_OTHER])
        .enumerate()
    {
        let keys = read_waker_map(map, &mut wakers).with_context(|| format!("read {name}"))?;
        if i == 0 {
            main_keys = keys;
        }
    }
    Ok(WakerTable { wakers, main_keys })
}

/// The wakers read from the tables plus the tasks' pending ones (`Tables::pending_wakers`).
/// Where the main table (of `max_wakers` keys) is full and lacks a pending waker's key, the
/// kernel will add its sleeps to the cause's other wakers, and count them as the table's
/// overflow (`waker_table_full`): so do these, now, so that no key's count goes back later.
pub(super) fn with_pending(
    table: WakerTable,
    pending: &[(WakerKey, WakerValue)],
    max_wakers: u32,
    counters: &mut Counters,
) -> Vec<Waker> {
    let WakerTable {
        mut wakers,
        main_keys,
    } = table;
    let full = main_keys >= max_wakers as usize;
    for (key, value) in pending {
        if full && !wakers.contains_key(key) {
            let other = WakerKey {
                cause: key.cause,
                waker_stack: 0,
                sleeper_tgid: key.sleeper_tgid,
                kind: WAKER_OTHER,
                waker_tgid: 0,
                waker_tid: 0,
            };
            let value = WakerValue {
                comm: [0; 16],
                ..*value
            };
            add_waker(&mut wakers, other, &value);
            counters.0[Counter::WakerTableFull as usize] += value.count;
        } else {
            add_waker(&mut wakers, *key, value);
        }
    }
    wakers.into_values().filter(|w| w.count > 0).collect()
}

/// Adds `map`'s parts into `out`; returns how many keys it holds.
fn read_waker_map(
    map: &PerCpuHashMap<MapData, WakerKey, WakerValue>,
    out: &mut BTreeMap<WakerKey, Waker>,
) -> Result<usize> {
    let mut keys = 0;
    for item in map {
        let (key, per_cpu) = item?;
        keys += 1;
        for part in per_cpu.iter() {
            add_waker(out, key, part);
        }
    }
    Ok(keys)
}

fn add_waker(out: &mut BTreeMap<WakerKey, Waker>, key: WakerKey, value: &WakerValue) {
    let w = out.entry(key).or_insert_with(|| Waker {
        key,
        ..Waker::default()
    });
    if value.count == 0 {
        return;
    }
    w.count += value.count;
    w.total_ns += value.total_ns;
    w.max_ns = w.max_ns.max(value.max_ns);
    if w.comm.is_empty() && value.comm[0] != 0 {
        w.comm = comm_str(&value.comm);
    }
}

/// Each key's sums at their largest so far: a read can only fall short (a pending waker
/// moved into the table between the two reads), never count a sleep twice, so the largest
/// read is the truest, and a view of the difference between two snapshots never counts the
/// sleeps such a move left out twice.
#[derive(Default)]
pub(super) struct Seen(BTreeMap<WakerKey, Waker>);

impl Seen {
    pub(super) fn keep(&mut self, wakers: Vec<Waker>) -> Vec<Waker> {
        for w in wakers {
            match self.0.get_mut(&w.key) {
                Some(seen) if seen.count >= w.count => {}
                Some(seen) => *seen = w,
                None => {
                    self.0.insert(w.key, w);
                }
            }
        }
        self.0.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cause: u64, waker_tid: u32) -> WakerKey {
        WakerKey {
            cause,
            waker_stack: 0,
            sleeper_tgid: 7,
            kind: latprof_common::WAKER_TASK,
            waker_tgid: waker_tid,
            waker_tid,
        }
    }

    fn value(count: u64) -> WakerValue {
        WakerValue {
            count,
            total_ns: count * 1000,
            max_ns: 1000,
            comm: *b"pong\0\0\0\0\0\0\0\0\0\0\0\0",
        }
    }

    fn table(keys: &[(WakerKey, u64)]) -> WakerTable {
        let mut wakers = BTreeMap::new();
        for (k, n) in keys {
            add_waker(&mut wakers, *k, &value(*n));
        }
        WakerTable {
            main_keys: wakers.len(),
            wakers,
        }
    }

    #[test]
    fn pending_sleeps_add_to_their_key() {
        let mut counters = Counters::default();
        let out = with_pending(
            table(&[(key(1, 10), 3)]),
            &[(key(1, 10), value(2)), (key(1, 11), value(4))],
            8192,
            &mut counters,
        );
        let counts: Vec<(u32, u64)> = out.iter().map(|w| (w.key.waker_tid, w.count)).collect();
        assert_eq!(counts, [(10, 5), (11, 4)]);
        assert_eq!(out[1].comm, "pong");
        assert_eq!(counters.0[Counter::WakerTableFull as usize], 0);
    }

    #[test]
    fn a_full_table_sends_a_new_key_to_the_causes_other_wakers() {
        let mut counters = Counters::default();
        let out = with_pending(
            table(&[(key(1, 10), 3), (key(2, 10), 1)]),
            &[(key(1, 10), value(2)), (key(1, 11), value(4))],
            2,
            &mut counters,
        );
        let other: Vec<&Waker> = out.iter().filter(|w| w.key.kind == WAKER_OTHER).collect();
        assert_eq!(other.len(), 1);
        assert_eq!((other[0].key.cause, other[0].count), (1, 4));
        assert_eq!(other[0].comm, "");
        assert!(out.iter().all(|w| w.key.waker_tid != 11));
        assert_eq!(counters.0[Counter::WakerTableFull as usize], 4);
    }

    #[test]
    fn a_keys_sums_never_go_back() {
        let mut seen = Seen::default();
        let mut w = Waker {
            key: key(1, 10),
            count: 5,
            total_ns: 5000,
            ..Waker::default()
        };
        assert_eq!(seen.keep(vec![w.clone()])[0].count, 5);
        // A read that missed a pending waker's move.
        w.count = 3;
        assert_eq!(seen.keep(vec![w.clone()])[0].count, 5);
        w.count = 9;
        assert_eq!(seen.keep(vec![w])[0].count, 9);
        // A key a read missed whole is still there.
        assert_eq!(seen.keep(Vec::new()).len(), 1);
    }
}

//! One reader per group of maps the snapshot does not take itself: the wakers, the tick
//! counters, the CPUs' last switches (who hid them), and a task's entry.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use latprof_common::{CpuSwitch, TICK_COUNTER_COUNT, TaskState, WakerKey, WakerValue};

use super::{TaskSnapshot, TickCounts, Waker};
use crate::probe::{Probe, names};

/// The waker table, summed over CPUs (a waker's name is in the part of the CPU that first
/// saw it; the others are zero-filled).
pub(super) fn read_wakers(probe: &Probe) -> Result<Vec<Waker>> {
    let mut out: BTreeMap<WakerKey, Waker> = BTreeMap::new();
    for name in [names::MAP_WAKERS, names::MAP_WAKERS_OTHER] {
        let map: PerCpuHashMap<&MapData, WakerKey, WakerValue> = PerCpuHashMap::try_from(
            probe
                .ebpf()
                .map(name)
                .with_context(|| format!("no {name} map"))?,
        )?;
        read_waker_map(&map, &mut out).with_context(|| format!("read {name}"))?;
    }
    Ok(out.into_values().filter(|w| w.count > 0).collect())
}

pub(super) fn read_waker_map(
    map: &PerCpuHashMap<&MapData, WakerKey, WakerValue>,
    out: &mut BTreeMap<WakerKey, Waker>,
) -> Result<()> {
    for item in map {
        let (key, per_cpu) = item?;
        let w = out.entry(key).or_insert_with(|| Waker {
            key,
            ..Waker::default()
        });
        for part in per_cpu.iter().filter(|v| v.count > 0) {
            w.count += part.count;
            w.total_ns += part.total_ns;
            w.max_ns = w.max_ns.max(part.max_ns);
            if w.comm.is_empty() && part.comm[0] != 0 {
                w.comm = comm_str(&part.comm);
            }
        }
    }
    Ok(())
}

/// The per-CPU tick counters.
pub(super) fn read_ticks(probe: &Probe) -> Result<Vec<TickCounts>> {
    let map: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(probe.ebpf().map(names::MAP_TICKS).context("no TICKS map")?)?;
    let mut out: Vec<TickCounts> = Vec::new();
    for i in 0..TICK_COUNTER_COUNT {
        let values = map.get(&i, 0).context("read TICKS")?;
        if out.is_empty() {
            out = vec![[0; TICK_COUNTER_COUNT as usize]; values.len()];
        }
        for (cpu, v) in values.iter().enumerate() {
            out[cpu][i as usize] = *v;
        }
    }
    Ok(out)
}

/// Each CPU's last hidden task (0: none).
pub(super) fn read_hidden(probe: &Probe) -> Result<Vec<(u32, String)>> {
    let map: PerCpuArray<&MapData, CpuSwitch> = PerCpuArray::try_from(
        probe
            .ebpf()
            .map(names::MAP_LAST_SWITCH)
            .context("no LAST_SWITCH map")?,
    )?;
    let values = map.get(&0, 0).context("read LAST_SWITCH")?;
    Ok(values
        .iter()
        .map(|s| (s.hidden_tid, comm_str(&s.hidden_comm)))
        .collect())
}

/// A kernel `comm` (NUL-padded, at most 16 bytes) as text, its control characters escaped:
/// any user names their threads.
#[must_use]
pub fn comm_str(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    crate::text::printable(&String::from_utf8_lossy(&comm[..len])).into_owned()
}

pub(super) fn task_snapshot(tid: u32, state: &TaskState) -> TaskSnapshot {
    let n = (state.nr_records as usize).min(state.records.len());
    TaskSnapshot {
        tid,
        tgid: state.tgid,
        comm: comm_str(&state.comm),
        kthread: state.flags & latprof_common::TASK_FLAG_KTHREAD != 0,
        records: state.records[..n].to_vec(),
        task_only: state.task_only,
    }
}

#[cfg(test)]
mod tests {
    use super::comm_str;

    /// Names from the kernel reach no terminal raw.
    #[test]
    fn task_names_are_printable() {
        let mut comm = [0u8; 16];
        comm[..8].copy_from_slice(b"\x1b[2Jevil");
        assert_eq!(comm_str(&comm), "\\x1b[2Jevil");
    }
}

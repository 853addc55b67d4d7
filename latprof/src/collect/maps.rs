//! One reader per group of maps the snapshot does not take itself: the tick counters, the
//! CPUs' last switches (who hid them), and a task's entry (the wakers: `wakers.rs`).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::Ebpf;
use latprof_common::{
    CgroupCause, Counter, GlobalRecord, HIST_BUCKETS, Histogram, TICK_COUNTER_COUNT, TaskState,
    WakerKey, WakerValue,
};

use super::{Counters, MAX_RETRIES, TaskSnapshot, TickCounts};
use crate::probe::Maps;

/// The per-CPU tick counters.
pub(super) fn read_ticks(maps: &Maps) -> Result<Vec<TickCounts>> {
    let map = &maps.ticks;
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
pub(super) fn read_hidden(maps: &Maps) -> Result<Vec<(u32, String)>> {
    let values = maps.last_switch.get(&0, 0).context("read LAST_SWITCH")?;
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

/// The tables an exit moves records between, read whole and together: the tasks, the global
/// table, the per-cgroup table and the counters.
pub(super) struct Tables {
    pub(super) tasks: Vec<TaskSnapshot>,
    pub(super) global: Vec<(u64, GlobalRecord)>,
    pub(super) cgroups: Vec<(CgroupCause, GlobalRecord)>,
    pub(super) counters: Counters,
    /// The tasks' pending wakers (`TaskState::waker_pending`), by `WAKERS`' key.
    pub(super) pending_wakers: Vec<(WakerKey, WakerValue)>,
    /// Reads retried because an exit moved records meanwhile.
    pub(super) retries: u32,
    /// False: the last read still overlapped a move (after `MAX_RETRIES`).
    pub(super) settled: bool,
}

/// Reads the tables: in lazy mode an exit moves a task's records from its entry (in
/// TASK_SLOTS or TASKS) to GLOBAL_LATENCY, and with cgroups to the per-cgroup table; a read
/// that overlaps such a move would count it twice or not at all, so it is retried.
pub(super) fn read_tables(maps: &Maps) -> Result<Tables> {
    let Maps {
        counters: counters_map,
        tasks: tasks_map,
        global: global_map,
        merged: merged_map,
        cgroups: cgroup_map,
        ..
    } = maps;

    let read_counters = || -> Result<Counters> {
        let mut c = Counters::default();
        for (i, slot) in c.0.iter_mut().enumerate() {
            *slot = counter_sum(counters_map, u32::try_from(i)?)?;
        }
        Ok(c)
    };

    let mut retries = 0;
    loop {
        let before = read_counters()?;
        let mut tasks = Vec::new();
        let mut pending_wakers = Vec::new();
        let mut take = |tid: u32, state: &TaskState| {
            tasks.push(task_snapshot(tid, state));
            if state.waker_pending.count > 0 {
                pending_wakers.push((state.waker_pending_key, state.waker_pending));
            }
        };
        maps.task_slots.for_each(&mut take)?;
        for item in tasks_map {
            let (tid, state) = item.context("read TASKS")?;
            take(tid, &state);
        }
        // The shared table, plus each CPU's part of lazy mode's exit merges (and, on
        // kernels without compare-and-swap, normal mode's maxima: parts with no count).
        let mut table: BTreeMap<u64, GlobalRecord> = BTreeMap::new();
        for item in global_map {
            let (id, rec) = item.context("read GLOBAL_LATENCY")?;
            table.insert(id, rec);
        }
        for item in merged_map {
            let (id, per_cpu) = item.context("read MERGED")?;
            for part in per_cpu.iter().filter(|r| r.count > 0 || r.max_ns > 0) {
                table.entry(id).or_default().merge(part);
            }
        }
        let global: Vec<(u64, GlobalRecord)> = table.into_iter().collect();
        let mut by_cgroup: BTreeMap<CgroupCause, GlobalRecord> = BTreeMap::new();
        for item in cgroup_map {
            let (key, per_cpu) = item.context("read CGROUP_LATENCY")?;
            for part in per_cpu.iter().filter(|r| r.count > 0) {
                by_cgroup.entry(key).or_default().merge(part);
            }
        }
        let cgroups: Vec<(CgroupCause, GlobalRecord)> = by_cgroup.into_iter().collect();
        let after = read_counters()?;
        // Exits move records in lazy mode (to the global table) and, with cgroups, in
        // both modes (to the per-cgroup table).
        let settled = after.get(Counter::MergesBegun) == before.get(Counter::MergesDone);
        if settled || retries >= MAX_RETRIES {
            return Ok(Tables {
                tasks,
                global,
                cgroups,
                counters: after,
                pending_wakers,
                retries,
                settled,
            });
        }
        retries += 1;
    }
}

/// One counter, summed over CPUs, read now.
pub(super) fn read_counter(maps: &Maps, counter: Counter) -> Result<u64> {
    counter_sum(&maps.counters, counter as u32)
}

fn counter_sum(map: &aya::maps::PerCpuArray<aya::maps::MapData, u64>, index: u32) -> Result<u64> {
    Ok(map.get(&index, 0).context("read COUNTERS")?.iter().sum())
}

/// The latency histograms, summed over CPUs: by backtrace, and by cgroup and backtrace.
pub(super) fn read_histograms(
    maps: &Maps,
) -> Result<(BTreeMap<u64, Histogram>, BTreeMap<CgroupCause, Histogram>)> {
    let mut histograms = BTreeMap::new();
    let mut cgroup_histograms = BTreeMap::new();
    for item in &maps.histograms {
        let (key, per_cpu) = item.context("read HISTOGRAMS")?;
        let mut sum = [0u32; HIST_BUCKETS];
        for cpu in per_cpu.iter() {
            for (acc, n) in sum.iter_mut().zip(cpu) {
                *acc = acc.saturating_add(*n);
            }
        }
        let by_stack: &mut Histogram = histograms.entry(key.stack_id).or_insert([0; HIST_BUCKETS]);
        for (acc, n) in by_stack.iter_mut().zip(sum) {
            *acc = acc.saturating_add(n);
        }
        cgroup_histograms.insert(key, sum);
    }
    Ok((histograms, cgroup_histograms))
}

/// The kernel's run-time statistics of each loaded program (zero unless turned on): (name,
/// run time ns, runs).
pub(super) fn program_stats(ebpf: &Ebpf) -> Vec<(String, u64, u64)> {
    let mut programs = Vec::new();
    for (name, program) in ebpf.programs() {
        if let Ok(info) = program.info() {
            let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            programs.push((name.to_owned(), ns, info.run_count()));
        }
    }
    programs
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

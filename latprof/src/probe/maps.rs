//! The maps user space reads at each snapshot, taken out of the loaded object once at attach
//! and typed then: the collector's readers use these fields, never a name, and a map missing
//! from the object or of another type fails the attach, not a later read.

use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
};
use latprof_common::{
    CauseParts, CgroupCause, ChainKey, ChainValue, CpuSwitch, GlobalRecord, Histogram, RawStack,
    TaskState, UserStack, WakerKey, WakerValue,
};

use super::{names, task_slots::TaskSlots};

/// Every map a snapshot reads, owned: they live as long as the probe.
pub struct Maps {
    /// Pipeline counters, per CPU.
    pub counters: PerCpuArray<MapData, u64>,
    /// Tick and time-accounting counters, per CPU.
    pub ticks: PerCpuArray<MapData, u64>,
    /// The task entries in the hash, by tid (all of them where the kernel has no slots)...
    pub tasks: HashMap<MapData, u32, TaskState>,
    /// ...and those in slots (`task_table`).
    pub task_slots: TaskSlots,
    /// The global causes, by record id.
    pub global: HashMap<MapData, u64, GlobalRecord>,
    /// Lazy mode's exit merges, per CPU.
    pub merged: PerCpuHashMap<MapData, u64, GlobalRecord>,
    /// Exited tasks' records by cgroup and cause, per CPU.
    pub cgroups: PerCpuHashMap<MapData, CgroupCause, GlobalRecord>,
    /// Latency histograms by cgroup and cause, per CPU.
    pub histograms: PerCpuHashMap<MapData, CgroupCause, Histogram>,
    /// Kernel backtraces, by id.
    pub stacks: HashMap<MapData, u64, RawStack>,
    /// With `--user-stacks`: each combined cause's kernel and user parts, and the user
    /// backtraces.
    pub cause_parts: HashMap<MapData, u64, CauseParts>,
    pub user_stacks: HashMap<MapData, u64, UserStack>,
    /// With `--wakers`: who ended whose sleeps, and those whose waker found that table full.
    pub wakers: [PerCpuHashMap<MapData, WakerKey, WakerValue>; 2],
    /// With `--chains`: what each counted sleep's waking task was doing meanwhile.
    pub chains: PerCpuHashMap<MapData, ChainKey, ChainValue>,
    /// Each CPU's last seen switch (the hidden-switch check, the hidden task's name).
    pub last_switch: PerCpuArray<MapData, CpuSwitch>,
    /// The hidden-switch log; its reader drains it (one at a time).
    hidden: Mutex<RingBuf<MapData>>,
    /// Exited tasks' records; its reader drains it (one at a time).
    exited: Mutex<RingBuf<MapData>>,
}

impl Maps {
    /// The maps taken (the rest stay in the object: the programs' own, and those other
    /// readers take for themselves).
    pub const NAMES: [&str; 18] = [
        names::MAP_COUNTERS,
        names::MAP_TICKS,
        names::MAP_TASKS,
        names::MAP_TASK_SLOTS,
        names::MAP_SLOT_TIDS,
        names::MAP_GLOBAL_LATENCY,
        names::MAP_MERGED,
        names::MAP_CGROUP_LATENCY,
        names::MAP_HISTOGRAMS,
        names::MAP_STACKS,
        names::MAP_CAUSE_PARTS,
        names::MAP_USER_STACKS,
        names::MAP_WAKERS,
        names::MAP_WAKERS_OTHER,
        names::MAP_CHAINS,
        names::MAP_LAST_SWITCH,
        names::MAP_HIDDEN,
        names::MAP_EXITED,
    ];

    /// Takes every map of `NAMES` out of `ebpf`.
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        Ok(Self {
            counters: take(ebpf, names::MAP_COUNTERS)?,
            ticks: take(ebpf, names::MAP_TICKS)?,
            tasks: take(ebpf, names::MAP_TASKS)?,
            task_slots: TaskSlots::new(
                ebpf.take_map(names::MAP_TASK_SLOTS)
                    .context("no TASK_SLOTS map in latprof's eBPF object")?,
                ebpf.take_map(names::MAP_SLOT_TIDS)
                    .context("no SLOT_TIDS map in latprof's eBPF object")?,
            )?,
            global: take(ebpf, names::MAP_GLOBAL_LATENCY)?,
            merged: take(ebpf, names::MAP_MERGED)?,
            cgroups: take(ebpf, names::MAP_CGROUP_LATENCY)?,
            histograms: take(ebpf, names::MAP_HISTOGRAMS)?,
            stacks: take(ebpf, names::MAP_STACKS)?,
            cause_parts: take(ebpf, names::MAP_CAUSE_PARTS)?,
            user_stacks: take(ebpf, names::MAP_USER_STACKS)?,
            wakers: [
                take(ebpf, names::MAP_WAKERS)?,
                take(ebpf, names::MAP_WAKERS_OTHER)?,
            ],
            chains: take(ebpf, names::MAP_CHAINS)?,
            last_switch: take(ebpf, names::MAP_LAST_SWITCH)?,
            hidden: Mutex::new(take(ebpf, names::MAP_HIDDEN)?),
            exited: Mutex::new(take(ebpf, names::MAP_EXITED)?),
        })
    }

    /// The hidden-switch log, for its one reader at a time.
    pub fn hidden(&self) -> MutexGuard<'_, RingBuf<MapData>> {
        self.hidden.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The exited tasks' log, for its one reader at a time.
    pub fn exited(&self) -> MutexGuard<'_, RingBuf<MapData>> {
        self.exited.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Map `name` out of `ebpf`, as the type its reader expects.
fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &str) -> Result<T> {
    let map = ebpf
        .take_map(name)
        .with_context(|| format!("no {name} map in latprof's eBPF object"))?;
    T::try_from(map).with_context(|| format!("{name} is not the map latprof expects"))
}

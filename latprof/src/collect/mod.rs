//! Reads the probe's maps into a [`Snapshot`]: raw cumulative numbers, nothing derived; and
//! the spike ring buffer into [`Spike`]s.
pub mod hidden;
mod maps;
mod snapshot;
pub mod spikes;
mod stacks;

pub use hidden::HiddenSleeps;
pub use maps::comm_str;
use maps::{read_hidden, read_ticks, read_wakers, task_snapshot};
pub use snapshot::{Counters, Snapshot, TaskSnapshot, TickCounts, Waker, stack_ids};
pub use spikes::{Spike, SpikeReader};

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap};
use latprof_common::{
    CgroupCause, Counter, D_STATE_SALT, GlobalRecord, HIST_BUCKETS, Histogram, RawStack, TaskState,
};

use crate::{
    cgroups::CgroupPath,
    probe::{Probe, names},
};

/// Reads snapshots; keeps the backtraces it has read (stack ids are never reused).
#[derive(Default)]
pub struct Collector {
    stacks: HashMap<u64, Vec<u64>>,
    histograms: bool,
    /// Made at the first snapshot that names a cgroup; `None` where the host mounts no
    /// cgroup2.
    cgroup_names: Option<crate::cgroups::CgroupNames>,
    /// Whether `cgroup_names` was made (or found impossible).
    cgroups_looked: bool,
    /// Record ids found to be uninterruptible sleeps' (salted: see `stack_for_state`).
    uninterruptible: std::collections::HashSet<u64>,
    /// Record ids with a user part: (kernel id, user id).
    parts: HashMap<u64, (u64, u64)>,
    /// User backtraces named so far.
    user_frames: HashMap<u64, Vec<crate::ustacks::UserFrame>>,
    /// How long a snapshot waits for user backtraces to be named (those named later show in
    /// the next one); `None`: `NAMING_WITHIN`.
    naming_patience: Option<std::time::Duration>,
    /// The check of lost and recovered sleeps against hidden switches: it drains the probe's
    /// `HIDDEN` log, so one collector reads a probe.
    hidden: hidden::Log,
    /// With `--user-stacks`: the thread that reads processes' memory maps and names frames
    /// (`watch_users`).
    watcher: Option<crate::ustacks::Watcher>,
}

/// How long a snapshot waits for user backtraces to be named, unless told to be patient.
const NAMING_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);
/// How long the last snapshot waits: what it misses is never shown, but a stop must not wait
/// on files a user's process hands root (a huge perf map, a binary that takes long to read)
/// for long, with the programs attached.
const NAMING_PATIENT: std::time::Duration = std::time::Duration::from_secs(10);

const MAX_RETRIES: u32 = 5;

impl Collector {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Also read the per-cause histograms and the programs' run-time statistics (for `top`).
    #[must_use]
    pub fn with_details() -> Self {
        Self {
            histograms: true,
            ..Self::default()
        }
    }

    /// From now on, snapshots wait for every user backtrace to be named (up to 10 s): for
    /// the last snapshot of a command, after which nothing is named any more.
    pub fn patient(&mut self) {
        self.naming_patience = Some(NAMING_PATIENT);
    }

    /// With `--user-stacks`: starts the thread that names user frames, reading the processes
    /// the probe announced since it attached (none is missed: they wait in its ring buffer).
    /// Once per probe; a collector without it shows no user frames.
    pub fn watch_users(&mut self, probe: &mut Probe) -> Result<()> {
        if let Some(ring) = probe.take_user_seen() {
            self.watcher = Some(crate::ustacks::Watcher::start(ring)?);
        }
        Ok(())
    }

    /// Drains the probe's hidden-switch log and judges what it can, between snapshots (the log
    /// holds a few thousand events: a long run on a kernel that hides much would fill it).
    pub fn drain_hidden(&self, probe: &Probe) -> Result<HiddenSleeps> {
        self.hidden.read(probe.ebpf())
    }

    /// One backtrace by id (cached): for a reader that needs a few, not a whole snapshot.
    pub fn stack(&mut self, probe: &Probe, id: u64) -> Result<Option<Vec<u64>>> {
        if let Some(frames) = self.stacks.get(&id) {
            return Ok(Some(frames.clone()));
        }
        let map: BpfHashMap<&MapData, u64, RawStack> = BpfHashMap::try_from(
            probe
                .ebpf()
                .map(names::MAP_STACKS)
                .context("no STACKS map")?,
        )?;
        // A cause with a user part (--user-stacks): the frames of its kernel part.
        if let Some((kernel, _)) = self.cause_parts(probe, id)? {
            let frames = self.kernel_frames(&map, kernel)?;
            self.stacks.insert(id, frames.clone());
            return Ok(Some(frames));
        }
        Ok(map.get(&id, 0).ok().map(|raw| {
            let frames: Vec<u64> = raw.iter().copied().take_while(|&ip| ip != 0).collect();
            self.stacks.insert(id, frames.clone());
            frames
        }))
    }

    /// The paths of the cgroups `cgroups` and `tasks` name, the file system walked again where
    /// one is new or gone.
    fn cgroup_paths(
        &mut self,
        cgroups: &[(CgroupCause, GlobalRecord)],
        tasks: &[TaskSnapshot],
    ) -> BTreeMap<u64, CgroupPath> {
        let ids: std::collections::BTreeSet<u64> = cgroups
            .iter()
            .map(|(k, _)| k.cgroup)
            .chain(
                tasks
                    .iter()
                    .flat_map(|t| t.records.iter().map(|r| r.cgroup)),
            )
            .filter(|&id| id != 0)
            .collect();
        if ids.is_empty() {
            return BTreeMap::new();
        }
        let Some(names) = self.cgroup_names() else {
            return BTreeMap::new();
        };
        names.refresh(ids.iter().copied());
        names.forget_unreferenced(&ids);
        ids.into_iter().map(|id| (id, names.place(id))).collect()
    }

    /// The cgroup names, made (with a first walk) at the first call; `None` where the host
    /// mounts no cgroup2.
    fn cgroup_names(&mut self) -> Option<&mut crate::cgroups::CgroupNames> {
        if !self.cgroups_looked {
            self.cgroups_looked = true;
            self.cgroup_names = crate::cgroups::CgroupNames::new();
        }
        self.cgroup_names.as_mut()
    }

    /// Walks the cgroup2 file system now, so that a cgroup made and removed before the next
    /// snapshot still has its path (`stats` calls it every second).
    pub fn look_at_cgroups(&mut self) {
        // Making the names walks once already.
        let made = self.cgroups_looked;
        if let Some(names) = self.cgroup_names()
            && made
        {
            names.walk();
        }
    }

    pub fn snapshot(&mut self, probe: &Probe) -> Result<Snapshot> {
        let ebpf = probe.ebpf();
        let counters_map: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(ebpf.map(names::MAP_COUNTERS).context("no COUNTERS map")?)?;
        let tasks_map: BpfHashMap<&MapData, u32, TaskState> =
            BpfHashMap::try_from(ebpf.map(names::MAP_TASKS).context("no TASKS map")?)?;
        let global_map: BpfHashMap<&MapData, u64, GlobalRecord> = BpfHashMap::try_from(
            ebpf.map(names::MAP_GLOBAL_LATENCY)
                .context("no GLOBAL_LATENCY map")?,
        )?;
        let merged_map: PerCpuHashMap<&MapData, u64, GlobalRecord> =
            PerCpuHashMap::try_from(ebpf.map(names::MAP_MERGED).context("no MERGED map")?)?;
        let cgroup_map: PerCpuHashMap<&MapData, CgroupCause, GlobalRecord> =
            PerCpuHashMap::try_from(
                ebpf.map(names::MAP_CGROUP_LATENCY)
                    .context("no CGROUP_LATENCY map")?,
            )?;

        let read_counters = || -> Result<Counters> {
            let mut c = Counters::default();
            for (i, slot) in c.0.iter_mut().enumerate() {
                let values = counters_map
                    .get(&u32::try_from(i)?, 0)
                    .context("read COUNTERS")?;
                *slot = values.iter().sum();
            }
            Ok(c)
        };

        // In lazy mode an exit moves a task's records from TASKS to GLOBAL_LATENCY; a read that
        // overlaps such a move would count it twice or not at all, so it is retried.
        let mut retries = 0;
        let (mut tasks, mut global, cgroups, counters, settled) = loop {
            let before = read_counters()?;
            let mut tasks = Vec::new();
            for item in &tasks_map {
                let (tid, state) = item.context("read TASKS")?;
                tasks.push(task_snapshot(tid, &state));
            }
            // The shared table, plus each CPU's part of lazy mode's exit merges (and, on
            // kernels without compare-and-swap, normal mode's maxima: parts with no count).
            let mut table: BTreeMap<u64, GlobalRecord> = BTreeMap::new();
            for item in &global_map {
                let (id, rec) = item.context("read GLOBAL_LATENCY")?;
                table.insert(id, rec);
            }
            for item in &merged_map {
                let (id, per_cpu) = item.context("read MERGED")?;
                for part in per_cpu.iter().filter(|r| r.count > 0 || r.max_ns > 0) {
                    table.entry(id).or_default().merge(part);
                }
            }
            let global: Vec<(u64, GlobalRecord)> = table.into_iter().collect();
            let mut by_cgroup: BTreeMap<CgroupCause, GlobalRecord> = BTreeMap::new();
            for item in &cgroup_map {
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
                break (tasks, global, cgroups, after, settled);
            }
            retries += 1;
        };

        let wakers = if probe.config().wakers {
            read_wakers(probe)?
        } else {
            Vec::new()
        };
        let stack_map: BpfHashMap<&MapData, u64, RawStack> =
            BpfHashMap::try_from(ebpf.map(names::MAP_STACKS).context("no STACKS map")?)?;
        let mut stacks = BTreeMap::new();
        let mut uninterruptible = std::collections::BTreeSet::new();
        let waker_stacks = wakers.iter().map(|w| w.key.waker_stack).filter(|&s| s != 0);
        for id in stack_ids(&global, &tasks)
            .chain(cgroups.iter().map(|(k, _)| k.stack_id))
            .chain(wakers.iter().map(|w| w.key.cause))
            .chain(waker_stacks)
        {
            if id >= latprof_common::RESERVED_STACKS || stacks.contains_key(&id) {
                continue;
            }
            let frames = if let Some(frames) = self.stacks.get(&id) {
                frames.clone()
            } else if let Some((kernel, user)) = self.cause_parts(probe, id)? {
                // A cause with a user part: the frames of its kernel part.
                let frames = self.kernel_frames(&stack_map, kernel)?;
                self.stacks.insert(id, frames.clone());
                let _ = user;
                frames
            } else {
                // An uninterruptible sleep's record id is its backtrace's id salted
                // (`stack_for_state`): the frames are under the plain one.
                let raw = match stack_map.get(&id, 0) {
                    Ok(raw) => raw,
                    Err(plain_missing) => match stack_map.get(&(id ^ D_STATE_SALT), 0) {
                        Ok(raw) => {
                            self.uninterruptible.insert(id);
                            raw
                        }
                        Err(_) => return Err(plain_missing).context("read STACKS"),
                    },
                };
                let frames: Vec<u64> = raw.iter().copied().take_while(|&ip| ip != 0).collect();
                self.stacks.insert(id, frames.clone());
                frames
            };
            if self.uninterruptible.contains(&id) {
                uninterruptible.insert(id);
            }
            stacks.insert(id, frames);
        }
        // A hash map iterated while tasks exit (their entries deleted) can return a task twice:
        // the later read of it stays.
        tasks.reverse();
        tasks.sort_by_key(|t| t.tid);
        tasks.dedup_by_key(|t| t.tid);
        global.sort_by_key(|(id, _)| *id);
        let mut histograms = BTreeMap::new();
        let mut cgroup_histograms = BTreeMap::new();
        let mut programs = Vec::new();
        if self.histograms {
            let map: PerCpuHashMap<&MapData, CgroupCause, Histogram> = PerCpuHashMap::try_from(
                ebpf.map(names::MAP_HISTOGRAMS)
                    .context("no HISTOGRAMS map")?,
            )?;
            for item in &map {
                let (key, per_cpu) = item.context("read HISTOGRAMS")?;
                let mut sum = [0u32; HIST_BUCKETS];
                for cpu in per_cpu.iter() {
                    for (acc, n) in sum.iter_mut().zip(cpu) {
                        *acc = acc.saturating_add(*n);
                    }
                }
                let by_stack: &mut Histogram =
                    histograms.entry(key.stack_id).or_insert([0; HIST_BUCKETS]);
                for (acc, n) in by_stack.iter_mut().zip(sum) {
                    *acc = acc.saturating_add(n);
                }
                cgroup_histograms.insert(key, sum);
            }
        }
        // The kernel's run-time statistics of each loaded program (zero unless turned on).
        for (name, program) in ebpf.programs() {
            if let Ok(info) = program.info() {
                let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
                programs.push((name.to_owned(), ns, info.run_count()));
            }
        }
        let cgroup_paths = self.cgroup_paths(&cgroups, &tasks);
        let (user_parts, user_stacks) = self.user_stacks(probe, &stacks)?;
        let mut counters = counters;
        if let Some(watcher) = &self.watcher {
            counters.0[Counter::UserStackTruncated as usize] = watcher.truncated();
        }
        Ok(Snapshot {
            mode: probe.config().mode,
            skip_kthreads: probe.config().pid.is_none(),
            tasks,
            global,
            cgroups,
            counters,
            stacks,
            retries,
            cgroup_paths,
            uninterruptible,
            histograms,
            cgroup_histograms,
            programs,
            ticks: read_ticks(probe)?,
            hidden_tids: read_hidden(probe)?,
            // After the counters: every lost or recovered sleep they count is in the log.
            hidden: self.hidden.read(ebpf)?,
            wakers,
            unsettled: !settled,
            user_parts,
            user_stacks,
            taken_ns: crate::time::monotonic_ns(),
            wall_ns: crate::time::wall_ns(),
        })
    }
}

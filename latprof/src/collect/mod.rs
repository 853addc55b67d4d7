//! Reads the probe's maps into a [`Snapshot`]: raw cumulative numbers, nothing derived; and
//! the spike ring buffer into [`Spike`]s.
mod chains;
mod exits;
pub mod hidden;
mod maps;
mod snapshot;
pub mod spikes;
mod stacks;
mod wakers;

pub use chains::Chain;
pub use exits::{ExitKey, Exits};
pub use hidden::HiddenSleeps;
pub use maps::comm_str;
use maps::{
    Tables, program_stats, read_counter, read_hidden, read_histograms, read_tables, read_ticks,
};
pub use snapshot::{Counters, Snapshot, TaskSnapshot, TickCounts, Waker, stack_ids};
pub use spikes::{Spike, SpikeReader};
use wakers::{read_wakers, with_pending};

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use latprof_common::{CgroupCause, Counter, GlobalRecord};

use crate::{cgroups::CgroupPath, probe::Probe};

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
    /// The exited tasks' records, summed from the probe's `EXITED` log.
    exits: Exits,
    /// With `--user-stacks`: the thread that reads processes' memory maps and names frames
    /// (`watch_users`).
    watcher: Option<crate::ustacks::Watcher>,
    /// With `--wakers`: each waker's sums at their largest so far.
    wakers_seen: wakers::Seen,
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
        // The processes the probe traces, read before it says it is attached: with
        // `--cgroup`, not the machine's others (their files took a quarter of the unwind
        // table here, which the traced processes then lacked).
        let config = probe.config();
        let traced = match (config.pid, config.cgroup_filter.as_slice()) {
            (Some(pid), _) => vec![pid],
            (None, []) => crate::ustacks::watch::running_processes(),
            (None, dirs) => {
                crate::cgroups::processes_under(dirs, crate::ustacks::watch::running_processes())
            }
        };
        if let Some((ring, tables)) = probe.take_user_seen() {
            self.watcher = Some(crate::ustacks::Watcher::start(ring, tables, traced)?);
        }
        Ok(())
    }

    /// Drains the probe's hidden-switch log and judges what it can, between snapshots (the log
    /// holds a few thousand events: a long run on a kernel that hides much would fill it).
    pub fn drain_hidden(&self, probe: &Probe) -> Result<HiddenSleeps> {
        self.hidden.read(probe.maps())
    }

    /// Drains the probe's log of exited tasks between snapshots (it holds a few hundred).
    pub fn drain_exits(&mut self, probe: &Probe) {
        self.exits.drain(probe.maps());
    }

    /// One backtrace by id (cached): for a reader that needs a few, not a whole snapshot.
    pub fn stack(&mut self, probe: &Probe, id: u64) -> Result<Option<Vec<u64>>> {
        if let Some(frames) = self.stacks.get(&id) {
            return Ok(Some(frames.clone()));
        }
        let map = &probe.maps().stacks;
        // A cause with a user part (--user-stacks): the frames of its kernel part.
        if let Some((kernel, _)) = self.cause_parts(probe, id) {
            let frames = self.kernel_frames(map, kernel)?;
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
        exited: &BTreeMap<ExitKey, GlobalRecord>,
    ) -> BTreeMap<u64, CgroupPath> {
        let ids: std::collections::BTreeSet<u64> = cgroups
            .iter()
            .map(|(k, _)| k.cgroup)
            .chain(
                tasks
                    .iter()
                    .flat_map(|t| t.records.iter().map(|r| r.cgroup)),
            )
            .chain(exited.keys().map(|k| k.cgroup))
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
        let maps = probe.maps();
        // Before the tasks: see `read_wakers`.
        let waker_table = if probe.config().wakers {
            Some(read_wakers(maps)?)
        } else {
            None
        };
        let Tables {
            mut tasks,
            mut global,
            cgroups,
            mut counters,
            pending_wakers,
            retries,
            settled,
        } = read_tables(maps)?;
        // Right after the tables: every exit they merged is in the log (a task is logged
        // before its entry goes), and those of tasks they still hold wait for the next.
        let live: std::collections::HashSet<u32> = tasks.iter().map(|t| t.tid).collect();
        self.exits.drain_holding(maps, &live);
        let exited = self.exits.snapshot();
        let wakers = waker_table.map_or_else(Vec::new, |table| {
            let read = with_pending(
                table,
                &pending_wakers,
                probe.config().max_wakers,
                &mut counters,
            );
            self.wakers_seen.keep(read)
        });
        let chains = if probe.config().chains_on() {
            chains::read_chains(maps)?
        } else {
            Vec::new()
        };
        let (stacks, uninterruptible) =
            self.stacks_of(probe, &global, &tasks, &cgroups, &wakers, &chains)?;
        // A hash map iterated while tasks exit (their entries deleted) can return a task twice:
        // the later read of it stays.
        tasks.reverse();
        tasks.sort_by_key(|t| t.tid);
        tasks.dedup_by_key(|t| t.tid);
        global.sort_by_key(|(id, _)| *id);
        let (histograms, cgroup_histograms) = if self.histograms {
            read_histograms(maps)?
        } else {
            (BTreeMap::new(), BTreeMap::new())
        };
        let programs = program_stats(probe.ebpf());
        let cgroup_paths = self.cgroup_paths(&cgroups, &tasks, &exited);
        let (user_parts, user_stacks) = self.user_stacks(probe, &stacks);
        if let Some(watcher) = &self.watcher {
            counters.0[Counter::UserStackTruncated as usize] = watcher.truncated();
            let (unparsed, perf_stopped, unwind_full) = watcher.left_out();
            counters.0[Counter::UserFilesUnparsed as usize] = unparsed;
            counters.0[Counter::PerfMapsStopped as usize] = perf_stopped;
            counters.0[Counter::UnwindRowsFull as usize] = unwind_full;
        }
        // After the counters: every lost or recovered sleep they count is in the log. The
        // check may visit idle CPUs, ending gaps open there (the only proof of a hiding the
        // counters' read may have missed): the switches hidden and who hid them are read
        // after it, so that a loss it explains is never reported with no hiding beside it.
        let hidden = self.hidden.read(maps)?;
        counters.0[Counter::SwitchesHidden as usize] = read_counter(maps, Counter::SwitchesHidden)?;
        let hidden_tids = read_hidden(maps)?;
        Ok(Snapshot {
            mode: probe.config().mode,
            skip_kthreads: probe.config().pid.is_none(),
            tasks,
            global,
            cgroups,
            exited,
            counters,
            stacks,
            retries,
            cgroup_paths,
            uninterruptible,
            histograms,
            cgroup_histograms,
            programs,
            ticks: read_ticks(maps)?,
            hidden_tids,
            hidden,
            wakers,
            chains,
            unsettled: !settled,
            user_parts,
            user_stacks,
            taken_ns: crate::time::monotonic_ns(),
            wall_ns: crate::time::wall_ns(),
        })
    }
}

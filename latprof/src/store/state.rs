//! The snapshot a reader rebuilds from a key frame and the deltas after it.

use std::collections::{BTreeMap, HashMap};

use latprof_common::{CgroupCause, GlobalRecord, Histogram, WakerKey};

use super::body::Body;
use crate::{
    cgroups::CgroupPath,
    collect::{Counters, ExitKey, Snapshot, TaskSnapshot, Waker},
    ustacks::UserFrame,
};

/// The snapshot being rebuilt from a key frame and the deltas after it.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub snap: Snapshot,
    tasks: BTreeMap<u32, TaskSnapshot>,
    global: BTreeMap<u64, GlobalRecord>,
    histograms: BTreeMap<u64, Histogram>,
    stacks: HashMap<u64, Vec<u64>>,
    cgroups: BTreeMap<CgroupCause, GlobalRecord>,
    exited: BTreeMap<ExitKey, GlobalRecord>,
    paths: BTreeMap<u64, CgroupPath>,
    wakers: BTreeMap<WakerKey, Waker>,
    chains: BTreeMap<latprof_common::ChainKey, crate::collect::Chain>,
    user_parts: HashMap<u64, u64>,
    user_stacks: HashMap<u64, Vec<UserFrame>>,
}

impl State {
    /// Applies a key frame (`key`: everything starts over) or a delta.
    pub fn apply(&mut self, body: Body, key: bool) {
        if key {
            *self = Self::default();
        }
        self.stacks.extend(body.stacks);
        self.user_parts.extend(body.user_parts);
        self.user_stacks.extend(body.user_stacks);
        for tid in body.tasks_gone {
            self.tasks.remove(&tid);
        }
        for t in body.tasks {
            self.tasks.insert(t.tid, t);
        }
        for id in body.global_gone {
            self.global.remove(&id);
        }
        self.global.extend(body.global);
        for id in body.hist_gone {
            self.histograms.remove(&id);
        }
        self.histograms.extend(body.histograms);
        for k in body.cgroup_gone {
            self.cgroups.remove(&k);
        }
        self.cgroups.extend(body.cgroups);
        for k in body.exited_gone {
            self.exited.remove(&k);
        }
        self.exited.extend(body.exited);
        for id in body.paths_gone {
            self.paths.remove(&id);
        }
        self.paths.extend(body.paths);
        for k in body.wakers_gone {
            self.wakers.remove(&k);
        }
        self.wakers
            .extend(body.wakers.into_iter().map(|w| (w.key, w)));
        for k in body.chains_gone {
            self.chains.remove(&k);
        }
        self.chains
            .extend(body.chains.into_iter().map(|c| (c.key, c)));
        let mut counters = Counters::default();
        for (slot, v) in counters.0.iter_mut().zip(body.counters) {
            *slot = v;
        }
        let tasks: Vec<TaskSnapshot> = self.tasks.values().cloned().collect();
        let global: Vec<(u64, GlobalRecord)> = self.global.iter().map(|(k, v)| (*k, *v)).collect();
        // The backtraces this snapshot names, as the collector hands them over.
        let mut stacks = BTreeMap::new();
        for id in crate::collect::stack_ids(&global, &tasks)
            .chain(self.cgroups.keys().map(|k| k.stack_id))
            .chain(self.wakers.keys().map(|k| k.cause))
            .chain(
                self.wakers
                    .keys()
                    .map(|k| k.waker_stack)
                    .filter(|&s| s != 0),
            )
            .chain(
                self.chains
                    .keys()
                    .flat_map(|k| [k.cause, k.waker_cause])
                    .filter(|&s| s != 0),
            )
        {
            if let Some(frames) = self.stacks.get(&id) {
                stacks.entry(id).or_insert_with(|| frames.clone());
            }
        }
        // Their user backtraces, as the collector hands them over.
        let user_parts: BTreeMap<u64, u64> = stacks
            .keys()
            .filter_map(|id| Some((*id, *self.user_parts.get(id)?)))
            .collect();
        // Each once: many records share one user backtrace (a copy per record took 1.3 GB
        // for a 5 KB file whose 10,000 causes share one long backtrace).
        let users: std::collections::BTreeSet<u64> = user_parts.values().copied().collect();
        let user_stacks = users
            .into_iter()
            .filter_map(|user| Some((user, self.user_stacks.get(&user)?.clone())))
            .collect();
        self.snap = Snapshot {
            mode: body.mode,
            skip_kthreads: body.skip_kthreads,
            tasks,
            global,
            cgroups: self.cgroups.iter().map(|(k, v)| (*k, *v)).collect(),
            exited: std::sync::Arc::new(self.exited.clone()),
            cgroup_paths: self.paths.clone(),
            counters,
            stacks,
            retries: body.retries,
            histograms: self.histograms.clone(),
            // Recordings keep the histograms summed over cgroups.
            cgroup_histograms: BTreeMap::new(),
            // Live only (serve's state label).
            uninterruptible: std::collections::BTreeSet::new(),
            programs: body.programs,
            taken_ns: body.taken_ns,
            wall_ns: body.wall_ns,
            ticks: body.ticks,
            // Live only: which task hid switches names it for the live warning.
            hidden_tids: Vec::new(),
            // Live only: checked while recording, said in its warnings.
            hidden: crate::collect::HiddenSleeps::default(),
            user_parts,
            user_stacks,
            wakers: self.wakers.values().cloned().collect(),
            chains: self.chains.values().cloned().collect(),
            unsettled: false,
        };
    }
}

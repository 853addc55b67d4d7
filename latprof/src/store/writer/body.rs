//! The body of the next frame, built from a snapshot: all of it for a key frame, what changed
//! since the frame before for a delta, with backtrace ids as the recording writes them.

use std::{
    collections::{HashMap, HashSet},
    hash::BuildHasher as _,
};

use latprof_common::{CgroupCause, NO_USER, RESERVED_STACKS};

use super::Writer;
use crate::{
    collect::{Snapshot, TaskSnapshot},
    store::{Body, counter_values},
    symbols::Kallsyms,
};

impl Writer {
    /// A backtrace id as the recording writes it; the reserved ids stay what they are.
    pub(super) fn public_id(&self, id: u64) -> u64 {
        if id >= RESERVED_STACKS {
            return id;
        }
        let h = self.ids.hash_one(id);
        if h >= RESERVED_STACKS { h - 4 } else { h }
    }

    /// A user backtrace id as the recording writes it; `NO_USER` stays what it is.
    fn public_user(&self, id: u64) -> u64 {
        if id == NO_USER {
            return id;
        }
        // Tagged, so that a user id equal to a kernel one does not hash to the same value.
        match self.ids.hash_one(("user", id)) {
            NO_USER => 1,
            h => h,
        }
    }

    fn public_task(&self, t: &TaskSnapshot) -> TaskSnapshot {
        let mut t = t.clone();
        for r in &mut t.records {
            r.stack_id = self.public_id(r.stack_id);
        }
        t
    }

    pub(super) fn body(&mut self, snap: &Snapshot, syms: &Kallsyms, key: bool) -> Body {
        if key {
            self.tasks.clear();
            self.global.clear();
            self.histograms.clear();
            self.cgroups.clear();
            self.exited.clear();
            self.paths.clear();
            self.wakers.clear();
            self.chains.clear();
            self.stacks_written.clear();
            self.syms_written.clear();
            self.user_parts_written.clear();
            self.user_stacks_written.clear();
        }
        let mut body = Body {
            taken_ns: snap.taken_ns,
            wall_ns: snap.wall_ns,
            mode: snap.mode,
            skip_kthreads: snap.skip_kthreads,
            retries: snap.retries,
            counters: counter_values(&snap.counters),
            programs: snap.programs.clone(),
            ticks: snap.ticks.clone(),
            ..Body::default()
        };
        for (id, frames) in &snap.stacks {
            if self.stacks_written.insert(*id) {
                for ip in frames {
                    if let Some((addr, name)) = syms.entry(*ip)
                        && self.syms_written.insert(addr)
                    {
                        body.syms.push((syms.public_addr(addr), name.to_owned()));
                    }
                }
                body.stacks.push((
                    self.public_id(*id),
                    frames.iter().map(|ip| syms.public_addr(*ip)).collect(),
                ));
            }
        }
        for (id, user) in &snap.user_parts {
            if self.user_parts_written.insert(*id) {
                body.user_parts
                    .push((self.public_id(*id), self.public_user(*user)));
            }
        }
        // A backtrace not named yet is written once it is (a later snapshot has it).
        for (user, frames) in &snap.user_stacks {
            if self.user_stacks_written.insert(*user) {
                body.user_stacks
                    .push((self.public_user(*user), frames.clone()));
            }
        }
        let mut seen = HashSet::with_capacity(snap.tasks.len());
        for t in &snap.tasks {
            seen.insert(t.tid);
            let t = self.public_task(t);
            if self.tasks.get(&t.tid) != Some(&t) {
                body.tasks.push(t.clone());
                self.tasks.insert(t.tid, t);
            }
        }
        self.tasks.retain(|tid, _| {
            let keep = seen.contains(tid);
            if !keep {
                body.tasks_gone.push(*tid);
            }
            keep
        });
        body.tasks_gone.sort_unstable();
        let global: Vec<_> = snap
            .global
            .iter()
            .map(|(id, r)| (self.public_id(*id), *r))
            .collect();
        let (gone, changed) = diff(&mut self.global, global.into_iter());
        body.global_gone = gone;
        body.global = changed;
        let histograms: Vec<_> = snap
            .histograms
            .iter()
            .map(|(id, h)| (self.public_id(*id), *h))
            .collect();
        let (gone, changed) = diff(&mut self.histograms, histograms.into_iter());
        body.hist_gone = gone;
        body.histograms = changed;
        self.exited_and_cgroups(snap, &mut body);
        let paths = snap.cgroup_paths.iter().map(|(id, p)| (*id, p.clone()));
        let (gone, changed) = diff(&mut self.paths, paths);
        body.paths_gone = gone;
        body.paths = changed;
        let wakers: Vec<_> = snap
            .wakers
            .iter()
            .map(|w| {
                let mut w = w.clone();
                w.key.cause = self.public_id(w.key.cause);
                if w.key.waker_stack != 0 {
                    w.key.waker_stack = self.public_id(w.key.waker_stack);
                }
                (w.key, w)
            })
            .collect();
        let (gone, changed) = diff(&mut self.wakers, wakers.into_iter());
        body.wakers_gone = gone;
        body.wakers = changed.into_iter().map(|(_, w)| w).collect();
        self.chains_body(snap, &mut body);
        body
    }

    /// The per-cgroup table's and the exited tasks' changes.
    fn exited_and_cgroups(&mut self, snap: &Snapshot, body: &mut Body) {
        let cgroups: Vec<_> = snap
            .cgroups
            .iter()
            .map(|(k, r)| {
                let key = CgroupCause {
                    cgroup: k.cgroup,
                    stack_id: self.public_id(k.stack_id),
                };
                (key, *r)
            })
            .collect();
        let (gone, changed) = diff(&mut self.cgroups, cgroups.into_iter());
        body.cgroup_gone = gone;
        body.cgroups = changed;
        let exited: Vec<_> = snap
            .exited
            .iter()
            .map(|(k, r)| {
                let mut key = *k;
                key.stack_id = self.public_id(k.stack_id);
                (key, *r)
            })
            .collect();
        let (gone, changed) = diff(&mut self.exited, exited.into_iter());
        body.exited_gone = gone;
        body.exited = changed;
    }
}

/// Updates `prev` to `now`; returns the keys gone and the entries new or changed.
pub(super) fn diff<K: Copy + Eq + Ord + std::hash::Hash, V: Clone + PartialEq>(
    prev: &mut HashMap<K, V>,
    now: impl Iterator<Item = (K, V)>,
) -> (Vec<K>, Vec<(K, V)>) {
    let mut changed = Vec::new();
    let mut seen = HashSet::new();
    for (k, v) in now {
        seen.insert(k);
        if prev.get(&k) != Some(&v) {
            prev.insert(k, v.clone());
            changed.push((k, v));
        }
    }
    let mut gone = Vec::new();
    prev.retain(|k, _| {
        let keep = seen.contains(k);
        if !keep {
            gone.push(*k);
        }
        keep
    });
    gone.sort_unstable();
    changed.sort_unstable_by_key(|(k, _)| *k);
    (gone, changed)
}

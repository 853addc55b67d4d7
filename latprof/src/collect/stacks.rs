//! A record's backtraces: its kernel frames (read once: stack ids are never reused) and, with
//! `--user-stacks`, its user part, named by the watcher.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use latprof_common::{CgroupCause, D_STATE_SALT, GlobalRecord, RawStack};

use super::{Collector, NAMING_WITHIN, TaskSnapshot, Waker, stack_ids};
use crate::probe::Probe;

/// Each backtrace's frames, by id.
type Frames = BTreeMap<u64, Vec<u64>>;

impl Collector {
    /// The (kernel, user) parts of record id `id` where it has a user backtrace
    /// (`--user-stacks`); an uninterruptible sleep's id is salted (`stack_for_state`).
    pub(super) fn cause_parts(&mut self, probe: &Probe, id: u64) -> Option<(u64, u64)> {
        if !probe.config().user_stacks {
            return None;
        }
        if let Some(parts) = self.parts.get(&id) {
            return Some(*parts);
        }
        let map = &probe.maps().cause_parts;
        let found = if let Ok(p) = map.get(&id, 0) {
            Some(p)
        } else if let Ok(p) = map.get(&(id ^ D_STATE_SALT), 0) {
            self.uninterruptible.insert(id);
            Some(p)
        } else {
            None
        };
        found.map(|p| {
            self.parts.insert(id, (p.kernel, p.user));
            (p.kernel, p.user)
        })
    }

    /// The named user frames of record id `id` (a spike's), where it has a user part
    /// (`--user-stacks`).
    pub fn user_of(
        &mut self,
        probe: &Probe,
        id: u64,
    ) -> Result<Option<Vec<crate::ustacks::UserFrame>>> {
        let Some((_, user)) = self.cause_parts(probe, id) else {
            return Ok(None);
        };
        if let Some(frames) = self.user_frames.get(&user) {
            return Ok(Some(frames.clone()));
        }
        let Some(watcher) = &self.watcher else {
            return Ok(None);
        };
        let map = &probe.maps().user_stacks;
        let Ok(raw) = map.get(&user, 0) else {
            return Ok(None);
        };
        let unnamed = crate::ustacks::watch::Unnamed::of(user, &raw);
        let within = self.naming_patience.unwrap_or(NAMING_WITHIN);
        for (user, frames) in watcher.name(vec![unnamed], within) {
            self.user_frames.insert(user, frames);
        }
        Ok(self.user_frames.get(&user).cloned())
    }

    /// The frames of kernel backtrace `id` (cached).
    pub(super) fn kernel_frames(
        &mut self,
        map: &BpfHashMap<MapData, u64, RawStack>,
        id: u64,
    ) -> Result<Vec<u64>> {
        if let Some(frames) = self.stacks.get(&id) {
            return Ok(frames.clone());
        }
        let raw = map.get(&id, 0).context("read STACKS")?;
        let frames: Vec<u64> = raw.iter().copied().take_while(|&ip| ip != 0).collect();
        self.stacks.insert(id, frames.clone());
        Ok(frames)
    }

    /// The user parts of the record ids in `stacks`, and their user backtraces named (those
    /// not named before are read from `USER_STACKS` and named by the watcher thread).
    #[allow(clippy::type_complexity)]
    pub(super) fn user_stacks(
        &mut self,
        probe: &Probe,
        stacks: &BTreeMap<u64, Vec<u64>>,
    ) -> (
        BTreeMap<u64, u64>,
        BTreeMap<u64, Vec<crate::ustacks::UserFrame>>,
    ) {
        let mut parts = BTreeMap::new();
        let mut named = BTreeMap::new();
        let Some(watcher) = &self.watcher else {
            return (parts, named);
        };
        for id in stacks.keys() {
            if let Some(&(_, user)) = self.parts.get(id) {
                parts.insert(*id, user);
            }
        }
        let map = &probe.maps().user_stacks;
        let mut unnamed: Vec<crate::ustacks::watch::Unnamed> = Vec::new();
        for &user in parts.values() {
            if self.user_frames.contains_key(&user) || unnamed.iter().any(|u| u.id == user) {
                continue;
            }
            if let Ok(raw) = map.get(&user, 0) {
                unnamed.push(crate::ustacks::watch::Unnamed::of(user, &raw));
            }
        }
        for (user, frames) in watcher.name(unnamed, self.naming_patience.unwrap_or(NAMING_WITHIN)) {
            self.user_frames.insert(user, frames);
        }
        for &user in parts.values() {
            if let Some(frames) = self.user_frames.get(&user) {
                named.insert(user, frames.clone());
            }
        }
        (parts, named)
    }

    /// The frames of every backtrace the records, the cgroups' table, the wakers and the chains
    /// name (read
    /// once: stack ids are never reused), and which record ids are uninterruptible sleeps'.
    pub(super) fn stacks_of(
        &mut self,
        probe: &Probe,
        global: &[(u64, GlobalRecord)],
        tasks: &[TaskSnapshot],
        cgroups: &[(CgroupCause, GlobalRecord)],
        wakers: &[Waker],
        chains: &[super::Chain],
    ) -> Result<(Frames, BTreeSet<u64>)> {
        let stack_map = &probe.maps().stacks;
        let mut stacks = BTreeMap::new();
        let mut uninterruptible = BTreeSet::new();
        let waker_stacks = wakers.iter().map(|w| w.key.waker_stack).filter(|&s| s != 0);
        for id in stack_ids(global, tasks)
            .chain(cgroups.iter().map(|(k, _)| k.stack_id))
            .chain(wakers.iter().map(|w| w.key.cause))
            .chain(waker_stacks)
            .chain(chains.iter().flat_map(|c| [c.key.cause, c.key.waker_cause]))
        {
            if id == 0 {
                // A chain row's waker cause where the waker's sleep was not counted.
                continue;
            }
            if id >= latprof_common::RESERVED_STACKS || stacks.contains_key(&id) {
                continue;
            }
            let frames = if let Some(frames) = self.stacks.get(&id) {
                frames.clone()
            } else if let Some((kernel, user)) = self.cause_parts(probe, id) {
                // A cause with a user part: the frames of its kernel part.
                let frames = self.kernel_frames(stack_map, kernel)?;
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
        Ok((stacks, uninterruptible))
    }
}

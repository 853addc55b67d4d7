//! Removed cgroups' series, freed. `serve` gives at most `--max-cgroups` cgroups a series of
//! their own, each for as long as it is there; a cgroup that was removed would otherwise keep
//! its place for the whole run, and 30 short-lived scopes (any user's `systemd-run --user
//! --scope`) would push every later container into `other` until a restart. A removed cgroup
//! whose numbers have not moved for a grace period (`GRACE`: the scrapes of a few minutes see
//! its last values) is retired: its series goes, its place is free, and its rows in the kernel's
//! table are not taken in again. Cgroups that share a series (one name) go together, once all of
//! them are removed and quiet, so that no counter goes back; those folded into `other` keep
//! their part of it there.

use std::collections::{HashMap, HashSet};

/// How long a removed cgroup's numbers stay unchanged before its series is freed.
pub const GRACE: std::time::Duration = std::time::Duration::from_secs(120);

/// One cgroup of a series as a read sees it: its id, whether it was removed, its numbers.
pub type Member = (u64, bool, (u64, u64));

/// The removed cgroups watched, and those retired.
#[derive(Debug)]
pub struct Retire {
    /// Reads a removed cgroup's numbers must stay as they are.
    grace_reads: usize,
    /// Per removed cgroup: its numbers when last changed, and the reads since.
    quiet: HashMap<u64, ((u64, u64), usize)>,
    /// Ids retired: their rows are left out of every later read.
    retired: HashSet<u64>,
}

impl Retire {
    /// Retires after `GRACE` at one read every `interval`.
    #[must_use]
    pub fn new(interval: std::time::Duration) -> Self {
        let reads = GRACE.as_nanos().div_ceil(interval.as_nanos().max(1));
        Self {
            grace_reads: usize::try_from(reads).unwrap_or(usize::MAX).max(2),
            quiet: HashMap::new(),
            retired: HashSet::new(),
        }
    }

    /// Whether `id`'s series was freed (its rows are to be left out).
    #[must_use]
    pub fn is_retired(&self, id: u64) -> bool {
        self.retired.contains(&id)
    }

    /// One read: `groups` are the series (each a list of (id, removed, totals)); returns the
    /// series whose cgroups are all removed and have been quiet for the grace period, by
    /// index, and marks their ids retired. `present` are the ids the kernel's table still
    /// holds: a retired id gone from it is forgotten.
    pub fn read(&mut self, groups: &[Vec<Member>], present: &HashSet<u64>) -> Vec<usize> {
        self.retired.retain(|id| present.contains(id));
        let mut watched = HashSet::new();
        let mut out = Vec::new();
        for (i, group) in groups.iter().enumerate() {
            let mut all_quiet = !group.is_empty();
            for &(id, removed, totals) in group {
                if !removed {
                    all_quiet = false;
                    continue;
                }
                watched.insert(id);
                // Reads since its numbers last moved (0 at the read that first saw it removed).
                let reads = match self.quiet.get_mut(&id) {
                    Some(entry) if entry.0 == totals => {
                        entry.1 += 1;
                        entry.1
                    }
                    _ => {
                        self.quiet.insert(id, (totals, 0));
                        0
                    }
                };
                all_quiet &= reads >= self.grace_reads;
            }
            if all_quiet {
                out.push(i);
                for &(id, _, _) in group {
                    watched.remove(&id);
                    self.retired.insert(id);
                }
            }
        }
        self.quiet.retain(|id, _| watched.contains(id));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_quiet_cgroup_is_retired_after_the_grace_period() {
        let mut r = Retire::new(GRACE / 3);
        let present: HashSet<u64> = [1, 2, 3].into();
        let groups = |moved: u64| {
            vec![
                vec![(1, true, (5, 50))],
                // Removed, but its numbers still move.
                vec![(2, true, (moved, moved))],
                // One of the series' cgroups lives: the series stays.
                vec![(3, true, (1, 1)), (4, false, (1, 1))],
            ]
        };
        for read in 0..3 {
            assert!(r.read(&groups(read), &present).is_empty(), "read {read}");
        }
        assert_eq!(r.read(&groups(3), &present), vec![0]);
        assert!(r.is_retired(1) && !r.is_retired(2) && !r.is_retired(3));
        // Gone from the kernel's table: forgotten.
        r.read(&[], &[2, 3].into());
        assert!(!r.is_retired(1));
    }
}

//! What the perf maps kept may hold. Any user writes its processes' `perf-PID.map`, so one user
//! could fill a single budget for everyone (a later JIT left unnamed, silently). Each user has
//! a share of its own, the users but root together a second bound, and root's processes a
//! share of their own (they keep room whatever the others do), and a map's bytes are charged while the map is kept: a user
//! whose share is spent gets it back from its processes that are gone
//! (`Processes::reclaim_perf`), and all of it once latprof drops them.

use std::collections::HashMap;

/// The most the maps of one user's processes hold together.
pub const MAX_PER_USER: u64 = 32 << 20;
/// The most the maps of all users but root hold together.
pub const MAX_USERS: u64 = 96 << 20;
/// The most root's processes' maps hold together (containers without a user namespace run
/// as root: many JITs).
pub const MAX_ROOT: u64 = 64 << 20;

/// Bytes the kept maps hold, per user.
#[derive(Debug, Default)]
pub struct PerfBudget {
    by_user: HashMap<u32, u64>,
    /// All users' but root's.
    users: u64,
}

impl PerfBudget {
    /// Bytes `uid`'s maps may still add.
    #[must_use]
    pub fn left(&self, uid: u32) -> u64 {
        let held = self.by_user.get(&uid).copied().unwrap_or(0);
        if uid == 0 {
            MAX_ROOT.saturating_sub(held)
        } else {
            MAX_PER_USER
                .saturating_sub(held)
                .min(MAX_USERS.saturating_sub(self.users))
        }
    }

    /// One of `uid`'s maps went from holding `before` bytes to `after`.
    pub fn moved(&mut self, uid: u32, before: u64, after: u64) {
        let held = self.by_user.entry(uid).or_default();
        *held = held.saturating_sub(before).saturating_add(after);
        if *held == 0 {
            self.by_user.remove(&uid);
        }
        if uid != 0 {
            self.users = self.users.saturating_sub(before).saturating_add(after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_spends_its_share_only_and_root_keeps_its_own() {
        let mut b = PerfBudget::default();
        b.moved(65534, 0, MAX_PER_USER);
        assert_eq!(b.left(65534), 0);
        assert_eq!(b.left(1000), MAX_PER_USER);
        for uid in 1000..1002 {
            b.moved(uid, 0, MAX_PER_USER);
        }
        // The users' bound reached: another user waits, root does not.
        assert_eq!(b.left(1002), 0);
        assert_eq!(b.left(0), MAX_ROOT);
        // A map dropped gives its bytes back.
        b.moved(65534, MAX_PER_USER, 0);
        assert_eq!(b.left(1002), MAX_PER_USER);
        assert_eq!(b.left(65534), MAX_PER_USER);
    }
}

//! Wait chains (`--chains`): what the waker of a counted sleep was doing while the sleep
//! lasted, one level per wakeup, kept per (sleeper cause, waker cause). User space joins the
//! levels into chains (a waker cause's own rows are the level below it).

use core::mem::size_of;

/// `ChainKey::link`: none of the waker's recent sleeps (`RECENT_SLEEPS`) overlapped the
/// wakee's wait: it was running, or waiting for a CPU, the whole wait.
pub const CHAIN_RAN: u32 = 0;

/// The waker's recent sleeps overlapped the wakee's wait, the one that overlapped most a
/// counted sleep whose record id is `ChainKey::waker_cause`.
pub const CHAIN_SLEPT: u32 = 1;

/// The waker's recent sleeps overlapped the wakee's wait, the one that overlapped most not
/// counted (an interruptible sleep over the cutoff), so it has no backtrace.
pub const CHAIN_UNCOUNTED: u32 = 2;

/// A `CHAIN_*` link as exports write it.
#[must_use]
pub fn chain_link_name(link: u32) -> &'static str {
    match link {
        CHAIN_SLEPT => "slept",
        CHAIN_UNCOUNTED => "slept_uncounted",
        _ => "ran",
    }
}

/// Key of the chain table (`CHAINS`): the sleeps of one cause of one process woken by one
/// process's task, by what that waker's recent sleeps were.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainKey {
    /// The wakee's sleep's record id (as `WakerKey::cause`).
    pub cause: u64,
    /// The record id of the waker's sleep that overlapped most (`CHAIN_SLEPT`; 0 otherwise).
    pub waker_cause: u64,
    /// The sleeping process.
    pub sleeper_tgid: u32,
    /// The waking process (its task woke the sleeper in task context).
    pub waker_tgid: u32,
    /// `CHAIN_*`.
    pub link: u32,
    pub pad: u32,
}
const _: () = assert!(size_of::<ChainKey>() == 32);

/// Value of the chain table: the sleeps, their time, and how much of it the waker spent in
/// its sleep and in the run queue after it. The rest the waker ran (or waited for a CPU
/// later: preempted).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainValue {
    pub count: u64,
    /// The sleeps' time.
    pub total_ns: u64,
    /// Of it, the time the waker's recent sleeps overlapped (counted under `waker_cause`).
    pub behind_ns: u64,
    /// Of it, the time the waker waited for a CPU right after its most recent sleep.
    pub runq_ns: u64,
    /// The waking task's name when first seen.
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<ChainValue>() == 48);

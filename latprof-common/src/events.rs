//! Cgroups: their names as people know them, their rows, a row's histogram in one cgroup.

use core::mem::size_of;

use crate::{SLEEP_INTERRUPTIBLE, SLEEP_UNINTERRUPTIBLE};

/// Each CPU's last `sched_switch` as latprof saw it, to find the switches it did not see.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSwitch {
    /// The task the last seen switch put on this CPU (its `task_struct` address; 0: none yet).
    pub last_in: u64,
    /// When that switch was (bpf_ktime_get_ns), written after any `HiddenEvent` it sent: a
    /// reader that sees it past a time has every gap this CPU had up to then in the log.
    pub last_ns: u64,
    /// The tid of the last task during whose time on this CPU switches went unseen.
    pub hidden_tid: u32,
    /// Explicit padding to 8-byte alignment.
    pub reserved: u32,
    /// That task's name when the gap was found (it may have exited by the time user space
    /// reads this).
    pub hidden_comm: [u8; 16],
}
const _: () = assert!(size_of::<CpuSwitch>() == 40);

/// `HiddenEvent::kind`: switches went unseen on `cpu` from `start_ns` (its last seen switch)
/// to `end_ns` (the switch that found it); `tid` is the task it ran then.
pub const HIDDEN_GAP: u32 = 1;

/// `--debug-hide-wakeups` dropped a wakeup on `cpu` at `start_ns` (= `end_ns`): a gap made on
/// purpose, of no length.
pub const HIDDEN_GAP_DEBUG: u32 = 2;

/// `tid`'s sleep from `start_ns` was found still open at `end_ns`, and lost.
pub const HIDDEN_SLEEP_LOST: u32 = 3;

/// The same, recovered: woken at `woken_ns`.
pub const HIDDEN_SLEEP_RECOVERED: u32 = 4;

/// `tid`'s sleep from `start_ns` to `end_ns` (its seen wakeup) was counted, but no waking of
/// it was seen (`--wakers`: its waker is "unseen").
pub const HIDDEN_WAKER_UNSEEN: u32 = 5;

/// The same for the task's first traced sleep (`TASK_FLAG_FIRST_SLEEP`): its waking may have
/// raced the making of its entry, not something the kernel hid.
pub const HIDDEN_WAKER_RACED: u32 = 6;

/// `tid`'s sleep from `start_ns` to `end_ns` was shorter than `MIN_SLEEP_NS` and not counted
/// (like latencytop): logged so that each process is told what its numbers leave out.
pub const HIDDEN_SLEEP_SHORT: u32 = 7;

/// What the kernel hid and what that cost, sent through the `HIDDEN` ring buffer so that user
/// space can check that each sleep lost or recovered overlapped a gap it saw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HiddenEvent {
    /// `HIDDEN_*`.
    pub kind: u32,
    pub cpu: u32,
    pub tid: u32,
    /// The sleeper's process (lost and recovered sleeps; 0 for gaps): each process's own
    /// losses are told apart.
    pub tgid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// A recovered sleep's wakeup; 0 otherwise.
    pub woken_ns: u64,
}
const _: () = assert!(size_of::<HiddenEvent>() == 40);

/// What a spike was.
pub const SPIKE_SLEEP_INTERRUPTIBLE: u32 = SLEEP_INTERRUPTIBLE;

pub const SPIKE_SLEEP_UNINTERRUPTIBLE: u32 = SLEEP_UNINTERRUPTIBLE;

pub const SPIKE_RUNQ: u32 = 3;

/// Ring buffer wakeup policies (`--wakeup`).
pub const WAKEUP_ADAPTIVE: u32 = 0;

pub const WAKEUP_ALWAYS: u32 = 1;

/// One sleep or run-queue wait over `--spike`, sent to user space through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpikeEvent {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) when it ended.
    pub end_ns: u64,
    pub duration_ns: u64,
    /// Backtrace of the sleep (`RUNQ_STACK` for a run-queue wait, `NO_STACK` if none).
    pub stack_id: u64,
    pub tid: u32,
    pub tgid: u32,
    /// CPU where it ended (the waker's for a sleep, the task's for a run-queue wait).
    pub cpu: u32,
    /// `SPIKE_*`.
    pub kind: u32,
    pub comm: [u8; 16],
    /// Who ended it (a sleep's waker; `WAKER_UNSEEN` for a run-queue wait): `WAKER_*`, and
    /// the waking task's ids and name for `WAKER_TASK`.
    pub waker_kind: u32,
    pub waker_tgid: u32,
    pub waker_tid: u32,
    /// Explicit padding to 8-byte alignment.
    pub reserved: u32,
    pub waker_comm: [u8; 16],
}
const _: () = assert!(size_of::<SpikeEvent>() == 88);

//! Every type that crosses latprof's kernel/user boundary, and nothing else.
//!
//! Layouts are `#[repr(C)]` without implicit padding and checked by size assertions, so the eBPF
//! programs and the user-space reader can never disagree on a field offset.
#![no_std]

use core::mem::size_of;

/// Causes kept per task, as latencytop's `LT_SAVECOUNT`. A task with more distinct causes sends
/// the overflow straight to the global table (counted in [`Counter::TaskRecordsFull`]).
pub const TASK_RECORDS: usize = 32;

/// Stack id used when the kernel could not store a backtrace (stack map full or a collision).
pub const NO_STACK: u32 = u32::MAX;

/// `Global` value of `MODE`: per-task state only, merged into the global table at exit.
pub const MODE_LAZY: u32 = 0;
/// `Global` value of `MODE`: every accounted sleep also updates the global table.
pub const MODE_NORMAL: u32 = 1;

/// `TaskState::sleep_kind`: not sleeping (or the sleep is not being tracked).
pub const SLEEP_NONE: u32 = 0;
/// `TaskState::sleep_kind`: interruptible sleep (S).
pub const SLEEP_INTERRUPTIBLE: u32 = 1;
/// `TaskState::sleep_kind`: uninterruptible sleep (D, or the idle state I).
pub const SLEEP_UNINTERRUPTIBLE: u32 = 2;

/// `TaskState::flags`: the task had no mm when first seen (a kernel thread). latencytop keeps
/// those out of the global table; so does latprof.
pub const TASK_FLAG_KTHREAD: u32 = 1;

/// One cause: a backtrace with count, total and maximum.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyRecord {
    pub stack_id: u32,
    pub _pad: u32,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}
const _: () = assert!(size_of::<LatencyRecord>() == 32);

/// Value of the global table, keyed by stack id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalRecord {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}
const _: () = assert!(size_of::<GlobalRecord>() == 24);

/// Everything latprof keeps for one task (keyed by tid): the sleep in progress and its causes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskState {
    pub sleep_start_ns: u64,
    pub sleep_stack: u32,
    pub sleep_kind: u32,
    pub tgid: u32,
    pub flags: u32,
    pub comm: [u8; 16],
    pub nr_records: u32,
    pub _pad: u32,
    pub records: [LatencyRecord; TASK_RECORDS],
}
const _: () = assert!(size_of::<TaskState>() == 48 + 32 * TASK_RECORDS);

/// Per-CPU counters of the pipeline, indexes into the `COUNTERS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Switch-outs in S or D state that latprof started tracking.
    SleepsTracked = 0,
    /// Wakeups that ended a tracked sleep.
    Wakeups,
    /// Sleeps accounted into a record.
    Counted,
    /// Interruptible sleeps longer than the cutoff (not counted, like latencytop).
    SkippedCutoff,
    /// Sleeps shorter than one microsecond (not counted, like latencytop).
    SkippedZero,
    /// Backtraces the kernel could not store (stack map full or hash collision); the sleep is
    /// counted under "stack unavailable".
    StackMissing,
    /// Sleeps not tracked because the task table was full (lost: raise `--max-tasks`).
    TaskTableFull,
    /// Causes beyond `TASK_RECORDS` for one task, sent straight to the global table.
    TaskRecordsFull,
    /// Records lost because the global table was full (raise `--max-records`).
    GlobalTableFull,
    /// Tasks whose records were merged into the global table at exit (lazy mode).
    ExitMerges,
    /// Sleeps of tasks already exiting when first seen (not tracked).
    ExitingSkipped,
    /// Exit merges begun; with `MergesDone`, lets the reader see a merge in flight.
    MergesBegun,
    /// Exit merges finished.
    MergesDone,
}

/// Number of entries in the `COUNTERS` array.
pub const COUNTER_COUNT: u32 = Counter::MergesDone as u32 + 1;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all three are repr(C), Copy, built only of integers, with no implicit padding
    // (checked by the size assertions above).
    unsafe impl aya::Pod for super::LatencyRecord {}
    unsafe impl aya::Pod for super::GlobalRecord {}
    unsafe impl aya::Pod for super::TaskState {}
}

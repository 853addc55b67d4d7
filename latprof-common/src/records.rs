//! Sleeps and their records: the kinds and verdicts, the histogram, the task's entry, the
//! records of a task, the global table and the per-cgroup table.

use core::mem::size_of;

use crate::{StackCache, WakerKey, WakerValue};

/// Causes kept per task, as latencytop's `LT_SAVECOUNT`. A task with more distinct causes sends
/// the overflow straight to the global table (counted in [`crate::Counter::TaskRecordsFull`]).
pub const TASK_RECORDS: usize = 32;

/// `TaskState::sleep_flags` bit: the sleep began without a memory map (an exiting task after
/// exit_mm), so it stays out of the global table if recovered.
pub const SLEEP_NO_MM: u32 = 1;

/// Log2 buckets of a cause's latency histogram: bucket `i` holds latencies of `2^i` to
/// `2^(i+1)` microseconds (bucket 0 also holds those under 1 µs).
pub const HIST_BUCKETS: usize = 32;

/// A per-CPU latency histogram of one cause.
pub type Histogram = [u32; HIST_BUCKETS];

/// The histogram bucket of a latency.
#[inline(always)]
#[must_use]
pub fn hist_bucket(ns: u64) -> usize {
    let mut v = ns / 1000;
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    if r >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        r
    }
}

/// `Global` value of `MODE`: per-task state only, merged into the global table at exit.
pub const MODE_LAZY: u32 = 0;

/// `Global` value of `MODE`: every accounted sleep also updates the global table.
pub const MODE_NORMAL: u32 = 1;

/// `DEBUG_SKIP`'s parts (the benchmark's breakdown, `--debug-skip`): a counted sleep's
/// backtrace (its cause is then "unavailable").
pub const SKIP_STACK: u32 = 1;
/// Accounting: records, histograms and tables (sleeps and run-queue waits are timed, not kept).
pub const SKIP_ACCOUNT: u32 = 1 << 1;
/// The pipeline and tick counters.
pub const SKIP_COUNTERS: u32 = 1 << 2;
/// `sched_switch`'s check for switches the kernel ran no program for.
pub const SKIP_SWITCH_CHECK: u32 = 1 << 3;
/// The read of a sleeper's memory map (latencytop's rule for the global table).
pub const SKIP_MM: u32 = 1 << 4;

/// `TaskState::sleep_kind`: not sleeping (or the sleep is not being tracked).
pub const SLEEP_NONE: u32 = 0;

/// `TaskState::sleep_kind`: interruptible sleep (S).
pub const SLEEP_INTERRUPTIBLE: u32 = 1;

/// `TaskState::sleep_kind`: uninterruptible sleep (D, or the idle state I).
pub const SLEEP_UNINTERRUPTIBLE: u32 = 2;

/// `TaskState::flags`: the task had no mm when first seen (a kernel thread). latencytop keeps
/// those out of the global table; so does latprof.
pub const TASK_FLAG_KTHREAD: u32 = 1;

/// `TaskState::flags`: the task was already exiting when first seen. Its entry may be made
/// after `sched_process_exit` removed the last one (a sleep in `exit_files`' task work), so
/// `sched_process_free` removes it when the task is freed.
pub const TASK_FLAG_EXITING: u32 = 2;

/// `TaskState::flags`: the entry was made at this sleep's start, the task's first that latprof
/// traced. Its waking may have come before the entry existed (the waker ran `sched_waking`
/// while the task was still switching out), so its waker is unknown for a reason of its own.
/// Cleared at the wakeup (`--wakers`).
pub const TASK_FLAG_FIRST_SLEEP: u32 = 4;

/// `TaskState::flags`: set at the wakeup that ended the first sleep with no waking seen, for
/// the waker accounting of that sleep (`--wakers`); cleared at the next wakeup.
pub const TASK_FLAG_WAKING_RACED: u32 = 8;

/// What happens to a finished sleep. One definition for the eBPF programs and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SleepVerdict {
    Count,
    /// Shorter than the minimum (latencytop drops zero-microsecond sleeps).
    TooShort,
    /// An interruptible sleep longer than the cutoff (usually a wait the program asked for).
    OverCutoff,
}

/// latencytop's filter: drop sleeps under `min_ns`, and interruptible sleeps over `cutoff_ns`.
#[inline(always)]
#[must_use]
pub fn sleep_verdict(kind: u32, delta_ns: u64, min_ns: u64, cutoff_ns: u64) -> SleepVerdict {
    if delta_ns < min_ns {
        SleepVerdict::TooShort
    } else if kind == SLEEP_INTERRUPTIBLE && delta_ns > cutoff_ns {
        SleepVerdict::OverCutoff
    } else {
        SleepVerdict::Count
    }
}

/// The kind of sleep a switch-out starts, from the raw task state the scheduler saw, as
/// latencytop decides at dequeue: TASK_INTERRUPTIBLE is a sleep (S), TASK_UNINTERRUPTIBLE a block
/// (D; TASK_IDLE and TASK_KILLABLE include it). A preempted task does not sleep, whatever its
/// state.
///
/// TASK_WAKING: where the state is read from the task at the switch (kernels whose
/// sched_switch has no prev_state), a wakeup on another CPU may already have replaced the sleep
/// state once the scheduler dequeued the task (Linux 5.8 to 5.17; 5.18 added prev_state for
/// this). The task did go to sleep, as latencytop counts it; which kind is lost, and the sleep
/// ends at once, far under the cutoff: counted as a block, which the cutoff never drops.
#[inline(always)]
#[must_use]
pub fn sleep_kind(preempt: bool, state: u64) -> u32 {
    const TASK_INTERRUPTIBLE: u64 = 0x1;
    const TASK_UNINTERRUPTIBLE: u64 = 0x2;
    const TASK_WAKING: u64 = 0x200;
    if preempt {
        SLEEP_NONE
    } else if state & TASK_INTERRUPTIBLE != 0 {
        SLEEP_INTERRUPTIBLE
    } else if state & (TASK_UNINTERRUPTIBLE | TASK_WAKING) != 0 {
        SLEEP_UNINTERRUPTIBLE
    } else {
        SLEEP_NONE
    }
}

/// One cause: a backtrace with count, total and maximum, in one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyRecord {
    pub stack_id: u64,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The sleeper's cgroup v2 id when its sleeps began (0: cgroups not tracked). A task that
    /// moves to another cgroup starts new records there.
    pub cgroup: u64,
}
const _: () = assert!(size_of::<LatencyRecord>() == 40);

/// Key of the per-cgroup tables (`CGROUP_LATENCY`, `HISTOGRAMS`): a cause in a cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CgroupCause {
    /// cgroup v2 id (the inode number of its directory); 0: cgroups not tracked.
    pub cgroup: u64,
    pub stack_id: u64,
}
const _: () = assert!(size_of::<CgroupCause>() == 16);

/// Value of the global table, keyed by stack id (u64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalRecord {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}
const _: () = assert!(size_of::<GlobalRecord>() == 24);

impl GlobalRecord {
    /// Adds `count` sleeps of `total_ns` in all, the longest `max_ns`.
    pub fn add(&mut self, count: u64, total_ns: u64, max_ns: u64) {
        self.count += count;
        self.total_ns += total_ns;
        self.max_ns = self.max_ns.max(max_ns);
    }

    /// Adds another record's sleeps.
    pub fn merge(&mut self, other: &Self) {
        self.add(other.count, other.total_ns, other.max_ns);
    }

    /// Adds a task record's sleeps.
    pub fn merge_task(&mut self, rec: &LatencyRecord) {
        self.add(rec.count, rec.total_ns, rec.max_ns);
    }
}

/// Ended sleeps a task keeps for `--chains` (`TaskState::recent`).
pub const RECENT_SLEEPS: usize = 4;

/// One ended sleep of a task: its record id (0: not counted, over the cutoff), start and end,
/// and the task that woke it (0: no task, or not seen).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentSleep {
    pub cause: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub waker_tid: u32,
    pub pad: u32,
}
const _: () = assert!(size_of::<RecentSleep>() == 32);

/// A `SLOT_TIDS` owner word's bit: the slot is being made for the tid in the low bits; neither
/// its task's lookups nor user space take it yet (tids stay below 2^22, `PID_MAX_LIMIT`).
pub const SLOT_CLAIMING: u32 = 1 << 31;

/// Everything latprof keeps for one task (keyed by tid): the sleep in progress and its causes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskState {
    pub sleep_start_ns: u64,
    /// When the task was woken (0: not waiting for a CPU).
    pub runq_start_ns: u64,
    pub sleep_stack: u64,
    /// At the sleep's start, the task's `se.sum_exec_runtime` and `sched_info.run_delay`
    /// (where the kernel has them): a sleep whose wakeup was hidden is recovered from them.
    pub sleep_exec_ns: u64,
    pub sleep_run_delay_ns: u64,
    /// The task's cgroup v2 id when its last sleep began: its sleep and the run-queue wait
    /// after it are that cgroup's (0: cgroups not tracked).
    pub cgroup: u64,
    /// The task's user backtrace when its open sleep began (`--user-stacks`; `NO_USER`: none).
    pub sleep_ustack: u64,
    /// `--user-stacks`' memo of this task, each exact: the memory map whose layout
    /// (`layout_key`) was read last and the task's exec count then (`self_exec_id`: an exec's
    /// new map may take the freed map's address, a shell's own after two execs), that layout,
    /// and the last kernel + user cause known to be in `CAUSE_PARTS` (entries are never
    /// removed).
    pub user_mm: u64,
    pub user_exec: u64,
    pub user_layout: u64,
    pub user_cause: u64,
    /// `--user-stacks`: the highest address of this task's stack its last walk read (0: none
    /// yet, or its memory map changed since): the next walk reads up to it in one read.
    pub user_top: u64,
    pub sleep_kind: u32,
    pub tgid: u32,
    pub flags: u32,
    pub nr_records: u32,
    /// Bit i: `records[i]` is the task's own and stays out of the global table (accounted
    /// while the task had no memory map, as latencytop's `account_global_scheduler_latency`
    /// skips such tasks; or a kernel thread's).
    pub task_only: u32,
    /// `SLEEP_NO_MM`: when the open sleep began (and kept what recovering it needs), the task
    /// had no memory map.
    pub sleep_flags: u32,
    /// The tid of the task whose entry this is, in `TASK_SLOTS` (0: a free slot, or one
    /// being made); 0 in `TASKS`, keyed by tid.
    pub slot_tid: u32,
    /// In `TASK_SLOTS`: the slot's index (its owner word's in `SLOT_TIDS`).
    pub slot_index: u32,
    pub comm: [u8; 16],
    /// Who is waking the task, from `sched_waking` (in the waker's context), taken at the
    /// matching `sched_wakeup` and cleared there: a `WAKER_*` kind (`WAKER_UNSEEN`: none
    /// pending), the waking task's ids and name (`WAKER_TASK` only) and, with
    /// `--waker-stacks`, the waker's backtrace (0: none).
    pub waker_stack: u64,
    pub waker_kind: u32,
    pub waker_tgid: u32,
    pub waker_tid: u32,
    /// The low 32 bits of the `task_struct` address of the task that made the entry: tells it
    /// from a task that took its tid over (a thread that calls exec takes its leader's) before
    /// `sched_process_free` retires an exiting task's entry.
    pub task_low: u32,
    pub waker_comm: [u8; 16],
    /// `--wakers`: the counted sleeps of this task's latest waker (cause and waker as in
    /// `WAKERS`' key), not yet added to `WAKERS` (count 0: none). A sleep with the same key
    /// adds here, in the entry the wakeup holds already, instead of looking the key up in
    /// `WAKERS`; another key, or the task's exit, adds them there first. User space adds them
    /// to what it reads of `WAKERS`.
    pub waker_pending_key: WakerKey,
    pub waker_pending: WakerValue,
    /// `--chains`: the task's last `RECENT_SLEEPS` ended sleeps (`recent_next` is where the
    /// next goes), and its wait for a CPU right after the most recent (set when it got one)...
    pub recent: [RecentSleep; RECENT_SLEEPS],
    pub recent_next: u32,
    pub chain_pad: u32,
    pub last_runq_ns: u64,
    /// ...and, noted by `sched_waking` for the wakeup that follows (when a task wakes it): how
    /// much of its sleep so far the waker's recent sleeps overlapped, the record id of the one
    /// that overlapped most (0: one not counted), and the waker's wait for a CPU after its most
    /// recent sleep that overlapped it.
    pub chain_cause: u64,
    pub chain_behind_ns: u64,
    pub chain_runq_ns: u64,
    /// The backtraces of the task's recent sleeps and where their return addresses sat.
    pub stack_cache: StackCache,
    pub records: [LatencyRecord; TASK_RECORDS],
}
const _: () = assert!(
    size_of::<TaskState>()
        == 184 + 72 + 168 + size_of::<StackCache>() + size_of::<LatencyRecord>() * TASK_RECORDS
);

/// A task's records as it exited, sent through the `EXITED` ring buffer (in both modes) so
/// that user space can say which process and thread each sleep was, after the task is gone.
/// `records[nr_records..]` are not written.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitedTask {
    pub tid: u32,
    pub tgid: u32,
    pub nr_records: u32,
    /// As `TaskState::task_only`: those records stay out of the global table.
    pub task_only: u32,
    pub comm: [u8; 16],
    pub records: [LatencyRecord; TASK_RECORDS],
}
const _: () = assert!(size_of::<ExitedTask>() == 32 + size_of::<LatencyRecord>() * TASK_RECORDS);

/// Whether record `i` of a task is its own and stays out of the global table (bit i of its
/// `task_only`, as `TaskState::task_only`, `ExitedTask::task_only`).
#[must_use]
pub const fn task_only(task_only: u32, i: usize) -> bool {
    i < 32 && (task_only >> i) & 1 != 0
}

// One bit of `task_only` per record.
const _: () = assert!(TASK_RECORDS <= 32);

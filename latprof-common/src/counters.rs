//! The counters of latprof's own pipeline and of the kernel's ticks, with their names.

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
    /// Backtraces not stored (the stack table was full, or the kernel could not walk the
    /// stack); the sleep is counted under "stack unavailable".
    StackMissing,
    /// Sleeps not tracked because the task table was full (lost: raise `--max-tasks`).
    TaskTableFull,
    /// Causes beyond `TASK_RECORDS` for one task, sent straight to the global table.
    TaskRecordsFull,
    /// Records lost because the global table was full (raise `--max-records`).
    GlobalTableFull,
    /// Tasks whose records were merged into the global table at exit (lazy mode).
    ExitMerges,
    /// Entries made for a task already exiting: one latprof first saw exiting, or one whose
    /// entry its exit merge had retired and that slept again after `sched_process_exit`
    /// (where that hook runs before `exit_mm`). Tracked as the kernel does; retired when the
    /// task is freed.
    ExitingFirstSeen,
    /// Exit merges begun; with `MergesDone`, lets the reader see a merge in flight.
    MergesBegun,
    /// Exit merges finished.
    MergesDone,
    /// Tracked sleeps still open when their task went to sleep again: the kernel never ran
    /// latprof's programs for their wakeup (nor for the task's return to a CPU). Not counted.
    SleepLost,
    /// Run-queue waits (wakeup to running) accounted.
    RunqCounted,
    /// Histogram updates lost because the histogram table was full (raise --max-records).
    HistTableFull,
    /// Spike events written to the ring buffer.
    SpikesSubmitted,
    /// Spike submissions that woke the reader.
    SpikeWakeups,
    /// Spike submissions that did not wake the reader (it was not waiting).
    SpikeWakeupsSuppressed,
    /// Spike events lost because the ring buffer was full.
    SpikesDropped,
    /// `--debug-checks`: a wakeup of a tracked task with no open sleep.
    DebugWakeupWithoutSleep,
    /// `--debug-checks`: a clock reading earlier than the sleep's start.
    DebugTimeBackwards,
    /// `--debug-checks`: the kernel could not take a backtrace.
    DebugStackFailed,
    /// `--debug-checks`: a task exited with records that were not merged (normal mode, or a
    /// kernel thread kept out of the global table).
    DebugExitWithRecords,
    /// Kernel stacks walked (at switch-out, or at wakeup when the cache could not answer).
    StackWalks,
    /// Backtraces taken from the stack cache instead of a walk.
    StackCacheHits,
    /// `--debug-checks`: a backtrace from the stack cache differed from a walk of the same
    /// sleep (every hit is walked as well to check it).
    DebugStackCacheWrong,
    /// `sched_switch` events whose outgoing task is not the one the CPU's previous event
    /// switched in: the kernel ran no BPF program for the switches in between (some kernels
    /// hide tasks from tracing while they run; their wakeups are invisible too).
    SwitchesHidden,
    /// Counted sleeps of kernel threads: kept out of the global table, as latencytop does
    /// (without `--pid`).
    KthreadSleeps,
    /// Counted sleeps of user tasks without a memory map (exiting, after exit_mm): the task's
    /// own, kept out of the global table, as latencytop does (without `--pid`).
    NoMmSleeps,
    /// Sleeps found still open at their task's next sleep or exit (their wakeup was hidden)
    /// and recovered: woken at `now - run time since - run-queue wait since`, then filtered
    /// and counted like any other (those that pass are in `Counted` too).
    SleepsRecovered,
    /// Run-queue waits not measured: their wakeup was hidden (its time is known only after
    /// the fact, from the recovered sleep).
    RunqUnknown,
    /// Events of the `HIDDEN` log lost because its ring buffer was full: the sleeps lost or
    /// recovered then cannot be checked against the gaps.
    HiddenLogFull,
    /// Records lost from the per-cgroup table because it was full (raise --max-records).
    CgroupTableFull,
    /// Counted sleeps whose `sched_waking` was not seen (it came before the sleep's start
    /// was traced, or the kernel hid it): their waker is unknown.
    WakerUnseen,
    /// Counted sleeps whose waker found the waker table full: counted under their cause's
    /// `other` waker (a table of its own), or only here when that one was full too.
    WakerTableFull,
    /// Entries of tasks first seen while exiting (made by a sleep after `sched_process_exit`),
    /// removed at the task's last switch (or, where that was not seen, when it was freed).
    ExitingFreed,
    /// Walks that returned no user frame (a task without a user context, or a fault at once).
    UserStackEmpty,
    /// User backtraces not stored: the user stack table was full (raise --max-user-stacks).
    UserStackTableFull,
    /// First sightings of user backtraces not sent to user space: their ring buffer was full
    /// (the process's memory map may then be read too late to name them).
    UserSeenLost,
    /// Combined causes whose parts were not stored: their table was full.
    CausePartsFull,
    /// User backtraces named that were cut short (`[truncated]`: a frame that is no return
    /// address, as a program without frame pointers leaves, or no program entry reached).
    /// Counted by latprof's user space when it names them, not by the kernel.
    UserStackTruncated,
    /// Voluntary switches to wait for a PREEMPT_RT sleeping spinlock (`TASK_RTLOCK_WAIT`):
    /// neither an interruptible nor an uninterruptible sleep, not counted by latencytop nor by
    /// latprof; counted here so that a task's voluntary switches add up.
    RtlockWaits,
    /// Sleeps under 1 us (in `SkippedZero`) not logged to `HIDDEN` with their process: the log
    /// was over half full, its room kept for the gaps. No loss: they were not to be counted;
    /// only whose they were is not told.
    ShortUnlogged,
    /// Exiting tasks whose records were not sent through `EXITED`: it was full. Their last
    /// sleeps go out in profiles without process and thread labels (counted all the same).
    ExitsUnlogged,
    /// `--debug-checks`: writes to data every CPU shares, from the programs (`shared.rs` in
    /// the eBPF crate): 0 in lazy mode's steady state.
    DebugSharedWrites,
    /// Chain links (`--chains`) lost: the chain table was full (raise --max-chains).
    ChainTableFull,
    /// Users' binaries not parsed (`--user-stacks`; their frames named `file+0xoffset`): a
    /// private copy did not fit the copy budget, or their sections claim more than the file
    /// holds. Counted by latprof's user space. New counters go last, so that recordings made
    /// before them read the same slots.
    UserFilesUnparsed,
    /// Perf maps whose reading stopped short (`--user-stacks`; later JIT code unnamed): the
    /// map passed 16 MiB, or its user's budget was spent. Counted by latprof's user space.
    PerfMapsStopped,
    /// Files that needed unwind rows (`--user-stacks`) and got none: the kernel's table, or
    /// the part of it for users other than root, was spent. Their processes' backtraces may be
    /// cut short at their frameless functions. Counted by latprof's user space.
    UnwindRowsFull,
}

/// Number of entries in the `COUNTERS` array.
pub const COUNTER_COUNT: u32 = Counter::UnwindRowsFull as u32 + 1;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Self; COUNTER_COUNT as usize] = [
        Self::SleepsTracked,
        Self::Wakeups,
        Self::Counted,
        Self::SkippedCutoff,
        Self::SkippedZero,
        Self::StackMissing,
        Self::TaskTableFull,
        Self::TaskRecordsFull,
        Self::GlobalTableFull,
        Self::ExitMerges,
        Self::ExitingFirstSeen,
        Self::MergesBegun,
        Self::MergesDone,
        Self::SleepLost,
        Self::RunqCounted,
        Self::HistTableFull,
        Self::SpikesSubmitted,
        Self::SpikeWakeups,
        Self::SpikeWakeupsSuppressed,
        Self::SpikesDropped,
        Self::DebugWakeupWithoutSleep,
        Self::DebugTimeBackwards,
        Self::DebugStackFailed,
        Self::DebugExitWithRecords,
        Self::StackWalks,
        Self::StackCacheHits,
        Self::DebugStackCacheWrong,
        Self::SwitchesHidden,
        Self::KthreadSleeps,
        Self::NoMmSleeps,
        Self::SleepsRecovered,
        Self::RunqUnknown,
        Self::HiddenLogFull,
        Self::CgroupTableFull,
        Self::WakerUnseen,
        Self::WakerTableFull,
        Self::ExitingFreed,
        Self::UserStackEmpty,
        Self::UserStackTableFull,
        Self::UserSeenLost,
        Self::CausePartsFull,
        Self::UserStackTruncated,
        Self::RtlockWaits,
        Self::ShortUnlogged,
        Self::ExitsUnlogged,
        Self::DebugSharedWrites,
        Self::ChainTableFull,
        Self::UserFilesUnparsed,
        Self::PerfMapsStopped,
        Self::UnwindRowsFull,
    ];

    /// Its name in exports (JSON keys, OpenMetrics labels, `stats --counters`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::SleepsTracked => "sleeps_tracked",
            Self::Wakeups => "wakeups",
            Self::Counted => "counted",
            Self::SkippedCutoff => "skipped_cutoff",
            Self::SkippedZero => "skipped_zero",
            Self::StackMissing => "stack_missing",
            Self::TaskTableFull => "task_table_full",
            Self::TaskRecordsFull => "task_records_full",
            Self::GlobalTableFull => "global_table_full",
            Self::ExitMerges => "exit_merges",
            Self::ExitingFirstSeen => "exiting_first_seen",
            Self::MergesBegun => "merges_begun",
            Self::MergesDone => "merges_done",
            Self::SleepLost => "sleep_lost",
            Self::RunqCounted => "runq_counted",
            Self::HistTableFull => "hist_table_full",
            Self::SpikesSubmitted => "spikes_submitted",
            Self::SpikeWakeups => "spike_wakeups",
            Self::SpikeWakeupsSuppressed => "spike_wakeups_suppressed",
            Self::SpikesDropped => "spikes_dropped",
            Self::DebugWakeupWithoutSleep => "debug_wakeup_without_sleep",
            Self::DebugTimeBackwards => "debug_time_backwards",
            Self::DebugStackFailed => "debug_stack_failed",
            Self::DebugExitWithRecords => "debug_exit_with_records",
            Self::StackWalks => "stack_walks",
            Self::StackCacheHits => "stack_cache_hits",
            Self::DebugStackCacheWrong => "debug_stack_cache_wrong",
            Self::SwitchesHidden => "switches_hidden",
            Self::KthreadSleeps => "kthread_sleeps",
            Self::NoMmSleeps => "no_mm_sleeps",
            Self::SleepsRecovered => "sleeps_recovered",
            Self::RunqUnknown => "runq_unknown",
            Self::HiddenLogFull => "hidden_log_full",
            Self::CgroupTableFull => "cgroup_table_full",
            Self::WakerUnseen => "waker_unseen",
            Self::WakerTableFull => "waker_table_full",
            Self::ExitingFreed => "exiting_freed",
            Self::UserStackEmpty => "user_stack_empty",
            Self::UserStackTableFull => "user_stack_table_full",
            Self::UserSeenLost => "user_seen_lost",
            Self::CausePartsFull => "cause_parts_full",
            Self::UserStackTruncated => "user_stack_truncated",
            Self::RtlockWaits => "rtlock_waits",
            Self::ShortUnlogged => "short_unlogged",
            Self::ExitsUnlogged => "exits_unlogged",
            Self::DebugSharedWrites => "debug_shared_writes",
            Self::ChainTableFull => "chain_table_full",
            Self::UserFilesUnparsed => "user_files_unparsed",
            Self::PerfMapsStopped => "perf_maps_stopped",
            Self::UnwindRowsFull => "unwind_rows_full",
        }
    }

    /// What a non-zero value lost or left out, for the user's warning line; `None` for the
    /// counters that lose nothing. The header's "drops" is the sum of these.
    #[must_use]
    pub const fn loss(self) -> Option<&'static str> {
        match self {
            Self::StackMissing => {
                Some("backtraces not stored: stack table full (raise --max-stacks)")
            }
            Self::TaskTableFull => Some("sleeps not tracked: task table full (raise --max-tasks)"),
            Self::GlobalTableFull => Some("records lost: global table full (raise --max-records)"),
            Self::SleepLost => Some("sleeps lost: the kernel did not run latprof for their wakeup"),
            Self::RunqUnknown => {
                Some("run-queue waits not measured: their wakeup was hidden from tracing")
            }
            Self::HistTableFull => Some("histogram updates lost: table full (raise --max-records)"),
            Self::SpikesDropped => Some("spike events lost: the ring buffer was full"),
            Self::CgroupTableFull => {
                Some("per-cgroup records lost: table full (raise --max-records)")
            }
            Self::WakerTableFull => Some(
                "wakers not told apart: waker table full, counted as \"other\" (raise --max-wakers)",
            ),
            Self::ChainTableFull => Some("chain links lost: chain table full (raise --max-chains)"),
            Self::UserFilesUnparsed => Some(
                "users' binaries not parsed (named file+0xoffset): over the copy budget, or sections claiming more than the file holds",
            ),
            Self::PerfMapsStopped => Some(
                "perf maps not read to their end (later JIT code unnamed): over 16 MiB, or their user's budget spent",
            ),
            Self::UnwindRowsFull => Some(
                "files left without unwind rows (backtraces may stop at their frameless functions): the unwind table was full",
            ),
            Self::UserStackTableFull => {
                Some("user backtraces not stored: user stack table full (raise --max-user-stacks)")
            }
            Self::UserSeenLost => {
                Some("user backtraces announced late: their ring buffer was full")
            }
            Self::CausePartsFull => {
                Some("kernel + user causes not told apart: their table was full")
            }
            Self::HiddenLogFull => {
                Some("hidden-switch events lost: their log was full (lost sleeps go unchecked)")
            }
            _ => None,
        }
    }
}

/// Per-CPU counters of the kernel's tick and time accounting, indexes into the `TICKS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickCounter {
    /// Local timer interrupts (irq_vectors:local_timer_entry).
    TimerTicks = 0,
    /// The tick was stopped (timer:tick_stop with success=1: idle, or nohz_full with one task).
    TickStopOk,
    /// A nohz_full CPU could not stop its tick (timer:tick_stop with success=0); the
    /// dependencies that kept it are counted below, one per bit.
    TickStopFail,
    DepPosixTimer,
    DepPerfEvents,
    DepSched,
    DepClockUnstable,
    DepRcu,
    DepRcuExp,
    /// Context switches on this CPU.
    Switches,
    /// Context tracking: the CPU entered user mode (context_tracking:user_enter).
    UserEnter,
    /// Context tracking: the CPU left user mode (context_tracking:user_exit).
    UserExit,
}

/// Number of entries in the `TICKS` array.
pub const TICK_COUNTER_COUNT: u32 = TickCounter::UserExit as u32 + 1;

/// `tick_dep_bits` in include/linux/tick.h: bit n of timer:tick_stop's `dependency`.
pub const TICK_DEP_BITS: u32 = 6;

/// The counter of a tick dependency bit (`TICK_DEP_BIT_*`), if latprof knows it.
#[must_use]
pub const fn tick_dep_counter(bit: u32) -> Option<TickCounter> {
    match bit {
        0 => Some(TickCounter::DepPosixTimer),
        1 => Some(TickCounter::DepPerfEvents),
        2 => Some(TickCounter::DepSched),
        3 => Some(TickCounter::DepClockUnstable),
        4 => Some(TickCounter::DepRcu),
        5 => Some(TickCounter::DepRcuExp),
        _ => None,
    }
}

impl TickCounter {
    /// A tick dependency's name as the kernel's trace output prints it (`TICK_DEP_MASK_*`);
    /// `None` for the counters that are not dependencies.
    #[must_use]
    pub const fn dep_name(self) -> Option<&'static str> {
        match self {
            Self::DepPosixTimer => Some("POSIX_TIMER"),
            Self::DepPerfEvents => Some("PERF_EVENTS"),
            Self::DepSched => Some("SCHED"),
            Self::DepClockUnstable => Some("CLOCK_UNSTABLE"),
            Self::DepRcu => Some("RCU"),
            Self::DepRcuExp => Some("RCU_EXP"),
            _ => None,
        }
    }
}

const _: () = {
    let mut i = 0;
    while i < Counter::ALL.len() {
        assert!(Counter::ALL[i] as usize == i);
        i += 1;
    }
};

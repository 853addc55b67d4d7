//! Sleeps whose wakeup the kernel hid: some kernels run no BPF program while certain tasks are
//! current, so a wakeup done then (from an interrupt, or by such a task) never reaches
//! `sched_wakeup`, and the sleep is found still open when its task sleeps again or exits. The
//! task's run time (`se.sum_exec_runtime`) and run-queue wait (`sched_info.run_delay`) grew
//! only since that wakeup, so it was at `now - run time since - wait since`: the sleep is
//! recovered, filtered and counted as any other. Its backtrace, if it was to be taken at the
//! wakeup, is gone: it is counted under `RECOVERED_STACK`. Its run-queue wait is unknown.
//!
//! Reading the two fields costs each sleep a little (docs/bench.md, "Measured while building"),
//! so sleeps start keeping them only once a hidden switch was seen
//! (`HIDING_SEEN`): on a kernel that hides nothing that cost is never paid, and where one
//! does, a sleep hidden before the first hidden switch is seen is lost.

use latprof_common::{
    Counter, DEFERRED_STACK, HIDDEN_SLEEP_LOST, HIDDEN_SLEEP_RECOVERED, RECOVERED_STACK,
    SLEEP_NO_MM, SLEEP_NONE, SleepVerdict, TaskState, WAKER_UNSEEN, sleep_verdict, stack_for_state,
};

use crate::{
    account::{account, has_mm, has_mm_btf, sleep_in_global_with},
    maps::{HIDING_SEEN, count, ids, log_hidden, short_sleep},
    settings::{
        DEBUG_HIDE_WAKEUPS, INTER_CUTOFF_NS, MIN_SLEEP_NS, RUNQ, TASK_EXEC_RUNTIME_OFF,
        TASK_RUN_DELAY_OFF, USER_STACKS_ON, read_btf_field, read_field,
    },
    spikes::spike,
};

/// At a sleep's start: what recovering it will need, where the kernel has it and once it was
/// seen hiding switches.
#[inline(always)]
pub(crate) fn note_sleep_start<const BTF: bool>(entry: &mut TaskState, task: *const u8) {
    let exec_off = TASK_EXEC_RUNTIME_OFF.load();
    if exec_off == 0 {
        return;
    }
    let seen = DEBUG_HIDE_WAKEUPS.load() != 0 || HIDING_SEEN.get(0).is_some_and(|seen| *seen != 0);
    if !seen {
        return;
    }
    // `task` is a BTF tracepoint's (`BTF`): plain loads; else probe reads.
    let (exec, delay, mm) = if BTF {
        (
            read_btf_field::<u64>(task, exec_off),
            read_btf_field::<u64>(task, TASK_RUN_DELAY_OFF.load()),
            has_mm_btf(task),
        )
    } else {
        (
            read_field::<u64>(task, exec_off).unwrap_or(0),
            read_field::<u64>(task, TASK_RUN_DELAY_OFF.load()).unwrap_or(0),
            has_mm(task),
        )
    };
    entry.sleep_exec_ns = exec;
    entry.sleep_run_delay_ns = delay;
    // Whether it belongs in the global table is decided by the memory map the task had while
    // it slept: at exit (where a recovered sleep may be found) the map is already gone.
    entry.sleep_flags = if mm { 0 } else { SLEEP_NO_MM };
}

/// Ends `entry`'s open sleep, found open at `now` while its task `task` (current) runs:
/// recovered where the kernel keeps the task's run time and wait, lost otherwise.
// Not inlined: one copy serves sched_switch and sched_process_exit.
#[inline(never)]
pub(crate) fn recover<const CAS: bool>(tid: u32, entry: &mut TaskState, task: *const u8, now: u64) {
    let kind = entry.sleep_kind;
    entry.sleep_kind = SLEEP_NONE;
    let exec_off = TASK_EXEC_RUNTIME_OFF.load();
    if exec_off == 0 || entry.sleep_exec_ns == 0 {
        // No recovery on this kernel, or the sleep began before any hiding was seen.
        lost(tid, entry, now);
        return;
    }
    let (Ok(exec), Ok(delay)) = (
        read_field::<u64>(task, exec_off),
        read_field::<u64>(task, TASK_RUN_DELAY_OFF.load()),
    ) else {
        lost(tid, entry, now);
        return;
    };
    let since = exec
        .saturating_sub(entry.sleep_exec_ns)
        .saturating_add(delay.saturating_sub(entry.sleep_run_delay_ns));
    let woken = now.saturating_sub(since);
    if woken < entry.sleep_start_ns {
        // More run time than wall time: the counters do not fit this sleep.
        lost(tid, entry, now);
        return;
    }
    count(Counter::SleepsRecovered);
    log_hidden(
        HIDDEN_SLEEP_RECOVERED,
        ids(tid, entry.tgid),
        entry.sleep_start_ns,
        now,
        woken,
    );
    if RUNQ.load() == 1 {
        count(Counter::RunqUnknown);
    }
    let delta = woken - entry.sleep_start_ns;
    match sleep_verdict(kind, delta, MIN_SLEEP_NS.load(), INTER_CUTOFF_NS.load()) {
        SleepVerdict::TooShort => short_sleep(ids(tid, entry.tgid), entry.sleep_start_ns, woken),
        SleepVerdict::OverCutoff => count(Counter::SkippedCutoff),
        SleepVerdict::Count => {
            let stack = if entry.sleep_stack == DEFERRED_STACK {
                RECOVERED_STACK
            } else {
                entry.sleep_stack
            };
            let in_global = sleep_in_global_with(entry, entry.sleep_flags & SLEEP_NO_MM == 0);
            // With the sleeper's user backtrace, the cause is the pair (as at a wakeup).
            let stack = if USER_STACKS_ON.load() == 1 {
                crate::ustacks::cause(stack, entry.sleep_ustack, entry)
            } else {
                stack
            };
            account::<CAS>(entry, stack_for_state(stack, kind), delta, in_global);
            count(Counter::Counted);
            spike::<CAS>(tid, entry, stack, delta, kind, woken, WAKER_UNSEEN);
        }
    }
}

/// Counts `entry`'s open sleep as lost, found at `now`, and logs it for user space's check.
#[inline(always)]
fn lost(tid: u32, entry: &TaskState, now: u64) {
    count(Counter::SleepLost);
    log_hidden(
        HIDDEN_SLEEP_LOST,
        ids(tid, entry.tgid),
        entry.sleep_start_ns,
        now,
        0,
    );
}

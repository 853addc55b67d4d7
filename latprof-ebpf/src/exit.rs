//! A task's end: at `sched_process_exit` (or, for a task first seen exiting, at
//! `sched_process_free`) a sleep still open is recovered or lost, and lazy mode merges the
//! task's records into the global table (with cgroups, into the per-cgroup table) before the
//! entry goes. Apart from `account.rs` so that accounting and recovery (which accounts) stay
//! on floors of their own.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use latprof_common::{
    CgroupCause, Counter, DEFECT_MERGE_TWICE, ExitedTask, HIDDEN_SLEEP_LOST, MODE_LAZY, SLEEP_NONE,
    TASK_FLAG_EXITING, TASK_FLAG_KTHREAD, TASK_RECORDS, TaskState,
};

use crate::{
    account::{cgroup_add, merged_add},
    debug::anomaly,
    defects,
    maps::{EXITED, count, ids, log_hidden},
    recover::recover,
    settings::{
        CGROUPS_ON, DEBUG_CHECKS, EXITS_ON, MODE, SKIP_KTHREADS, TASK_PID_OFF, WAKERS_ON,
        read_field,
    },
    shared, task_table, wakers,
};

/// A task is freed (an RCU grace period after it was reaped): the entry of a task first seen
/// while exiting is retired as at exit, if `sched_process_exit` did not take it: a sleep after
/// that hook made it (where the hook runs before `exit_mm`, as on this 6.18 host, the waits
/// in `exit_mm`, such as exit_aio's or the memory map lock's, come after it). Only such
/// entries: the tid may belong to a new task by now.
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn sched_process_free(ctx: RawTracePointContext) -> i32 {
    try_sched_process_free::<true>(&ctx).unwrap_or(1)
}

/// `sched_process_free` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn sched_process_free_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_process_free::<false>(&ctx).unwrap_or(1)
}

fn try_sched_process_free<const CAS: bool>(ctx: &RawTracePointContext) -> Result<i32, i32> {
    // TP_PROTO(struct task_struct *p)
    let task: *const u8 = ctx.arg(0);
    let tid = read_field::<i32>(task, TASK_PID_OFF.load())? as u32;
    let Some(entry) = task_table::get(tid) else {
        return Ok(0);
    };
    // SAFETY: the task is dead: nothing of its own writes its entry any more.
    let entry = unsafe { &mut *entry };
    // Only the entry this task made: one a thread took over with the tid (exec from a thread
    // that is not the leader) is that thread's, retired at its own exit.
    if entry.flags & TASK_FLAG_EXITING != 0 && entry.task_low == task as u64 as u32 {
        count(Counter::ExitingFreed);
        // A sleep still open never saw its wakeup (the kernel hid it); the task's run time is
        // not current's to read here, so it is lost, and logged for the check against the
        // hidden stretches.
        if entry.sleep_kind != SLEEP_NONE {
            count(Counter::SleepLost);
            log_hidden(
                HIDDEN_SLEEP_LOST,
                ids(tid, entry.tgid),
                entry.sleep_start_ns,
                unsafe { bpf_ktime_get_ns() },
                0,
            );
            entry.sleep_kind = SLEEP_NONE;
        }
        retire::<_, CAS>(ctx, tid, entry);
    }
    Ok(0)
}

/// The task switching out (current) is dead (`TASK_DEAD`: it never runs again). The entry of
/// a task first seen while exiting goes now, as at `sched_process_exit`, in the task's own
/// context: `sched_process_free`, an RCU grace period later in whatever task then runs, is
/// skipped where the kernel hides that task from tracing (this host does for some of its
/// service threads), and the entry then outlived its task. Entries made before
/// `sched_process_exit` are gone by now; only `TASK_FLAG_EXITING` ones can be left.
#[inline(always)]
pub(crate) fn switched_out_dead<C: EbpfContext, const CAS: bool>(ctx: &C, now: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(entry) = task_table::get(tid) else {
        return;
    };
    // SAFETY: the dead task is current; only its own events write its entry.
    let entry = unsafe { &mut *entry };
    let task = unsafe { bpf_get_current_task() } as *const u8;
    if entry.flags & TASK_FLAG_EXITING == 0 || entry.task_low != task as u64 as u32 {
        return;
    }
    count(Counter::ExitingFreed);
    if entry.sleep_kind != SLEEP_NONE {
        // Running now, so not asleep: that sleep's wakeup was hidden.
        recover::<CAS>(tid, entry, task, now);
    }
    retire::<_, CAS>(ctx, tid, entry);
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(ctx: RawTracePointContext) -> i32 {
    try_sched_process_exit::<true>(&ctx).unwrap_or(1)
}

/// `sched_process_exit` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_process_exit::<false>(&ctx).unwrap_or(1)
}

/// Runs in the exiting task: `current` is the task whose records are merged.
#[expect(
    clippy::unnecessary_wraps,
    reason = "every program's body has one shape: `try_<program>(&ctx).unwrap_or(1)`"
)]
fn try_sched_process_exit<const CAS: bool>(ctx: &RawTracePointContext) -> Result<i32, i32> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(entry) = task_table::get(tid) else {
        return Ok(0);
    };
    // SAFETY: the exiting task is current; only its own events write its entry.
    let entry = unsafe { &mut *entry };
    if entry.sleep_kind != SLEEP_NONE {
        // A running task is not asleep: that sleep's wakeup never reached latprof. Its run
        // time since may miss the current slice (updated at the next tick or switch): the
        // recovered sleep can be that much too long.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        recover::<CAS>(tid, entry, task, unsafe { bpf_ktime_get_ns() });
    }
    retire::<_, CAS>(ctx, tid, entry);
    Ok(0)
}

/// The end of a task's entry: its pending waker goes to the waker table, its records are sent
/// to user space (with `EXITS_ON`); in lazy mode they merge into the global table, with
/// cgroups into the per-cgroup table; then the entry goes.
#[inline(always)]
fn retire<C: EbpfContext, const CAS: bool>(ctx: &C, tid: u32, entry: &mut TaskState) {
    if WAKERS_ON.load() == 1 {
        // Its pending waker, before the entry goes.
        wakers::flush(entry);
    }
    if EXITS_ON.load() == 1 && entry.nr_records > 0 {
        send_exited(tid, entry);
    }
    let lazy = MODE.load() == MODE_LAZY;
    // The per-cgroup table takes exited tasks' records in both modes (normal mode puts only
    // the global table on the hot path).
    let cgroups = CGROUPS_ON.load() == 1;
    if (lazy || cgroups) && (entry.flags & TASK_FLAG_KTHREAD == 0 || SKIP_KTHREADS.load() == 0) {
        count(Counter::MergesBegun);
        let n = entry.nr_records as usize;
        for i in 0..TASK_RECORDS {
            if i >= n {
                break;
            }
            if (entry.task_only >> i) & 1 != 0 {
                // Accounted while the task had no memory map: its own, not the global table's.
                continue;
            }
            let rec = &entry.records[i];
            // `--debug-defect merge-twice`: the record merged a second time.
            let times = if defects::hit(DEFECT_MERGE_TWICE) {
                2
            } else {
                1
            };
            for _ in 0..times {
                if lazy {
                    merged_add::<CAS>(rec.stack_id, rec.count, rec.total_ns, rec.max_ns);
                }
                if cgroups {
                    cgroup_add(
                        &CgroupCause {
                            cgroup: rec.cgroup,
                            stack_id: rec.stack_id,
                        },
                        rec.count,
                        rec.total_ns,
                        rec.max_ns,
                    );
                }
            }
        }
        shared::write();
        task_table::remove(tid, entry);
        if lazy {
            count(Counter::ExitMerges);
        }
        count(Counter::MergesDone);
    } else {
        if DEBUG_CHECKS.load() == 1 && MODE.load() == MODE_LAZY && entry.nr_records > 0 {
            // Records that reach no global table (a kernel thread's, kept out).
            anomaly(
                ctx,
                Counter::DebugExitWithRecords,
                tid,
                u64::from(entry.nr_records),
            );
        }
        shared::write();
        task_table::remove(tid, entry);
    }
}

/// Sends the task's records through `EXITED` (its last sleeps, counted since user space last
/// read the task, are then told by process and thread): only the records it has are written.
#[inline(always)]
fn send_exited(tid: u32, entry: &TaskState) {
    let Some(mut slot) = EXITED.reserve::<ExitedTask>(0) else {
        count(Counter::ExitsUnlogged);
        return;
    };
    let out = slot.as_mut_ptr();
    let n = entry.nr_records as usize;
    // SAFETY: `out` is the reserved slot, written field by field before it is submitted.
    unsafe {
        (*out).tid = tid;
        (*out).tgid = entry.tgid;
        (*out).nr_records = entry.nr_records;
        (*out).task_only = entry.task_only;
        (*out).comm = entry.comm;
        for i in 0..TASK_RECORDS {
            if i >= n {
                break;
            }
            (*out).records[i] = entry.records[i];
        }
    }
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
}

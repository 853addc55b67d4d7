//! Accounting: a counted sleep or wait into the task's records, the histograms and (normal
//! mode) the global table; at `sched_process_exit`, lazy mode's merge of the task's records.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use latprof_common::{
    CgroupCause, Counter, GlobalRecord, HIDDEN_SLEEP_LOST, HIST_BUCKETS, Histogram, LatencyRecord,
    MODE_LAZY, MODE_NORMAL, SLEEP_NONE, TASK_FLAG_EXITING, TASK_FLAG_KTHREAD, TASK_RECORDS,
    TaskState, hist_bucket,
};

use crate::{
    debug::anomaly,
    maps::{CGROUP_LATENCY, GLOBAL_LATENCY, HISTOGRAMS, MERGED, TASKS, count, ids, log_hidden},
    recover::recover,
    settings::{
        CGROUPS_ON, DEBUG_CHECKS, HISTOGRAMS_ON, MODE, SKIP_KTHREADS, TASK_MM_OFF, TASK_PID_OFF,
        read_field,
    },
};

// A record index is masked (rule 2 of the verifier rules in `stack_cache`).
const _: () = assert!(TASK_RECORDS.is_power_of_two());

/// Whether a sleep of `task` (its entry `entry`) that ends now belongs in the global table as
/// latencytop decides it: with `--pid` every sleep of the process does (it is that process's
/// table, as /proc/PID/latency); otherwise not a kernel thread's, and not one of a task without
/// a memory map (`account_global_scheduler_latency` returns on `!tsk->mm`: an exiting task
/// after exit_mm, whose last sleeps, such as exit_aio's, stay its own).
#[inline(always)]
pub(crate) fn sleep_in_global(entry: &TaskState, task: *const u8) -> bool {
    if SKIP_KTHREADS.load() == 0 {
        return true;
    }
    sleep_in_global_with(entry, has_mm(task))
}

/// Whether `task` has a memory map; a failed read says yes (the sleep stays global, as before
/// this check existed).
#[inline(always)]
pub(crate) fn has_mm(task: *const u8) -> bool {
    match read_field::<u64>(task, TASK_MM_OFF.load()) {
        Ok(mm) => mm != 0,
        Err(_) => true,
    }
}

/// [`sleep_in_global`] for a task whose memory map at the time that matters is known.
#[inline(always)]
pub(crate) fn sleep_in_global_with(entry: &TaskState, has_mm: bool) -> bool {
    if SKIP_KTHREADS.load() == 0 {
        return true;
    }
    if entry.flags & TASK_FLAG_KTHREAD != 0 {
        count(Counter::KthreadSleeps);
        return false;
    }
    if !has_mm {
        count(Counter::NoMmSleeps);
    }
    has_mm
}

/// Whether a run-queue wait of `entry`'s task belongs in the global table (latencytop has no
/// run-queue row; latprof's follows the kernel-thread rule).
#[inline(always)]
pub(crate) fn runq_in_global(entry: &TaskState) -> bool {
    entry.flags & TASK_FLAG_KTHREAD == 0 || SKIP_KTHREADS.load() == 0
}

/// Adds one latency to the task's record of `stack` (and, in normal mode and `in_global`, the
/// global one). A record not `in_global` is kept apart from a global one of the same stack
/// (its `task_only` bit), so that lazy mode's exit merge leaves it out.
// Not inlined: its record search ends in one return (verifier rule 4 in `stack_cache`).
#[inline(never)]
pub(crate) fn account<const CAS: bool>(
    entry: &mut TaskState,
    stack: u64,
    delta: u64,
    in_global: bool,
) {
    let cgroup = entry.cgroup;
    // The histograms count what the global table counts (kernel threads' sleeps left out
    // alike), so that a histogram's count is its cause's count (`latprof serve`'s
    // `_count` and `latprof_sleeps_total`, `top`'s rows).
    if HISTOGRAMS_ON.load() == 1 && in_global {
        histogram_add(
            &CgroupCause {
                cgroup,
                stack_id: stack,
            },
            delta,
        );
    }
    let task_only = u32::from(!in_global);
    let n = entry.nr_records as usize;
    let mut found = false;
    for i in 0..TASK_RECORDS {
        if i >= n {
            break;
        }
        let rec = &mut entry.records[i];
        if rec.stack_id == stack && rec.cgroup == cgroup && (entry.task_only >> i) & 1 == task_only
        {
            rec.count += 1;
            rec.total_ns += delta;
            if delta > rec.max_ns {
                rec.max_ns = delta;
            }
            found = true;
            break;
        }
    }
    if !found {
        if n < TASK_RECORDS {
            // The mask kept (verifier rule 1 in `stack_cache`): 6.1's verifier follows this
            // branch even after the search proved n >= TASK_RECORDS, and then needs the index
            // bounded.
            // SAFETY: reads a local.
            let n = unsafe { core::ptr::read_volatile(&raw const n) } & (TASK_RECORDS - 1);
            entry.records[n] = LatencyRecord {
                stack_id: stack,
                count: 1,
                total_ns: delta,
                max_ns: delta,
                cgroup,
            };
            entry.task_only |= task_only << n;
            entry.nr_records = n as u32 + 1;
        } else {
            count(Counter::TaskRecordsFull);
            if MODE.load() == MODE_LAZY && in_global {
                merged_add::<CAS>(stack, 1, delta, delta);
            }
            if CGROUPS_ON.load() == 1 && in_global {
                cgroup_add(
                    &CgroupCause {
                        cgroup,
                        stack_id: stack,
                    },
                    1,
                    delta,
                    delta,
                );
            }
        }
    }
    if MODE.load() == MODE_NORMAL && in_global {
        global_add::<CAS>(stack, 1, delta, delta);
    }
}

/// Adds to one CPU's part of a per-CPU record (lazy mode's merges, the per-cgroup table).
#[inline(always)]
fn add_to_part(rec: *mut GlobalRecord, n: u64, total_ns: u64, max_ns: u64) {
    // SAFETY: this CPU's value; programs on one CPU do not run concurrently.
    let rec = unsafe { &mut *rec };
    rec.count += n;
    rec.total_ns += total_ns;
    if max_ns > rec.max_ns {
        rec.max_ns = max_ns;
    }
}

/// Adds to this CPU's part of the per-cgroup table (user space adds the CPUs' parts).
#[inline(always)]
fn cgroup_add(key: &CgroupCause, n: u64, total_ns: u64, max_ns: u64) {
    if let Some(rec) = CGROUP_LATENCY.get_ptr_mut(key) {
        add_to_part(rec, n, total_ns, max_ns);
    } else {
        let first = GlobalRecord {
            count: n,
            total_ns,
            max_ns,
        };
        if CGROUP_LATENCY
            .insert(key, &first, u64::from(BPF_NOEXIST))
            .is_err()
        {
            count(Counter::CgroupTableFull);
        }
    }
}

/// Counts `delta` in the per-CPU histogram of a cause in a cgroup.
#[inline(always)]
fn histogram_add(key: &CgroupCause, delta: u64) {
    let hist = if let Some(hist) = HISTOGRAMS.get_ptr_mut(key) {
        hist
    } else {
        let zero: Histogram = [0; HIST_BUCKETS];
        let _ = HISTOGRAMS.insert(key, &zero, u64::from(BPF_NOEXIST));
        let Some(hist) = HISTOGRAMS.get_ptr_mut(key) else {
            count(Counter::HistTableFull);
            return;
        };
        hist
    };
    let bucket = hist_bucket(delta);
    if bucket < HIST_BUCKETS {
        // SAFETY: this CPU's copy; bucket is in range.
        unsafe { (*hist)[bucket] += 1 };
    }
}

/// Lazy mode's merge: adds to this CPU's part of the global table (user space adds the CPUs'
/// parts to the shared table when it reads): no atomic operation, no cache line shared with
/// the other CPUs.
#[inline(always)]
fn merged_add<const CAS: bool>(stack: u64, n: u64, total_ns: u64, max_ns: u64) {
    if let Some(rec) = MERGED.get_ptr_mut(&stack) {
        add_to_part(rec, n, total_ns, max_ns);
    } else {
        // A new key starts at zero on every CPU but this one.
        let first = GlobalRecord {
            count: n,
            total_ns,
            max_ns,
        };
        if MERGED
            .insert(&stack, &first, u64::from(BPF_NOEXIST))
            .is_err()
        {
            // Full (or another CPU made the key meanwhile): the shared table still takes it.
            global_add::<CAS>(stack, n, total_ns, max_ns);
        }
    }
}

/// Adds to the global record of `stack`: the one structure every CPU shares.
#[inline(always)]
fn global_add<const CAS: bool>(stack: u64, n: u64, total_ns: u64, max_ns: u64) {
    let rec = if let Some(rec) = GLOBAL_LATENCY.get_ptr_mut(&stack) {
        rec
    } else {
        let first = GlobalRecord {
            count: n,
            total_ns,
            max_ns,
        };
        if GLOBAL_LATENCY
            .insert(&stack, &first, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            return;
        }
        // Lost the race to another CPU, or the table is full.
        let Some(rec) = GLOBAL_LATENCY.get_ptr_mut(&stack) else {
            count(Counter::GlobalTableFull);
            return;
        };
        rec
    };
    // SAFETY: map value pointers stay valid for the program's run; updates are atomic.
    unsafe {
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut (*rec).count, n);
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut (*rec).total_ns, total_ns);
        if !CAS {
            // No compare-and-swap: the maximum goes to this CPU's part instead, which user
            // space combines with the shared record (exact, at one more lookup).
            merged_max(stack, max_ns);
            return;
        }
        let max = &raw mut (*rec).max_ns;
        // Bounded compare-and-swap: the verifier needs a bounded loop, and a loser only retries
        // while its value is still larger.
        for _ in 0..4 {
            let cur = core::ptr::read_volatile(max);
            if max_ns <= cur {
                break;
            }
            let _ = atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(max, cur, max_ns);
        }
    }
}

/// Raises this CPU's part of the maximum of `stack` (for kernels without compare-and-swap).
#[inline(always)]
fn merged_max(stack: u64, max_ns: u64) {
    if let Some(rec) = MERGED.get_ptr_mut(&stack) {
        // SAFETY: this CPU's value; programs on one CPU do not run concurrently.
        let rec = unsafe { &mut *rec };
        if max_ns > rec.max_ns {
            rec.max_ns = max_ns;
        }
    } else {
        let first = GlobalRecord {
            count: 0,
            total_ns: 0,
            max_ns,
        };
        if MERGED
            .insert(&stack, &first, u64::from(BPF_NOEXIST))
            .is_err()
        {
            count(Counter::GlobalTableFull);
        }
    }
}

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
    let Some(entry) = TASKS.get_ptr_mut(&tid) else {
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
        retire::<CAS>(ctx, tid, entry);
    }
    Ok(0)
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
    let Some(entry) = TASKS.get_ptr_mut(&tid) else {
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
    retire::<CAS>(ctx, tid, entry);
    Ok(0)
}

/// The end of a task's entry: in lazy mode its records merge into the global table, with
/// cgroups into the per-cgroup table; then the entry goes.
#[inline(always)]
fn retire<const CAS: bool>(ctx: &RawTracePointContext, tid: u32, entry: &TaskState) {
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
        let _ = TASKS.remove(&tid);
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
        let _ = TASKS.remove(&tid);
    }
}

//! Accounting: a counted sleep or wait into the task's records, the histograms and (normal
//! mode) the global table; the adds that lazy mode's exit merge (`exit.rs`) makes.

use core::{
    intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd},
    sync::atomic::{Ordering::Release, compiler_fence},
};

use aya_ebpf::bindings::BPF_NOEXIST;
use latprof_common::{
    CgroupCause, Counter, GlobalRecord, HIST_BUCKETS, Histogram, LatencyRecord, MODE_LAZY,
    MODE_NORMAL, SKIP_ACCOUNT, SKIP_MM, TASK_FLAG_KTHREAD, TASK_RECORDS, TaskState, hist_bucket,
};

use crate::{
    defects,
    maps::{CGROUP_LATENCY, GLOBAL_LATENCY, HISTOGRAMS, MERGED, count},
    settings::{
        CGROUPS_ON, HISTOGRAMS_ON, MODE, SKIP_KTHREADS, TASK_MM_OFF, read_btf_field, read_field,
        skipped,
    },
    shared,
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
    if skipped(SKIP_MM) {
        return true;
    }
    match read_field::<u64>(task, TASK_MM_OFF.load()) {
        Ok(mm) => mm != 0,
        Err(_) => true,
    }
}

/// [`has_mm`] of a task the verifier knows by its BTF type: a plain load.
#[inline(always)]
pub(crate) fn has_mm_btf(task: *const u8) -> bool {
    if skipped(SKIP_MM) {
        return true;
    }
    read_btf_field::<u64>(task, TASK_MM_OFF.load()) != 0
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
    if skipped(SKIP_ACCOUNT) {
        return;
    }
    let cgroup = defects::cgroup(entry.cgroup);
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
        // Read again from the entry (map memory, of no value the verifier knows): each of the
        // search's exits knows `n` in a range of its own, and would walk the rest once per
        // exit (a sched_switch program walks this function from several places).
        // SAFETY: the entry's own field; only its task's events write it.
        let n = unsafe { core::ptr::read_volatile(&raw const entry.nr_records) } as usize;
        if n < TASK_RECORDS {
            // The mask kept (verifier rule 1 in `stack_cache`): 6.1's verifier follows this
            // branch even after the search proved n >= TASK_RECORDS, and then needs the index
            // bounded.
            let n = n & (TASK_RECORDS - 1);
            entry.records[n] = LatencyRecord {
                stack_id: stack,
                count: 1,
                total_ns: delta,
                max_ns: delta,
                cgroup,
            };
            entry.task_only |= task_only << n;
            // The record before the count that takes it in: user space reads the count
            // first (`task_slots`).
            compiler_fence(Release);
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
pub(crate) fn cgroup_add(key: &CgroupCause, n: u64, total_ns: u64, max_ns: u64) {
    if let Some(rec) = CGROUP_LATENCY.get_ptr_mut(key) {
        add_to_part(rec, n, total_ns, max_ns);
    } else {
        let first = GlobalRecord {
            count: n,
            total_ns,
            max_ns,
        };
        shared::write();
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
        shared::write();
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
pub(crate) fn merged_add<const CAS: bool>(stack: u64, n: u64, total_ns: u64, max_ns: u64) {
    if let Some(rec) = MERGED.get_ptr_mut(&stack) {
        add_to_part(rec, n, total_ns, max_ns);
    } else {
        // A new key starts at zero on every CPU but this one.
        let first = GlobalRecord {
            count: n,
            total_ns,
            max_ns,
        };
        shared::write();
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
    shared::write();
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
        shared::write();
        if MERGED
            .insert(&stack, &first, u64::from(BPF_NOEXIST))
            .is_err()
        {
            count(Counter::GlobalTableFull);
        }
    }
}

//! `sched_wakeup`: the sleep ends; it is filtered like latencytop does, its backtrace taken
//! if it was deferred, and it is accounted.

use aya_ebpf::{
    EbpfContext,
    bindings::task_struct,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use latprof_common::{
    Counter, DEFECT_DROP_SLEEP, DEFERRED_STACK, HIDDEN_GAP_DEBUG, NO_STACK, SKIP_STACK, SLEEP_NONE,
    SleepVerdict, TaskState, WAKER_TASK, sleep_verdict, stack_for_state,
};

use crate::{
    account::{account, has_mm_btf, sleep_in_global, sleep_in_global_with},
    chains,
    debug::anomaly,
    defects,
    maps::{count, ids, log_hidden, short_sleep},
    settings::{
        CHAINS_ON, DEBUG_CHECKS, DEBUG_HIDE_WAKEUPS, FILTER_TGID, INTER_CUTOFF_NS, MIN_SLEEP_NS,
        RUNQ, SELF_TGID, TASK_PID_OFF, TASK_TGID_OFF, USER_STACKS_ON, WAKERS_ON, read_btf_field,
        read_field, skipped,
    },
    spikes::spike,
    stack_cache::sleeping_stack,
    stacks::task_stack,
    task_table, ustacks, wakers,
};

/// `DEBUG_HIDE_WAKEUPS`'s bit that leaves the wakeups it hides out of the `HIDDEN` log.
const HIDE_UNLOGGED: u32 = 1 << 31;

// How a wakeup program gets a counted sleep's backtrace. Each program is built for one (a
// const parameter), so it holds no code, helper call or instruction of the others (verifier
// rule 7 in `stack_cache`).
/// Walked at switch-out already (the raw tracepoint cannot take another task's backtrace).
const BT_SWITCH_OUT: u8 = 0;
/// Walked at wakeup from the sleeping task (BTF tracepoint).
const BT_WALK: u8 = 1;
/// At wakeup, from the stack cache when it can vouch for it (BTF tracepoint, `bpf_loop`).
const BT_CACHED: u8 = 2;
/// The same without `bpf_loop` and `bpf_task_pt_regs` (before 5.17 and 5.15): the stack is
/// scanned in a bounded loop, the user registers found from the task's stack.
const BT_CACHED_BOUNDED: u8 = 3;

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn sched_wakeup(ctx: RawTracePointContext) -> i32 {
    try_sched_wakeup::<true>(&ctx).unwrap_or(1)
}

/// `sched_wakeup` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn sched_wakeup_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_wakeup::<false>(&ctx).unwrap_or(1)
}

fn try_sched_wakeup<const CAS: bool>(ctx: &RawTracePointContext) -> Result<i32, i32> {
    // TP_PROTO(struct task_struct *p)
    let wakee: *const u8 = ctx.arg(0);
    wake::<_, CAS, BT_SWITCH_OUT>(ctx, wakee, core::ptr::null_mut())
}

/// The wakeup program where BTF tracepoints and `bpf_loop` exist: takes the backtrace of a
/// counted sleep from the wakee, through the stack cache.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<true, BT_CACHED>(&ctx).unwrap_or(1)
}

/// The stack cache without `bpf_loop` and `bpf_task_pt_regs`.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_bounded(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<true, BT_CACHED_BOUNDED>(&ctx).unwrap_or(1)
}

/// `sched_wakeup_btf_bounded` for kernels without BPF compare-and-swap (before 5.12).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_bounded_nocas(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<false, BT_CACHED_BOUNDED>(&ctx).unwrap_or(1)
}

/// BTF tracepoint wakeup that walks every counted sleep's stack (no `bpf_loop`).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_walk(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<true, BT_WALK>(&ctx).unwrap_or(1)
}

/// `sched_wakeup_btf_walk` for kernels without BPF compare-and-swap (before 5.12).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_walk_nocas(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<false, BT_WALK>(&ctx).unwrap_or(1)
}

/// The wakeup program where BTF tracepoints exist: the same as `sched_wakeup`, and it takes the
/// backtrace of a counted sleep from the wakee.
fn try_sched_wakeup_btf<const CAS: bool, const BT: u8>(
    ctx: &BtfTracePointContext,
) -> Result<i32, i32> {
    // TP_PROTO(struct task_struct *p)
    let wakee: *mut task_struct = ctx.arg(0);
    wake::<_, CAS, BT>(ctx, wakee.cast_const().cast(), wakee)
}

/// A wakeup of `task`: ends its open sleep; `stack_of` (null for the raw program) is the same
/// task as a pointer the kernel trusts for taking its backtrace.
#[inline(always)]
fn wake<C: EbpfContext, const CAS: bool, const BT: u8>(
    ctx: &C,
    task: *const u8,
    stack_of: *mut task_struct,
) -> Result<i32, i32> {
    // The BTF tracepoint's task is one the verifier knows: a plain load.
    let tid = if BT == BT_SWITCH_OUT {
        read_field::<i32>(task, TASK_PID_OFF.load())?
    } else {
        read_btf_field::<i32>(task, TASK_PID_OFF.load())
    } as u32;
    let Some(entry) = task_table::get(tid) else {
        if DEBUG_CHECKS.load() == 1 && tid != 0 && watched(task) {
            // A sleep latprof never saw begin: the task slept before latprof attached.
            anomaly(ctx, Counter::DebugWakeupWithoutSleep, tid, 0);
        }
        return Ok(0);
    };
    let hide = DEBUG_HIDE_WAKEUPS.load();
    let one_in = hide & !HIDE_UNLOGGED;
    if one_in != 0 && unsafe { bpf_get_prandom_u32() } % one_in == 0 {
        // As a kernel that hides tasks from tracing would: this wakeup never arrives, in a
        // gap of no length logged as made on purpose (where it hid a sleep's end).
        // SAFETY: as below.
        if hide & HIDE_UNLOGGED == 0 && unsafe { (*entry).sleep_kind } != SLEEP_NONE {
            let now = unsafe { bpf_ktime_get_ns() };
            log_hidden(HIDDEN_GAP_DEBUG, ids(tid, 0), now, now, 0);
        }
        return Ok(0);
    }
    // SAFETY: the wakee is not running; ttwu serializes wakeups of one task (pi_lock).
    let entry = unsafe { &mut *entry };
    // The waker `sched_waking` noted for this wakeup, taken whether a sleep ends or not.
    let waker = wakers::take(entry);
    if entry.sleep_kind != SLEEP_NONE {
        count(Counter::Wakeups);
        // One clock read for the whole event: the sleep's end, and the start of the wait for a
        // CPU (the task is on a run queue already when the tracepoint fires).
        let now = unsafe { bpf_ktime_get_ns() };
        end_sleep::<C, CAS, BT>(ctx, tid, entry, task, stack_of, waker, now);
        if RUNQ.load() == 1 {
            // From now on the task waits for a CPU.
            entry.runq_start_ns = now;
        }
    }
    Ok(0)
}

/// Whether latprof tracks `task`'s sleeps at all (not latprof's own threads, and with `--pid`
/// only that process's): a wakeup of a task it does not track is no anomaly.
#[inline(always)]
fn watched(task: *const u8) -> bool {
    let Ok(tgid) = read_field::<i32>(task, TASK_TGID_OFF.load()) else {
        return true;
    };
    let tgid = tgid as u32;
    let filter = FILTER_TGID.load();
    tgid != SELF_TGID.load() && (filter == 0 || tgid == filter)
}

/// Ends the open sleep of `entry` (of `task`) now: filters it like latencytop and accounts
/// it. With a `wakee` (and `STACK_AT_WAKEUP`), a counted sleep's backtrace is taken from it
/// now.
fn end_sleep<C: EbpfContext, const CAS: bool, const BT: u8>(
    ctx: &C,
    tid: u32,
    entry: &mut TaskState,
    task: *const u8,
    wakee: *mut task_struct,
    waker: u32,
    now: u64,
) {
    let kind = entry.sleep_kind;
    entry.sleep_kind = SLEEP_NONE;
    if DEBUG_CHECKS.load() == 1 && now < entry.sleep_start_ns {
        anomaly(
            ctx,
            Counter::DebugTimeBackwards,
            tid,
            entry.sleep_start_ns - now,
        );
    }
    let delta = now.saturating_sub(entry.sleep_start_ns);
    let verdict = sleep_verdict(kind, delta, MIN_SLEEP_NS.load(), INTER_CUTOFF_NS.load());
    match verdict {
        SleepVerdict::TooShort => short_sleep(ids(tid, entry.tgid), entry.sleep_start_ns, now),
        SleepVerdict::OverCutoff => {
            count(Counter::SkippedCutoff);
            if CHAINS_ON.load() == 1 {
                // A waker's sleep all the same: the time a task it wakes waits behind it.
                chains::ended(entry, 0, now, waker);
            }
        }
        // `--debug-defect drop-sleep`: lost without a trace.
        SleepVerdict::Count if defects::hit(DEFECT_DROP_SLEEP) => {}
        SleepVerdict::Count => {
            let delta = defects::duration(delta);
            let stack = if skipped(SKIP_STACK) {
                NO_STACK
            } else if entry.sleep_stack == DEFERRED_STACK {
                let stack = if wakee.is_null() {
                    NO_STACK
                } else if BT == BT_CACHED {
                    sleeping_stack::<C, true>(ctx, tid, wakee, entry)
                } else if BT == BT_CACHED_BOUNDED {
                    sleeping_stack::<C, false>(ctx, tid, wakee, entry)
                } else if BT == BT_WALK {
                    task_stack(wakee)
                } else {
                    NO_STACK
                };
                if stack == NO_STACK {
                    count(Counter::StackMissing);
                    if DEBUG_CHECKS.load() == 1 {
                        anomaly(ctx, Counter::DebugStackFailed, tid, 0);
                    }
                }
                stack
            } else {
                entry.sleep_stack
            };
            let in_global = if BT == BT_SWITCH_OUT {
                sleep_in_global(entry, task)
            } else {
                sleep_in_global_with(entry, has_mm_btf(task))
            };
            // With the sleeper's user backtrace, the cause is the pair.
            let stack = if USER_STACKS_ON.load() == 1 {
                ustacks::cause(stack, entry.sleep_ustack, entry)
            } else {
                stack
            };
            let cause = defects::cause(stack_for_state(stack, kind));
            defects::waker(entry, tid);
            account::<CAS>(entry, cause, delta, in_global);
            if WAKERS_ON.load() == 1 {
                // A call the verifier drops without --wakers.
                wakers::add(entry, waker, cause, delta, tid);
            }
            if CHAINS_ON.load() == 1 {
                if waker == WAKER_TASK {
                    chains::add(entry, cause, delta);
                }
                chains::ended(entry, cause, now, waker);
            }
            count(Counter::Counted);
            spike::<CAS>(tid, entry, stack, delta, kind, now, waker);
        }
    }
}

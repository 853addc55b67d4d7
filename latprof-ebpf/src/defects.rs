//! `--debug-defect NAME`: wrong answers made on purpose, one kind per run, in about one event
//! in `DEBUG_DEFECT_ONE_IN` of its kind (`latprof_common::DEFECTS` says what each does). Every
//! call sits behind `DEBUG_DEFECT`, a setting: a run without the flag holds none of this code
//! after the verifier, and never touches `DEFECT_LAST`.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use latprof_common::{
    DEFECT_CHAIN_LINK, DEFECT_DURATION, DEFECT_RUNQ_AS_SLEEP, DEFECT_WRONG_CAUSE,
    DEFECT_WRONG_CGROUP, DEFECT_WRONG_WAKER, NO_STACK, TaskState,
};

use crate::{maps::DEFECT_LAST, settings::DEBUG_DEFECT, settings::DEBUG_DEFECT_ONE_IN};

/// The root cgroup's id on cgroup v2: where `DEFECT_WRONG_CGROUP` counts a sleep.
const ROOT_CGROUP: u64 = 1;

/// Whether this run injects `kind` (a constant the verifier folds).
#[inline(always)]
pub(crate) fn on(kind: u32) -> bool {
    DEBUG_DEFECT.load() == kind
}

/// Whether this event of `kind` is one of the about one in N made wrong.
#[inline(always)]
pub(crate) fn hit(kind: u32) -> bool {
    if !on(kind) {
        return false;
    }
    let one_in = DEBUG_DEFECT_ONE_IN.load();
    // SAFETY: a helper without arguments.
    one_in != 0 && unsafe { bpf_get_prandom_u32() } % one_in == 0
}

/// A counted sleep's duration, doubled by `DEFECT_DURATION`.
#[inline(always)]
pub(crate) fn duration(delta: u64) -> u64 {
    if hit(DEFECT_DURATION) {
        delta.saturating_mul(2)
    } else {
        delta
    }
}

/// This CPU's slot `i` of `DEFECT_LAST`: 0, the cause of the last sleep counted here; 1, the
/// last other cause counted before it (0: none yet).
#[inline(always)]
fn last(i: u32) -> u64 {
    DEFECT_LAST.get(i).copied().unwrap_or(0)
}

/// Sets this CPU's slot `i` of `DEFECT_LAST`.
#[inline(always)]
fn set_last(i: u32, cause: u64) {
    if let Some(slot) = DEFECT_LAST.get_ptr_mut(i) {
        // SAFETY: this CPU's slot; programs on one CPU do not run concurrently.
        unsafe { *slot = cause };
    }
}

/// A counted sleep's cause: under `DEFECT_WRONG_CAUSE`, now and then the last other cause
/// counted on this CPU (never its own: a task that sleeps again and again where it slept
/// before would otherwise be told its own cause nearly every time), or no backtrace at all
/// where the CPU counted no other (a `--pid` run of a workload with one cause). Under it and
/// `DEFECT_RUNQ_AS_SLEEP` the CPU remembers the true ones.
#[inline(always)]
pub(crate) fn cause(cause: u64) -> u64 {
    if !on(DEFECT_WRONG_CAUSE) && !on(DEFECT_RUNQ_AS_SLEEP) {
        return cause;
    }
    let newest = last(0);
    let other = if newest == cause {
        // Slot 1 differs from slot 0 whenever it is set.
        last(1)
    } else {
        set_last(1, newest);
        set_last(0, cause);
        newest
    };
    if hit(DEFECT_WRONG_CAUSE) {
        if other != 0 { other } else { NO_STACK }
    } else {
        cause
    }
}

/// Under `DEFECT_RUNQ_AS_SLEEP`, now and then: the cause a run-queue wait is counted under as
/// a sleep (the last counted on this CPU); `None`: counted as the wait it is.
#[inline(always)]
pub(crate) fn runq_as_sleep() -> Option<u64> {
    if !hit(DEFECT_RUNQ_AS_SLEEP) {
        return None;
    }
    match last(0) {
        0 => None,
        cause => Some(cause),
    }
}

/// A sleep's cgroup: the root under `DEFECT_WRONG_CGROUP`, now and then.
#[inline(always)]
pub(crate) fn cgroup(cgroup: u64) -> u64 {
    if hit(DEFECT_WRONG_CGROUP) {
        ROOT_CGROUP
    } else {
        cgroup
    }
}

/// Under `DEFECT_WRONG_WAKER`, now and then: the sleep of `entry` (task `tid`) is told as woken
/// by its task itself.
#[inline(always)]
pub(crate) fn waker(entry: &mut TaskState, tid: u32) {
    if hit(DEFECT_WRONG_WAKER) {
        entry.waker_tid = tid;
        entry.waker_tgid = entry.tgid;
        entry.waker_comm = entry.comm;
    }
}

/// A chain link's waker cause: under `DEFECT_CHAIN_LINK`, now and then the sleeper's own
/// previous sleep's (its most recent ended one) where there is one.
#[inline(always)]
pub(crate) fn chain_link(entry: &TaskState, waker_cause: u64) -> u64 {
    if waker_cause == 0 || !hit(DEFECT_CHAIN_LINK) {
        return waker_cause;
    }
    let last = entry.recent_next.wrapping_sub(1) as usize & (entry.recent.len() - 1);
    match entry.recent[last].cause {
        0 => waker_cause,
        own => own,
    }
}

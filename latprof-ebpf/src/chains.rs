//! Wait chains (`--chains`): what a sleep's waker was doing while the sleep lasted. Each task
//! keeps its last `RECENT_SLEEPS` ended sleeps (`ended`) and, once it has a CPU again, its
//! wait for one after the most recent (`got_cpu`). When it wakes a sleeping task,
//! `sched_waking` notes in the wakee's entry how much of the wakee's sleep so far those
//! sleeps overlapped, and under which cause (`note`): the waker's sleeps all ended before the
//! waking, so no clock is read. The wakee's wakeup adds its counted sleep to `CHAINS` (`add`):
//! the part the waker slept, the part it waited for a CPU after, the rest it ran. One level per
//! wakeup: user space joins a waker cause's own rows below it.

use aya_ebpf::bindings::BPF_NOEXIST;
use latprof_common::{
    CHAIN_RAN, CHAIN_SLEPT, CHAIN_UNCOUNTED, ChainKey, ChainValue, Counter, RECENT_SLEEPS,
    SLEEP_NONE, TaskState, WAKER_TASK,
};

use crate::{
    defects,
    maps::{CHAINS, count},
    shared, task_table,
};

// The ring's index is masked.
const _: () = assert!(RECENT_SLEEPS.is_power_of_two());

/// A sleep of the task of `entry` ended at `now`: its record id `cause` (0: not counted),
/// woken by a `WAKER_*` kind `waker` (the task's tid in the entry).
#[inline(always)]
pub(crate) fn ended(entry: &mut TaskState, cause: u64, now: u64, waker: u32) {
    let i = entry.recent_next as usize & (RECENT_SLEEPS - 1);
    let start = entry.sleep_start_ns;
    let waker_tid = if waker == WAKER_TASK {
        entry.waker_tid
    } else {
        0
    };
    // Field by field, in place: no copy on the wakeup program's stack (verifier rule 1 in
    // `stack_cache`).
    let s = &mut entry.recent[i];
    s.cause = cause;
    s.start_ns = start;
    s.end_ns = now;
    s.waker_tid = waker_tid;
    entry.recent_next = entry.recent_next.wrapping_add(1);
    entry.last_runq_ns = 0;
}

/// The task of `entry` got a CPU after waiting `delta` ns since its wakeup.
#[inline(always)]
pub(crate) fn got_cpu(entry: &mut TaskState, delta: u64) {
    entry.last_runq_ns = delta;
}

/// How much of the time from `since` on `[start, end]` (which has ended) overlapped.
#[inline(always)]
fn after(start: u64, end: u64, since: u64) -> u64 {
    let start = if start > since { start } else { since };
    end.saturating_sub(start)
}

/// In `sched_waking`: the waking task (`waker_tid`, the current one) notes in the wakee's
/// entry (`wakee_tid`'s) how much of the wakee's sleep its recent sleeps overlapped (0 where
/// the wakee's sleep has not begun: it is still leaving its CPU). A sleep of the waker's that
/// the wakee ended is not behind the wakee's wait: the wakee ran until it slept, and the waker's
/// sleep lasted past that only while its wakeup was on its way (queued to its CPU).
#[inline(always)]
pub(crate) fn note(wakee: &mut TaskState, wakee_tid: u32, waker_tid: u32) {
    wakee.chain_behind_ns = 0;
    wakee.chain_runq_ns = 0;
    wakee.chain_cause = 0;
    if wakee.sleep_kind == SLEEP_NONE {
        return;
    }
    let Some(waker) = task_table::get(waker_tid) else {
        // Never slept while latprof watched it.
        return;
    };
    // SAFETY: the waker is running: none of its own events writes these fields now.
    let waker = unsafe { &*waker };
    let since = wakee.sleep_start_ns;
    let mut most = 0u64;
    let mut behind = 0u64;
    for i in 0..RECENT_SLEEPS {
        let s = &waker.recent[i];
        if s.waker_tid == wakee_tid {
            continue;
        }
        let ns = after(s.start_ns, s.end_ns, since);
        behind += ns;
        if ns > most {
            most = ns;
            wakee.chain_cause = waker.recent[i].cause;
        }
    }
    wakee.chain_behind_ns = behind;
    let last = waker.recent_next.wrapping_sub(1) as usize & (RECENT_SLEEPS - 1);
    let end = waker.recent[last].end_ns;
    if end != 0 {
        wakee.chain_runq_ns = after(end, end.saturating_add(waker.last_runq_ns), since);
    }
}

/// Adds the counted sleep of `entry` that lasted `delta` ns, of record id `cause`, woken by a
/// task, to its waker's part. Not inlined, like `wakers::add` (its key and value would enlarge
/// the wakeup program's frame on the stack cache's call chain).
#[inline(never)]
pub(crate) fn add(entry: &TaskState, cause: u64, delta: u64) {
    // The waker's parts end at the waking; the wakeup came a little later.
    let behind = entry.chain_behind_ns.min(delta);
    let runq = entry.chain_runq_ns.min(delta - behind);
    let link = if behind == 0 {
        CHAIN_RAN
    } else if entry.chain_cause == 0 {
        CHAIN_UNCOUNTED
    } else {
        CHAIN_SLEPT
    };
    let key = ChainKey {
        cause,
        waker_cause: if link == CHAIN_SLEPT {
            defects::chain_link(entry, entry.chain_cause)
        } else {
            0
        },
        sleeper_tgid: entry.tgid,
        waker_tgid: entry.waker_tgid,
        link,
        pad: 0,
    };
    if let Some(v) = CHAINS.get_ptr_mut(&key) {
        // SAFETY: this CPU's value; programs on one CPU do not run concurrently.
        unsafe {
            (*v).count += 1;
            (*v).total_ns += delta;
            (*v).behind_ns += behind;
            (*v).runq_ns += runq;
        }
        return;
    }
    let value = ChainValue {
        count: 1,
        total_ns: delta,
        behind_ns: behind,
        runq_ns: runq,
        comm: entry.waker_comm,
    };
    shared::write();
    if CHAINS.insert(&key, &value, u64::from(BPF_NOEXIST)).is_err() {
        count(Counter::ChainTableFull);
    }
}

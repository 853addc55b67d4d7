//! `sched_switch`: the task leaving the CPU in S or D state starts a sleep (its backtrace
//! walked here, or deferred to the wakeup); the task coming in ends its run-queue wait.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel_buf,
    },
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use latprof_common::{
    CACHE_ENTRIES, Counter, DEFERRED_STACK, HIDDEN_GAP, LatencyRecord, NO_STACK, NO_USER,
    RECENT_SLEEPS, RUNQ_STACK, SKIP_SWITCH_CHECK, SLEEP_NONE, SPIKE_RUNQ, TASK_FLAG_EXITING,
    TASK_FLAG_FIRST_SLEEP, TASK_FLAG_KTHREAD, TASK_RECORDS, TaskState, TickCounter, WAKER_UNSEEN,
    sleep_kind,
};

use crate::{
    account::{account, runq_in_global},
    chains,
    debug::anomaly,
    defects,
    exit::switched_out_dead,
    maps::{
        CGROUP_FILTER, COUNTERS, HIDING_SEEN, LAST_SWITCH, SCRATCH, count, ids, log_hidden,
        tick_count,
    },
    recover::{note_sleep_start, recover},
    settings::{
        CGROUP_KN_OFF, CGROUPS_ON, CHAINS_ON, CSS_SET_DFL_CGRP_OFF, DEBUG_CHECKS, FILTER_CGROUPS,
        FILTER_TGID, FORCE_REJECT, KERNFS_NODE_ID_OFF, MIN_SLEEP_NS, RUNQ, SELF_TGID,
        STACK_AT_WAKEUP, SWITCH_HAS_PREV_STATE, TASK_CGROUPS_OFF, TASK_COMM_OFF, TASK_FLAGS_OFF,
        TASK_MM_OFF, TASK_PID_OFF, TASK_STATE_OFF, USER_STACKS_ON, btf_pid_tgid, read_btf_field,
        read_field, skipped,
    },
    spikes::spike,
    stacks::take_stack,
    task_table, ustacks,
};

/// `task_struct::flags` bits (`include/linux/sched.h`, the same since 2.6): a task that is
/// exiting, a kernel thread.
const PF_EXITING: u32 = 0x4;
const PF_KTHREAD: u32 = 0x0020_0000;

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    try_sched_switch::<_, true, false>(&ctx).unwrap_or(1)
}

/// `sched_switch` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_switch::<_, false, false>(&ctx).unwrap_or(1)
}

/// `sched_switch` on the BTF tracepoint (where the BTF wakeup programs run): its tasks are
/// ones the verifier knows, so their fields are plain loads, not helper calls.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> i32 {
    try_sched_switch::<_, true, true>(&ctx).unwrap_or(1)
}

/// `sched_switch_btf` for kernels without BPF compare-and-swap (before 5.12).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf_nocas(ctx: BtfTracePointContext) -> i32 {
    try_sched_switch::<_, false, true>(&ctx).unwrap_or(1)
}

/// Argument `n` of the tracepoint: the raw and the BTF tracepoint's contexts are both the
/// arguments as 8-byte slots (on the BTF one, the verifier types the tasks).
#[inline(always)]
fn arg<C: EbpfContext>(ctx: &C, n: usize) -> u64 {
    // SAFETY: the context holds the tracepoint's arguments; n is one of them.
    unsafe { *ctx.as_ptr().cast::<u64>().add(n) }
}

/// A field of a task of the tracepoint: a plain load on the BTF one.
#[inline(always)]
fn task_field<T: Copy, const BTF: bool>(task: *const u8, offset: u32) -> Result<T, i32> {
    if BTF {
        Ok(read_btf_field(task, offset))
    } else {
        read_field(task, offset)
    }
}

fn try_sched_switch<C: EbpfContext, const CAS: bool, const BTF: bool>(ctx: &C) -> Result<i32, i32> {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next
    //          [, unsigned int prev_state])
    let preempt = arg(ctx, 0);
    let state: u64 = if SWITCH_HAS_PREV_STATE.load() == 1 {
        arg(ctx, 3) & 0xffff_ffff
    } else {
        let prev = arg(ctx, 1) as *const u8;
        u64::from(task_field::<u32, BTF>(prev, TASK_STATE_OFF.load())?)
    };
    let kind = sleep_kind(preempt & 1 != 0, state);
    tick_count(TickCounter::Switches);
    // One clock read for the whole event.
    let now = unsafe { bpf_ktime_get_ns() };
    note_switch(ctx, now);
    if FORCE_REJECT.load() == 1
        && let Some(slot) = COUNTERS.get_ptr(0)
    {
        // SAFETY: never runs: the verifier rejects the program for this read (see FORCE_REJECT).
        let past = unsafe { core::ptr::read_volatile(slot.cast::<u8>().wrapping_add(4096)) };
        return Ok(i32::from(past));
    }

    // The task coming in stops waiting for the CPU.
    if RUNQ.load() == 1 {
        runq_end::<C, CAS, BTF>(ctx, now)?;
    }

    if kind == SLEEP_NONE {
        if state & TASK_DEAD != 0 {
            // Its last switch: an entry made after its exit began goes with it.
            switched_out_dead::<C, CAS>(ctx, now);
            return Ok(0);
        }
        if preempt & 1 == 0 && state & TASK_RTLOCK_WAIT != 0 && traced(bpf_get_current_pid_tgid()) {
            // PREEMPT_RT's wait for a sleeping spinlock: a voluntary switch, but neither an
            // interruptible nor an uninterruptible sleep, which latencytop does not count
            // either. Counted, so that a task's voluntary switches add up.
            count(Counter::RtlockWaits);
        }
        return Ok(0);
    }
    switch_out::<C, CAS, BTF>(ctx, kind, now)
}

/// `TASK_DEAD`: the task's last switch (`do_task_dead`).
const TASK_DEAD: u64 = 0x80;

/// `TASK_RTLOCK_WAIT` (Linux 5.15 on, used by PREEMPT_RT only; unused before).
const TASK_RTLOCK_WAIT: u64 = 0x1000;

/// Whether the current task (`pid_tgid`, as `bpf_get_current_pid_tgid` gives it) is one
/// latprof traces: not the idle task, not latprof itself, and in the `--pid` and `--cgroup`
/// filters.
#[inline(always)]
fn traced(pid_tgid: u64) -> bool {
    let (tid, tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    let filter = FILTER_TGID.load();
    tid != 0
        && tgid != SELF_TGID.load()
        && (filter == 0 || tgid == filter)
        && (FILTER_CGROUPS.load() == 0 || in_filtered_cgroup())
}

/// Finds switches the kernel ran no program for: the task going out is not the one this CPU's
/// last seen switch put in. Some kernels run no BPF program while certain tasks are current;
/// the switch away from such a task, and wakeups it did, are then invisible. Costs a per-CPU
/// lookup, two compares and a store; the rest only when a gap is found, which is logged (from
/// this CPU's last seen switch to now) for user space to check lost sleeps against.
#[inline(always)]
fn note_switch<C: EbpfContext>(ctx: &C, now: u64) {
    let prev = arg(ctx, 1);
    let next = arg(ctx, 2);
    if skipped(SKIP_SWITCH_CHECK) {
        return;
    }
    let Some(slot) = LAST_SWITCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; programs on one CPU do not run concurrently.
    let slot = unsafe { &mut *slot };
    if slot.last_in != 0 && slot.last_in != prev {
        count(Counter::SwitchesHidden);
        // From now on sleeps keep what recovering them needs (see `recover`).
        if let Some(seen) = HIDING_SEEN.get_ptr_mut(0) {
            // SAFETY: a u32 in an array map; a racing writer writes the same 1. Written once:
            // every sleep reads it, and a write would take its cache line from every CPU.
            unsafe {
                if *seen == 0 {
                    *seen = 1;
                }
            }
        }
        // The task the CPU ran when latprof stopped seeing it (it may have exited since: a
        // failed read leaves the last name).
        if let Ok(tid) = read_field::<i32>(slot.last_in as *const u8, TASK_PID_OFF.load()) {
            slot.hidden_tid = tid as u32;
            // Straight into the slot (no copy on the program's stack); a failed read leaves
            // no other task's name beside this tid.
            let comm = (slot.last_in as *const u8).wrapping_add(TASK_COMM_OFF.load() as usize);
            // SAFETY: a probe read fails safely on a bad address.
            if unsafe { bpf_probe_read_kernel_buf(comm, &mut slot.hidden_comm) }.is_err() {
                slot.hidden_comm = [0; 16];
            }
        }
        log_hidden(HIDDEN_GAP, ids(slot.hidden_tid, 0), slot.last_ns, now, 0);
    }
    slot.last_in = next;
    // After the gap's event: see `CpuSwitch::last_ns`.
    slot.last_ns = now;
}

/// Ends the run-queue wait of the task switched in.
fn runq_end<C: EbpfContext, const CAS: bool, const BTF: bool>(
    ctx: &C,
    now: u64,
) -> Result<(), i32> {
    let next = arg(ctx, 2) as *const u8;
    let next_tid = task_field::<i32, BTF>(next, TASK_PID_OFF.load())? as u32;
    if next_tid != 0
        && let Some(entry) = task_table::get(next_tid)
    {
        // SAFETY: next is not running yet; only its own events write its entry.
        let entry = unsafe { &mut *entry };
        if entry.runq_start_ns != 0 {
            let delta = now.saturating_sub(entry.runq_start_ns);
            entry.runq_start_ns = 0;
            if CHAINS_ON.load() == 1 {
                chains::got_cpu(entry, delta);
            }
            if delta >= MIN_SLEEP_NS.load()
                && let Some(cause) = defects::runq_as_sleep()
            {
                // `--debug-defect runq-as-sleep`: the wait counted as a sleep.
                account::<CAS>(entry, cause, delta, runq_in_global(entry));
                count(Counter::Counted);
            } else if delta >= MIN_SLEEP_NS.load() {
                account::<CAS>(entry, RUNQ_STACK, delta, runq_in_global(entry));
                count(Counter::RunqCounted);
                spike::<CAS>(
                    next_tid,
                    entry,
                    RUNQ_STACK,
                    delta,
                    SPIKE_RUNQ,
                    now,
                    WAKER_UNSEEN,
                );
            }
        }
    }
    Ok(())
}

/// The task switched out in S or D state starts a sleep.
#[expect(clippy::similar_names, reason = "tid and tgid are the kernel's names")]
fn switch_out<C: EbpfContext, const CAS: bool, const BTF: bool>(
    ctx: &C,
    kind: u32,
    now: u64,
) -> Result<i32, i32> {
    // prev is the current task at sched_switch: on the BTF tracepoint, one the verifier
    // knows, its ids two plain loads.
    let pid_tgid = if BTF {
        btf_pid_tgid(arg(ctx, 1) as *const u8)
    } else {
        bpf_get_current_pid_tgid()
    };
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(pid_tgid) {
        return Ok(0);
    }
    let entry = match task_table::get(tid) {
        Some(entry) => entry,
        None => match new_task::<CAS>(tid, tgid)? {
            Some(entry) => entry,
            None => return Ok(0),
        },
    };
    // Where the wakeup program can take the sleeping task's backtrace, it does, and only if
    // the sleep counts: a walk from here costs more (it unwinds the tracing frames too) and
    // cannot use the stack cache, whose stack pointer is saved only after this program.
    let stack = if STACK_AT_WAKEUP.load() == 1 {
        DEFERRED_STACK
    } else {
        let stack = take_stack(ctx);
        if stack == NO_STACK {
            count(Counter::StackMissing);
            if DEBUG_CHECKS.load() == 1 {
                anomaly(ctx, Counter::DebugStackFailed, tid, 0);
            }
        }
        stack
    };
    // prev, the current task: on the BTF tracepoint, one the verifier knows.
    let task = if BTF {
        arg(ctx, 1) as *const u8
    } else {
        (unsafe { bpf_get_current_task() }) as *const u8
    };
    // SAFETY: the entry belongs to the current task; only its own events write it.
    let entry = unsafe { &mut *entry };
    if entry.sleep_kind != SLEEP_NONE {
        // The previous sleep never saw its wakeup: the kernel hid it (and its waker noted
        // there, if any, is not this sleep's).
        recover::<CAS>(tid, entry, task, now);
        entry.waker_kind = WAKER_UNSEEN;
    }
    entry.sleep_stack = stack;
    entry.sleep_kind = kind;
    entry.sleep_start_ns = now;
    if USER_STACKS_ON.load() == 1 {
        // Here or never: the sleeper is current only now. A kernel thread has no user part.
        entry.sleep_ustack = if entry.flags & TASK_FLAG_KTHREAD == 0 {
            ustacks::take::<CAS>(tid, tgid, task, entry)
        } else {
            NO_USER
        };
    }
    if CGROUPS_ON.load() == 1 {
        entry.cgroup = cgroup_id::<BTF>(task);
    }
    note_sleep_start::<BTF>(entry, task);
    count(Counter::SleepsTracked);
    Ok(0)
}

/// The cgroup v2 id of `task`, the current one: on the BTF tracepoint four plain loads down
/// `task->cgroups->dfl_cgrp->kn->id` (a null on the way reads 0), else the helper (21 ns more
/// per run of `sched_switch` on the ping-pong).
#[inline(always)]
fn cgroup_id<const BTF: bool>(task: *const u8) -> u64 {
    let offs = [
        TASK_CGROUPS_OFF.load(),
        CSS_SET_DFL_CGRP_OFF.load(),
        CGROUP_KN_OFF.load(),
        KERNFS_NODE_ID_OFF.load(),
    ];
    if !BTF || offs.contains(&0) {
        // SAFETY: a helper without arguments.
        return unsafe { bpf_get_current_cgroup_id() };
    }
    let css_set = read_btf_field::<*const u8>(task, offs[0]);
    let cgroup = read_btf_field::<*const u8>(css_set, offs[1]);
    let kn = read_btf_field::<*const u8>(cgroup, offs[2]);
    read_btf_field::<u64>(kn, offs[3])
}

/// Whether the current task is in one of `--cgroup`'s cgroups or below one.
#[inline(always)]
fn in_filtered_cgroup() -> bool {
    let n = FILTER_CGROUPS.load();
    for i in 0..8 {
        if i >= n {
            break;
        }
        if CGROUP_FILTER.current_task_under_cgroup(i) == Ok(true) {
            return true;
        }
    }
    false
}

/// Creates the entry of the current task; `None` when the table is full.
#[expect(clippy::similar_names, reason = "tid and tgid are the kernel's names")]
fn new_task<const CAS: bool>(tid: u32, tgid: u32) -> Result<Option<*mut TaskState>, i32> {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let flags: u32 = read_field(task, TASK_FLAGS_OFF.load())?;
    let mm: u64 = read_field(task, TASK_MM_OFF.load())?;
    let kind = if flags & PF_EXITING != 0 {
        // Its sleeps count as the kernel counts them (for the task; in the global table only
        // while it still has its memory map). Whether it has passed `sched_process_exit` is
        // not known: `sched_process_free` retires the entry. An exiting task without a memory
        // map is a kernel thread only if the kernel says so.
        TASK_FLAG_EXITING
            | if flags & PF_KTHREAD != 0 {
                TASK_FLAG_KTHREAD
            } else {
                0
            }
    } else if mm == 0 {
        TASK_FLAG_KTHREAD
    } else {
        0
    };
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let entry = if task_table::slots_on() {
        task_table::claim::<CAS>(tid).inspect(|&slot| {
            // SAFETY: the slot this CPU claimed.
            let e = unsafe { &mut *slot };
            fill_entry(e, task, tgid, kind, comm);
            // Its last task's records, merged at its exit, must not show as this one's to a
            // read that sees `nr_records` grow before the record it counts.
            for r in 0..TASK_RECORDS {
                e.records[r] = LatencyRecord {
                    stack_id: 0,
                    count: 0,
                    total_ns: 0,
                    max_ns: 0,
                    cgroup: 0,
                };
            }
            task_table::publish(tid, slot);
        })
    } else {
        let template = SCRATCH.get_ptr_mut(0).ok_or(1)?;
        // SAFETY: per-CPU scratch.
        let template = unsafe { &mut *template };
        fill_entry(template, task, tgid, kind, comm);
        template.slot_tid = 0;
        task_table::insert_hash(tid, template)
    };
    let Some(entry) = entry else {
        count(Counter::TaskTableFull);
        return Ok(None);
    };
    if kind & TASK_FLAG_EXITING != 0 {
        count(Counter::ExitingFirstSeen);
    }
    Ok(Some(entry))
}

/// Fills a new entry of the current task (`task`, its process `tgid`, its first-seen `flags`).
/// Stale records past `nr_records` are never read.
#[inline(always)]
fn fill_entry(e: &mut TaskState, task: *const u8, tgid: u32, flags: u32, comm: [u8; 16]) {
    e.sleep_start_ns = 0;
    e.runq_start_ns = 0;
    e.sleep_stack = NO_STACK;
    e.sleep_kind = SLEEP_NONE;
    e.tgid = tgid;
    e.flags = flags | TASK_FLAG_FIRST_SLEEP;
    e.task_low = task as u64 as u32;
    e.comm = comm;
    e.nr_records = 0;
    e.task_only = 0;
    // 0: the sleep's start did not note what recovering it needs.
    e.sleep_exec_ns = 0;
    e.sleep_run_delay_ns = 0;
    e.cgroup = 0;
    e.sleep_flags = 0;
    // A slot holds its last task's: none of it is this one's (`--user-stacks`' memo,
    // the waker noted, the chains' overlap).
    e.user_mm = 0;
    e.user_exec = 0;
    e.user_layout = 0;
    e.user_cause = 0;
    e.user_top = 0;
    e.waker_stack = 0;
    e.waker_tgid = 0;
    e.waker_tid = 0;
    e.waker_comm = [0; 16];
    e.chain_cause = 0;
    e.chain_behind_ns = 0;
    e.chain_runq_ns = 0;
    e.waker_kind = WAKER_UNSEEN;
    e.waker_pending.count = 0;
    // No sleep ended yet (`chains`); the waker's part is noted at each waking.
    for r in 0..RECENT_SLEEPS {
        // An end of 0 overlaps nothing.
        e.recent[r].end_ns = 0;
    }
    e.recent_next = 0;
    e.last_runq_ns = 0;
    let cache = &mut e.stack_cache;
    cache.recent = [NO_STACK; CACHE_ENTRIES];
    cache.recent_next = 0;
    cache.next = 0;
    for c in 0..CACHE_ENTRIES {
        cache.entries[c].words = 0;
    }
}

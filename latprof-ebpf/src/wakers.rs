//! Who ended each sleep. `sched_wakeup` is no place to ask: since Linux 6.0 a wakeup of a task
//! on another CPU is queued to that CPU (TTWU_QUEUE) and traced there, in an inter-processor
//! interrupt or the idle task, whoever woke it. `sched_waking` fires in `try_to_wake_up` on the
//! waker's side on every kernel: `sched_waking` notes the waker in the wakee's entry and the
//! wakeup program takes it (`take`) when it accounts the sleep, into `WAKERS`.
//!
//! A waking from an interrupt is not the interrupted task's: the kernel's preempt count says
//! which context runs (hard interrupt, softirq being served, NMI). On x86-64 it is read from
//! this CPU's per-CPU variable, whose address is this CPU's run queue (reached from the current
//! task, checked against its CPU number) plus the distance between the two per-CPU variables
//! that user space found in BTF or kallsyms (`PC_FROM_RQ`); on arm64 from the current task's
//! thread_info (`TASK_PREEMPT_OFF`). PREEMPT_RT serves softirqs in task
//! context and marks it in the task (`softirq_disable_cnt`). A timer's callback (hrtimer or
//! timer wheel) is told by the timer tracepoints, which mark the level of context (task,
//! softirq, hard interrupt, NMI) each callback runs at while it runs.

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, generated::bpf_get_current_task_btf,
    },
    macros::{btf_tracepoint, raw_tracepoint},
    maps::PerCpuHashMap,
    programs::{BtfTracePointContext, RawTracePointContext},
};
use latprof_common::{
    Counter, HIDDEN_WAKER_RACED, HIDDEN_WAKER_UNSEEN, TASK_FLAG_FIRST_SLEEP,
    TASK_FLAG_WAKING_RACED, TaskState, WAKER_HARDIRQ, WAKER_NMI, WAKER_OTHER, WAKER_SOFTIRQ,
    WAKER_TASK, WAKER_TIMER, WAKER_UNSEEN, WakerKey, WakerValue,
};

use crate::{
    chains, kfuncs,
    maps::{CPU_CONTEXT, CpuContext, WAKERS, WAKERS_OTHER, count, count_n, ids, log_hidden},
    settings::{
        CFS_RQ_RQ_OFF, CHAINS_ON, PC_FROM_RQ, RQ_CPU_OFF, TASK_CFS_RQ_OFF, TASK_COMM_OFF,
        TASK_PID_OFF, TASK_PREEMPT_OFF, TASK_SOFTIRQ_CNT_OFF, WAKER_STACKS, WAKERS_ON,
        btf_pid_tgid, read_btf_field, read_field,
    },
    shared,
    stacks::take_stack,
    task_table,
};

/// The preempt count's NMI, hard interrupt and softirq-serving bits.
const PC_NMI: u32 = 0x00f0_0000;
const PC_HARDIRQ: u32 = 0x000f_0000;
const PC_SOFTIRQ_SERVING: u32 = 0x100;

/// `TP_PROTO(struct task_struct *p)`, in the waker's context: for kernels without BTF
/// tracepoints or `bpf_get_current_task_btf` (5.10), and the raw variants.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn sched_waking(ctx: RawTracePointContext) -> i32 {
    let wakee: *const u8 = ctx.arg(0);
    match read_field::<i32>(wakee, TASK_PID_OFF.load()) {
        Ok(tid) => note_waker::<_, false>(&ctx, tid as u32),
        Err(_) => 1,
    }
}

/// The same on the BTF tracepoint: the wakee's pid and the waker's ids and name are plain
/// loads, not helper calls (`bpf_get_current_comm` alone cost 65 of its 247 ns per run on the
/// ping-pong, `bpf_get_current_pid_tgid` 17 of 148).
/// Linux 5.11 on (`bpf_get_current_task_btf`); user space loads the raw one where this fails.
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking_btf(ctx: BtfTracePointContext) -> i32 {
    let wakee: *const u8 = ctx.arg(0);
    note_waker::<_, true>(
        &ctx,
        read_btf_field::<i32>(wakee, TASK_PID_OFF.load()) as u32,
    )
}

/// The current task's tid, tgid and name: plain loads from the task the kernel hands as one
/// the verifier knows (`BTF`), else the helpers'.
#[inline(always)]
fn current_task<const BTF: bool>() -> (u32, u32, [u8; 16]) {
    let off = TASK_COMM_OFF.load();
    if !BTF || off == 0 {
        let pid_tgid = bpf_get_current_pid_tgid();
        return (
            pid_tgid as u32,
            (pid_tgid >> 32) as u32,
            bpf_get_current_comm().unwrap_or([0; 16]),
        );
    }
    // SAFETY: a helper without arguments; its task is current, valid for the program's run.
    let task = unsafe { bpf_get_current_task_btf() }
        .cast_const()
        .cast::<u8>();
    let low = read_btf_field::<u64>(task, off).to_ne_bytes();
    let high = read_btf_field::<u64>(task, off + 8).to_ne_bytes();
    let mut comm = [0; 16];
    comm[..8].copy_from_slice(&low);
    comm[8..].copy_from_slice(&high);
    let pid_tgid = btf_pid_tgid(task);
    (pid_tgid as u32, (pid_tgid >> 32) as u32, comm)
}

/// Notes the current context as the waker of `tid`'s coming wakeup (`BTF`: from the BTF
/// tracepoint, see `current_task`).
#[inline(always)]
fn note_waker<C: EbpfContext, const BTF: bool>(ctx: &C, tid: u32) -> i32 {
    let Some(entry) = task_table::get(tid) else {
        return 0;
    };
    // SAFETY: try_to_wake_up holds the wakee's pi_lock: no other waking or wakeup of it runs.
    // The sleep may not have begun yet (the wakee is still switching out on another CPU):
    // the note stays for the wakeup that follows either way, which takes it.
    let entry = unsafe { &mut *entry };
    let kind = context_kind();
    entry.waker_kind = kind;
    if kind == WAKER_TASK {
        let (waker_tid, waker_tgid, comm) = current_task::<BTF>();
        entry.waker_tid = waker_tid;
        entry.waker_tgid = waker_tgid;
        entry.waker_comm = comm;
        if CHAINS_ON.load() == 1 {
            chains::note(entry, tid, waker_tid);
        }
    } else {
        entry.waker_tid = 0;
        entry.waker_tgid = 0;
    }
    entry.waker_stack = if WAKER_STACKS.load() == 1 {
        take_stack(ctx)
    } else {
        0
    };
    0
}

/// The context the current code runs in, as a `WAKER_*` kind.
#[inline(always)]
fn context_kind() -> u32 {
    let Some(cpu) = CPU_CONTEXT.get_ptr_mut(0) else {
        return WAKER_TASK;
    };
    // SAFETY: this CPU's slot; programs on one CPU do not run concurrently.
    let cpu = unsafe { &mut *cpu };
    let pc = preempt_count(cpu);
    let level = level_of(pc);
    if cpu.timer[level] != 0 {
        return WAKER_TIMER;
    }
    match level {
        LEVEL_NMI => WAKER_NMI,
        LEVEL_HARDIRQ => WAKER_HARDIRQ,
        LEVEL_SOFTIRQ => WAKER_SOFTIRQ,
        _ => WAKER_TASK,
    }
}

/// Context levels: the slots of `CpuContext::timer`. Without the preempt count everything is
/// `LEVEL_TASK`, so a waking in any timer callback is the timer's.
const LEVEL_TASK: usize = 0;
const LEVEL_SOFTIRQ: usize = 1;
const LEVEL_HARDIRQ: usize = 2;
const LEVEL_NMI: usize = 3;

#[inline(always)]
fn level_of(pc: Option<u32>) -> usize {
    let Some(pc) = pc else {
        return LEVEL_TASK;
    };
    if pc & PC_NMI != 0 {
        LEVEL_NMI
    } else if pc & PC_HARDIRQ != 0 {
        LEVEL_HARDIRQ
    } else if pc & PC_SOFTIRQ_SERVING != 0 || rt_serving_softirq() {
        LEVEL_SOFTIRQ
    } else {
        LEVEL_TASK
    }
}

/// This CPU's preempt count; `None` where user space found no way to it.
#[inline(always)]
fn preempt_count(cpu: &mut CpuContext) -> Option<u32> {
    // arm64: the current task's (an interrupt raises the interrupted task's count).
    let in_task = TASK_PREEMPT_OFF.load();
    if in_task != 0 {
        let task = unsafe { bpf_get_current_task() } as *const u8;
        return kfuncs::read_kernel::<u32>(task, in_task).ok();
    }
    let from_rq = PC_FROM_RQ.load();
    if from_rq == 0 {
        return None;
    }
    if cpu.pc_addr == 0 {
        // Once per CPU: the current task's CFS run queue's run queue is this CPU's.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        let cfs_rq: u64 = read_field(task, TASK_CFS_RQ_OFF.load()).ok()?;
        let rq: u64 = read_field(cfs_rq as *const u8, CFS_RQ_RQ_OFF.load()).ok()?;
        let rq_cpu: u32 = read_field(rq as *const u8, RQ_CPU_OFF.load()).ok()?;
        // SAFETY: a helper without arguments.
        if rq == 0 || rq_cpu != unsafe { bpf_get_smp_processor_id() } {
            return None;
        }
        cpu.pc_addr = rq.wrapping_add(from_rq);
    }
    // A plain load where the kernel has the kfunc (a fault reads 0: a task's context, as a
    // failed read says).
    kfuncs::read_kernel::<u32>(cpu.pc_addr as *const u8, 0).ok()
}

/// PREEMPT_RT: the current task serves softirqs (it is ksoftirqd, or raised them and serves
/// them as it enables bottom halves again).
#[inline(always)]
fn rt_serving_softirq() -> bool {
    let off = TASK_SOFTIRQ_CNT_OFF.load();
    if off == 0 {
        return false;
    }
    let task = unsafe { bpf_get_current_task() } as *const u8;
    read_field::<i32>(task, off).is_ok_and(|n| n as u32 & PC_SOFTIRQ_SERVING != 0)
}

/// A timer callback begins or ends (`active`): marks the level of context it runs at. A
/// callback runs to its end at one level; one at another level can only interrupt it.
#[inline(always)]
fn timer_mark(active: u32) {
    let Some(cpu) = CPU_CONTEXT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `context_kind`.
    let cpu = unsafe { &mut *cpu };
    let level = level_of(preempt_count(cpu));
    cpu.timer[level] = active;
}

#[inline(always)]
fn timer_entry() {
    timer_mark(1);
}

#[inline(always)]
fn timer_exit() {
    timer_mark(0);
}

#[raw_tracepoint(tracepoint = "hrtimer_expire_entry")]
pub fn hrtimer_expire_entry(_ctx: RawTracePointContext) -> i32 {
    timer_entry();
    0
}

#[raw_tracepoint(tracepoint = "hrtimer_expire_exit")]
pub fn hrtimer_expire_exit(_ctx: RawTracePointContext) -> i32 {
    timer_exit();
    0
}

#[raw_tracepoint(tracepoint = "timer_expire_entry")]
pub fn timer_expire_entry(_ctx: RawTracePointContext) -> i32 {
    timer_entry();
    0
}

#[raw_tracepoint(tracepoint = "timer_expire_exit")]
pub fn timer_expire_exit(_ctx: RawTracePointContext) -> i32 {
    timer_exit();
    0
}

/// Takes the waker noted for the wakeup of `entry` (clears it, counted sleep or not); without
/// `--wakers` nothing is noted, and the entry is not touched.
#[inline(always)]
pub(crate) fn take(entry: &mut TaskState) -> u32 {
    if WAKERS_ON.load() != 1 {
        return WAKER_UNSEEN;
    }
    let kind = entry.waker_kind;
    entry.waker_kind = WAKER_UNSEEN;
    let first = entry.flags & TASK_FLAG_FIRST_SLEEP != 0;
    entry.flags &= !(TASK_FLAG_FIRST_SLEEP | TASK_FLAG_WAKING_RACED);
    if first && kind == WAKER_UNSEEN {
        entry.flags |= TASK_FLAG_WAKING_RACED;
    }
    kind
}

/// Adds a counted sleep of `delta` ns at record id `cause` to its waker (`kind`, taken from
/// `entry`): to the entry's pending waker where the key is the same as the last sleep's (a
/// task woken again and again by the same waker, as in a ping-pong or a worker fed by one
/// thread, costs no table lookup: 50 of `sched_wakeup`'s 290 ns per run on the ping-pong),
/// else the pending sleeps go to this CPU's part of `WAKERS` first (`flush`). Not inlined: its
/// key would enlarge the wakeup program's frame on the stack cache's call chain past the
/// verifier's 512 bytes (verifier rule 1 in `stack_cache`; Linux 5.10's bounded cache hit it).
/// Called only with `--wakers` (`WAKERS_ON`).
#[inline(never)]
pub(crate) fn add(entry: &mut TaskState, kind: u32, cause: u64, delta: u64, tid: u32) {
    if kind == WAKER_UNSEEN {
        count(Counter::WakerUnseen);
        // Its waking ran where the kernel ran no BPF program, as far as latprof can tell:
        // user space checks that the sleep overlapped a hidden stretch, as for a lost one. On
        // the task's first traced sleep the waking may have come before its entry was made.
        log_hidden(
            if entry.flags & TASK_FLAG_WAKING_RACED != 0 {
                HIDDEN_WAKER_RACED
            } else {
                HIDDEN_WAKER_UNSEEN
            },
            ids(tid, entry.tgid),
            entry.sleep_start_ns,
            entry.sleep_start_ns.saturating_add(delta),
            0,
        );
    }
    let task = kind == WAKER_TASK;
    let key = WakerKey {
        cause,
        waker_stack: if kind == WAKER_UNSEEN {
            0
        } else {
            entry.waker_stack
        },
        sleeper_tgid: entry.tgid,
        kind,
        waker_tgid: if task { entry.waker_tgid } else { 0 },
        waker_tid: if task { entry.waker_tid } else { 0 },
    };
    let pending = &mut entry.waker_pending;
    if pending.count != 0 && entry.waker_pending_key == key {
        pending.count += 1;
        pending.total_ns += delta;
        if delta > pending.max_ns {
            pending.max_ns = delta;
        }
        return;
    }
    flush(entry);
    entry.waker_pending_key = key;
    entry.waker_pending = WakerValue {
        count: 1,
        total_ns: delta,
        max_ns: delta,
        comm: if task { entry.waker_comm } else { [0; 16] },
    };
}

/// Adds `entry`'s pending waker to this CPU's part of `WAKERS` (where the table is full, to
/// its cause's other wakers in `WAKERS_OTHER`), and clears it: before another waker takes its
/// place, and when the entry goes. The key and value are passed where they lie in the entry.
#[inline(always)]
pub(crate) fn flush(entry: &mut TaskState) {
    if entry.waker_pending.count == 0 {
        return;
    }
    let (key, value) = (&entry.waker_pending_key, &entry.waker_pending);
    if !add_to(&WAKERS, key, value) {
        shared::write();
        // A failed insert is a full table, or another CPU's insert of the same key first.
        if WAKERS.insert(key, value, u64::from(BPF_NOEXIST)).is_err()
            && !add_to(&WAKERS, key, value)
        {
            to_other(key, value);
        }
    }
    entry.waker_pending.count = 0;
}

/// The waker table is full: `value`'s sleeps go to the cause's other wakers, in a table of
/// their own so that there is room (and where that is full too, the counter is all that is
/// left of them).
#[inline(never)]
fn to_other(key: &WakerKey, value: &WakerValue) {
    count_n(Counter::WakerTableFull, value.count);
    let other = WakerKey {
        cause: key.cause,
        waker_stack: 0,
        sleeper_tgid: key.sleeper_tgid,
        kind: WAKER_OTHER,
        waker_tgid: 0,
        waker_tid: 0,
    };
    if !add_to(&WAKERS_OTHER, &other, value) {
        let value = WakerValue {
            comm: [0; 16],
            ..*value
        };
        shared::write();
        let _ = WAKERS_OTHER.insert(&other, &value, u64::from(BPF_NOEXIST));
    }
}

/// Adds `value`'s sleeps to `key`'s in this CPU's part of `map`; false where it has no `key`.
#[inline(always)]
fn add_to(map: &PerCpuHashMap<WakerKey, WakerValue>, key: &WakerKey, value: &WakerValue) -> bool {
    let Some(v) = map.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: this CPU's value; programs on one CPU do not run concurrently.
    unsafe {
        (*v).count += value.count;
        (*v).total_ns += value.total_ns;
        if value.max_ns > (*v).max_ns {
            (*v).max_ns = value.max_ns;
        }
    }
    true
}

//! Settings fixed for a run: `Global`s that the loader writes (`override_global`) before the
//! verifier sees the programs, so it removes the branches a run does not use (the eBPF form of
//! `IS_ENABLED(CONFIG_...)`). No setting is read from a map on an event. The symbol names are
//! user space's (`latprof/src/probe/names.rs`): do not rename them.
//!
//! Offsets into kernel structures come from vmlinux BTF at load time and are read through
//! [`read_field`], never hard-coded for one kernel.

use aya_ebpf::{Global, helpers::bpf_probe_read_kernel};
use latprof_common::{MODE_LAZY, STACK_FRAMES, USER_FRAMES, WAKEUP_ADAPTIVE};

/// `MODE_LAZY` (per-task records, merged into the global table at exit) or `MODE_NORMAL`
/// (every counted sleep also goes to the global table).
#[unsafe(no_mangle)]
pub(crate) static MODE: Global<u32> = Global::new(MODE_LAZY);
/// Only this process (tgid) is traced; 0 traces every process.
#[unsafe(no_mangle)]
pub(crate) static FILTER_TGID: Global<u32> = Global::new(0);
/// latprof's own tgid, left out unless `--include-self`; 0 leaves nobody out.
#[unsafe(no_mangle)]
pub(crate) static SELF_TGID: Global<u32> = Global::new(0);
/// 1: kernel threads stay out of the global table (latencytop's rule).
#[unsafe(no_mangle)]
pub(crate) static SKIP_KTHREADS: Global<u32> = Global::new(1);
/// Interruptible sleeps longer than this are not counted; `u64::MAX` counts all.
#[unsafe(no_mangle)]
pub(crate) static INTER_CUTOFF_NS: Global<u64> = Global::new(5_000_000);
/// Sleeps shorter than this are not counted (latencytop drops zero-microsecond sleeps).
#[unsafe(no_mangle)]
pub(crate) static MIN_SLEEP_NS: Global<u64> = Global::new(1_000);
/// 1 when the `sched_switch` tracepoint passes `prev_state` (Linux 5.18 and later); otherwise it
/// is read from the task at `TASK_STATE_OFF`.
#[unsafe(no_mangle)]
pub(crate) static SWITCH_HAS_PREV_STATE: Global<u32> = Global::new(1);
/// 1: keep run-queue latency ("waiting for CPU"); costs a task lookup on every switch.
#[unsafe(no_mangle)]
pub(crate) static RUNQ: Global<u32> = Global::new(1);
/// 1: keep per-cause latency histograms; costs a per-CPU map update per counted event.
#[unsafe(no_mangle)]
pub(crate) static HISTOGRAMS_ON: Global<u32> = Global::new(1);
/// 1: the BTF wakeup program is loaded and can take a sleeping task's backtrace, so every
/// backtrace is taken at wakeup, only for sleeps that count, and from the stack cache when it
/// can; 0: every backtrace is walked at switch-out.
#[unsafe(no_mangle)]
pub(crate) static STACK_AT_WAKEUP: Global<u32> = Global::new(0);
/// Offset of `stack` (the kernel stack's lowest address) in `struct task_struct`, and where
/// the user registers sit above it (`THREAD_SIZE` less `sizeof(struct pt_regs)`): the stack
/// cache's way to the registers where the kernel has no `bpf_task_pt_regs` (before 5.15).
#[unsafe(no_mangle)]
pub(crate) static TASK_STACK_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static PT_REGS_IN_STACK: Global<u32> = Global::new(0);
/// Offset of the saved kernel stack pointer (`thread.sp`) in `struct task_struct`, from BTF;
/// 0: unknown here, no stack cache.
#[unsafe(no_mangle)]
pub(crate) static THREAD_SP_OFF: Global<u32> = Global::new(0);
/// Frames walked per backtrace (the shown depth plus room for the frames dropped above it).
#[unsafe(no_mangle)]
pub(crate) static STACK_WALK_FRAMES: Global<u32> = Global::new(STACK_FRAMES as u32);
/// Offsets of `__state` (or `state`) and `pid` in `struct task_struct`, from vmlinux BTF.
#[unsafe(no_mangle)]
pub(crate) static TASK_STATE_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static TASK_PID_OFF: Global<u32> = Global::new(0);
/// Offset of `tgid` in `struct task_struct` (read only by `--debug-checks`).
#[unsafe(no_mangle)]
pub(crate) static TASK_TGID_OFF: Global<u32> = Global::new(0);
/// Offsets of `flags` and `mm` in `struct task_struct`, from vmlinux BTF.
#[unsafe(no_mangle)]
pub(crate) static TASK_FLAGS_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static TASK_MM_OFF: Global<u32> = Global::new(0);
/// Offset of `self_exec_id` in `struct task_struct` (`--user-stacks`: one more each exec).
#[unsafe(no_mangle)]
pub(crate) static TASK_EXEC_ID_OFF: Global<u32> = Global::new(0);
/// 1: the sleeper's user backtrace is walked at switch-out (`--user-stacks`).
#[unsafe(no_mangle)]
pub(crate) static USER_STACKS_ON: Global<u32> = Global::new(0);
/// Frames walked per user backtrace (at most `USER_FRAMES`).
#[unsafe(no_mangle)]
pub(crate) static USER_WALK_FRAMES: Global<u32> = Global::new(USER_FRAMES as u32);
/// Offset of `sp` in `struct pt_regs`, from vmlinux BTF.
#[unsafe(no_mangle)]
pub(crate) static PT_REGS_SP_OFF: Global<u32> = Global::new(0);
/// Offsets of `ip` and `bp` in `struct pt_regs` (the user frame-pointer walk's start).
#[unsafe(no_mangle)]
pub(crate) static PT_REGS_IP_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static PT_REGS_BP_OFF: Global<u32> = Global::new(0);
/// Offsets of `start_code`, `end_code` and `start_stack` in `struct mm_struct` (`layout_key`).
#[unsafe(no_mangle)]
pub(crate) static MM_START_CODE_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static MM_END_CODE_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static MM_START_STACK_OFF: Global<u32> = Global::new(0);
/// Offset of `comm` in `struct task_struct` (read only where switches went unseen).
#[unsafe(no_mangle)]
pub(crate) static TASK_COMM_OFF: Global<u32> = Global::new(0);
/// Offsets of `se.sum_exec_runtime` and `sched_info.run_delay` in `struct task_struct`, from
/// vmlinux BTF; 0: the kernel has not both, and a sleep whose wakeup was hidden is lost
/// instead of recovered.
#[unsafe(no_mangle)]
pub(crate) static TASK_EXEC_RUNTIME_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static TASK_RUN_DELAY_OFF: Global<u32> = Global::new(0);
/// N > 0: the wakeup programs ignore about one wakeup in N, as a kernel that hides tasks from
/// tracing does (the tests' way to check recovery), each logged as a gap unless the top bit
/// is set (the tests' way to check that check); 0: dead code the verifier removes.
#[unsafe(no_mangle)]
pub(crate) static DEBUG_HIDE_WAKEUPS: Global<u32> = Global::new(0);
/// N > 0: about one counted sleep in N vanishes, counted nowhere (a defect injected on
/// purpose: the suite's exact counts must catch it); 0: dead code the verifier removes.
#[unsafe(no_mangle)]
pub(crate) static DEBUG_DROP_SLEEPS: Global<u32> = Global::new(0);
/// 1: each sleep is attributed to its task's cgroup v2 id (records keyed by it, the per-cgroup
/// table filled at exit); 0: every cgroup id is 0 and the reads are dead code.
#[unsafe(no_mangle)]
pub(crate) static CGROUPS_ON: Global<u32> = Global::new(0);
/// How many slots of `CGROUP_FILTER` hold a cgroup (`--cgroup`); 0: no filter (dead code).
#[unsafe(no_mangle)]
pub(crate) static FILTER_CGROUPS: Global<u32> = Global::new(0);
/// 1: each counted sleep is added to its waker in `WAKERS` (`sched_waking` notes it).
#[unsafe(no_mangle)]
pub(crate) static WAKERS_ON: Global<u32> = Global::new(0);
/// 1: `sched_waking` also walks the waker's backtrace (`--waker-stacks`).
#[unsafe(no_mangle)]
pub(crate) static WAKER_STACKS: Global<u32> = Global::new(0);
/// This CPU's preempt count is at its run queue's address plus this (the distance between the
/// two per-CPU variables, from BTF or kallsyms); 0: not found, interrupts are not told apart
/// from the task they interrupt (but timers are).
#[unsafe(no_mangle)]
pub(crate) static PC_FROM_RQ: Global<u64> = Global::new(0);
/// Offsets of `se.cfs_rq` in `struct task_struct`, `rq` in `struct cfs_rq` and `cpu` in
/// `struct rq`: the way from the current task to its CPU's run queue.
#[unsafe(no_mangle)]
pub(crate) static TASK_CFS_RQ_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static CFS_RQ_RQ_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static RQ_CPU_OFF: Global<u32> = Global::new(0);
/// PREEMPT_RT: offset of `softirq_disable_cnt` in `struct task_struct` (0: not RT).
#[unsafe(no_mangle)]
pub(crate) static TASK_SOFTIRQ_CNT_OFF: Global<u32> = Global::new(0);
/// Sleeps and run-queue waits at least this long are sent as spike events; `u64::MAX`: none.
#[unsafe(no_mangle)]
pub(crate) static SPIKE_NS: Global<u64> = Global::new(u64::MAX);
/// `WAKEUP_ADAPTIVE`: wake the reader only when it said it is about to sleep, or when the
/// buffer holds more than `SPIKE_FILL_MARK` bytes; `WAKEUP_ALWAYS`: on every event.
#[unsafe(no_mangle)]
pub(crate) static WAKEUP_POLICY: Global<u32> = Global::new(WAKEUP_ADAPTIVE);
#[unsafe(no_mangle)]
pub(crate) static SPIKE_FILL_MARK: Global<u64> = Global::new(64 * 1024);
/// 1: count (and log) consistency anomalies; 0: the checks are dead code the verifier removes.
#[unsafe(no_mangle)]
pub(crate) static DEBUG_CHECKS: Global<u32> = Global::new(0);
/// 1: `sched_switch` reads past a map value, which every verifier rejects: the tests' way to
/// see how latprof reports a rejection. 0: dead code the verifier removes.
#[unsafe(no_mangle)]
pub(crate) static FORCE_REJECT: Global<u32> = Global::new(0);

/// Reads a field of a kernel object at an offset taken from BTF.
#[inline(always)]
pub(crate) fn read_field<T>(object: *const u8, offset: u32) -> Result<T, i32> {
    // SAFETY: a probe read fails safely on a bad address.
    unsafe { bpf_probe_read_kernel(object.add(offset as usize).cast()) }
}

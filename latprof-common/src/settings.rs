//! Every setting the loader writes into the eBPF programs, declared once: each global's name,
//! type, default (what the object holds until the loader writes it) and meaning. Both sides
//! expand the same table with a macro of their own: the eBPF crate into its `Global` statics
//! (`latprof-ebpf/src/settings.rs`), user space into the structs the loader writes from
//! (`latprof/src/probe/settings.rs`). A setting added here is a static there and a field
//! here that the loader must fill (a struct literal names every field), and the object test
//! checks that the object holds these globals and no other.
//!
//! `settings!(each [ARGS])` calls `each!` with `[ARGS]` and the run's settings;
//! `debug_settings!` does the same with the test and debugging knobs, kept apart.

/// The run's settings (see the module's doc).
#[macro_export]
macro_rules! settings {
    ($each:ident $($arg:tt)*) => {
        $each! {
            $($arg)*
            /// `MODE_LAZY` (per-task records, merged into the global table at exit) or `MODE_NORMAL`
            /// (every counted sleep also goes to the global table).
            MODE: u32 = $crate::MODE_LAZY,
            /// Only this process (tgid) is traced; 0 traces every process.
            FILTER_TGID: u32 = 0,
            /// latprof's own tgid, left out unless `--include-self`; 0 leaves nobody out.
            SELF_TGID: u32 = 0,
            /// 1: kernel threads stay out of the global table (latencytop's rule).
            SKIP_KTHREADS: u32 = 1,
            /// Interruptible sleeps longer than this are not counted; `u64::MAX` counts all.
            INTER_CUTOFF_NS: u64 = 5_000_000,
            /// Sleeps shorter than this are not counted (latencytop drops zero-microsecond sleeps).
            MIN_SLEEP_NS: u64 = 1_000,
            /// 1 when the `sched_switch` tracepoint passes `prev_state` (Linux 5.18 and later); otherwise it
            /// is read from the task at `TASK_STATE_OFF`.
            SWITCH_HAS_PREV_STATE: u32 = 1,
            /// Slots of `TASK_SLOTS`, the task entries indexed by tid (where the kernel has
            /// compare-and-swap to claim one); 0: none, every entry in `TASKS`, the hash.
            TASK_SLOTS_N: u32 = 0,
            /// 1: keep run-queue latency ("waiting for CPU"); costs a task lookup on every switch.
            RUNQ: u32 = 1,
            /// 1: keep per-cause latency histograms; costs a per-CPU map update per counted event.
            HISTOGRAMS_ON: u32 = 1,
            /// 1: the BTF wakeup program is loaded and can take a sleeping task's backtrace, so every
            /// backtrace is taken at wakeup, only for sleeps that count, and from the stack cache when it
            /// can; 0: every backtrace is walked at switch-out.
            STACK_AT_WAKEUP: u32 = 0,
            /// Offset of `stack` (the kernel stack's lowest address) in `struct task_struct`, and where
            /// the user registers sit above it (`THREAD_SIZE` less `sizeof(struct pt_regs)`): the stack
            /// cache's way to the registers where the kernel has no `bpf_task_pt_regs` (before 5.15).
            TASK_STACK_OFF: u32 = 0,
            PT_REGS_IN_STACK: u32 = 0,
            /// Offset of the saved kernel stack pointer (`thread.sp`) in `struct task_struct`, from BTF;
            /// 0: unknown here, no stack cache.
            THREAD_SP_OFF: u32 = 0,
            /// The id of `struct pt_regs` in the kernel's BTF where `bpf_rdonly_cast` is called
            /// (`KFUNC_RDONLY_CAST`): the stack cache reads the sleeper's stack by plain loads
            /// through it (a struct of 8-byte words from offset 0). 0: the kernel lacks the kfunc
            /// (before 6.2), and the cache copies the stack with `bpf_probe_read_kernel`.
            RDONLY_CAST_WORDS_ID: u32 = 0,
            /// Frames walked per backtrace (the shown depth plus room for the frames dropped above it).
            STACK_WALK_FRAMES: u32 = $crate::STACK_FRAMES as u32,
            /// Offsets of `__state` (or `state`) and `pid` in `struct task_struct`, from vmlinux BTF.
            TASK_STATE_OFF: u32 = 0,
            TASK_PID_OFF: u32 = 0,
            /// Offset of `tgid` in `struct task_struct` (`--debug-checks`; on the BTF tracepoints the
            /// sleeper's and `--wakers`' waker's).
            TASK_TGID_OFF: u32 = 0,
            /// Offsets of `flags` and `mm` in `struct task_struct`, from vmlinux BTF.
            TASK_FLAGS_OFF: u32 = 0,
            TASK_MM_OFF: u32 = 0,
            /// Offset of `self_exec_id` in `struct task_struct` (`--user-stacks`: one more each exec).
            TASK_EXEC_ID_OFF: u32 = 0,
            /// 1: the sleeper's user backtrace is walked at switch-out (`--user-stacks`).
            USER_STACKS_ON: u32 = 0,
            /// 1: user frames without frame pointers are stepped through by the unwind tables
            /// (`--user-stacks` where the kernel has `bpf_loop`, Linux 5.17).
            UNWIND_ON: u32 = 0,
            /// Frames walked per user backtrace (at most `USER_FRAMES`).
            USER_WALK_FRAMES: u32 = $crate::USER_FRAMES as u32,
            /// Offset of `sp` in `struct pt_regs`, from vmlinux BTF.
            PT_REGS_SP_OFF: u32 = 0,
            /// Offsets of `ip` and `bp` in `struct pt_regs` (the user frame-pointer walk's start).
            PT_REGS_IP_OFF: u32 = 0,
            PT_REGS_BP_OFF: u32 = 0,
            /// Offset of the link register (arm64's x30) in `struct pt_regs`; 0 where the
            /// architecture has none (x86-64: calls push the return address).
            PT_REGS_LR_OFF: u32 = 0,
            /// The bits of a user return address that pointer authentication signs (arm64 with
            /// PAC: the CPU's own mask, as user space found it); cleared from every return
            /// address the walks read. 0 where nothing is signed.
            USER_PAC_MASK: u64 = 0,
            /// Offsets of `start_code`, `end_code` and `start_stack` in `struct mm_struct` (`layout_key`).
            MM_START_CODE_OFF: u32 = 0,
            MM_END_CODE_OFF: u32 = 0,
            MM_START_STACK_OFF: u32 = 0,
            /// Offset of `comm` in `struct task_struct` (read only where switches went unseen).
            TASK_COMM_OFF: u32 = 0,
            /// Offsets of `se.sum_exec_runtime` and `sched_info.run_delay` in `struct task_struct`, from
            /// vmlinux BTF; 0: the kernel has not both, and a sleep whose wakeup was hidden is lost
            /// instead of recovered.
            TASK_EXEC_RUNTIME_OFF: u32 = 0,
            TASK_RUN_DELAY_OFF: u32 = 0,
            /// 1: each sleep is attributed to its task's cgroup v2 id (records keyed by it, the per-cgroup
            /// table filled at exit); 0: every cgroup id is 0 and the reads are dead code.
            CGROUPS_ON: u32 = 0,
            /// Offsets of `task_struct.cgroups`, `css_set.dfl_cgrp`, `cgroup.kn` and `kernfs_node.id`:
            /// the way to a task's cgroup v2 id by plain loads on a BTF tracepoint, where the helper
            /// call costs more; any 0: the helper (`bpf_get_current_cgroup_id`).
            TASK_CGROUPS_OFF: u32 = 0,
            CSS_SET_DFL_CGRP_OFF: u32 = 0,
            CGROUP_KN_OFF: u32 = 0,
            KERNFS_NODE_ID_OFF: u32 = 0,
            /// 1: each exiting task's records are sent through `EXITED` (profiles' pid and thread labels).
            EXITS_ON: u32 = 0,
            /// How many slots of `CGROUP_FILTER` hold a cgroup (`--cgroup`); 0: no filter (dead code).
            FILTER_CGROUPS: u32 = 0,
            /// 1: each counted sleep is added to its waker in `WAKERS` (`sched_waking` notes it).
            WAKERS_ON: u32 = 0,
            /// 1: `sched_waking` also walks the waker's backtrace (`--waker-stacks`).
            WAKER_STACKS: u32 = 0,
            /// 1: each counted sleep a task woke is added to `CHAINS` by what its waker's most recent
            /// sleep was (`--chains`; needs `WAKERS_ON`).
            CHAINS_ON: u32 = 0,
            /// This CPU's preempt count is at its run queue's address plus this (the distance between the
            /// two per-CPU variables, from BTF or kallsyms); 0: not found, interrupts are not told apart
            /// from the task they interrupt (but timers are).
            PC_FROM_RQ: u64 = 0,
            /// Offsets of `se.cfs_rq` in `struct task_struct`, `rq` in `struct cfs_rq` and `cpu` in
            /// `struct rq`: the way from the current task to its CPU's run queue.
            TASK_CFS_RQ_OFF: u32 = 0,
            CFS_RQ_RQ_OFF: u32 = 0,
            RQ_CPU_OFF: u32 = 0,
            /// PREEMPT_RT: offset of `softirq_disable_cnt` in `struct task_struct` (0: not RT).
            /// arm64: offset of the preempt count in `struct task_struct` (its thread_info's),
            /// read from the current task; 0 elsewhere (x86-64's is per CPU, `PC_FROM_RQ`).
            TASK_PREEMPT_OFF: u32 = 0,
            TASK_SOFTIRQ_CNT_OFF: u32 = 0,
            /// Sleeps and run-queue waits at least this long are sent as spike events; `u64::MAX`: none.
            SPIKE_NS: u64 = u64::MAX,
            /// `WAKEUP_ADAPTIVE`: wake the reader only when it said it is about to sleep, or when the
            /// buffer holds more than its fill mark (`SPIKE_FILL_MARK` in the eBPF crate); `WAKEUP_ALWAYS`: on every event.
            WAKEUP_POLICY: u32 = $crate::WAKEUP_ADAPTIVE,
        }
    };
}

/// The knobs of tests and debugging: dead code unless a test or `--debug-checks` sets them.
#[macro_export]
macro_rules! debug_settings {
    ($each:ident $($arg:tt)*) => {
        $each! {
            $($arg)*
            /// N > 0: the wakeup programs ignore about one wakeup in N, as a kernel that hides tasks from
            /// tracing does (the tests' way to check recovery), each logged as a gap unless the top bit
            /// is set (the tests' way to check that check); 0: dead code the verifier removes.
            DEBUG_HIDE_WAKEUPS: u32 = 0,
            /// A defect injected on purpose (`DEFECT_*`, `--debug-defect`): the suite's checks must
            /// catch it; `DEFECT_NONE`: every defect's branch is dead code the verifier removes.
            DEBUG_DEFECT: u32 = $crate::DEFECT_NONE,
            /// The defect's N: about one event in N of its kind is made wrong.
            DEBUG_DEFECT_ONE_IN: u32 = 0,
            /// 1: count (and log) consistency anomalies; 0: the checks are dead code the verifier removes.
            DEBUG_CHECKS: u32 = 0,
            /// The benchmark's breakdown: each `SKIP_*` bit set leaves one part of the hot programs'
            /// work out (the rest is dead code the verifier removes), so that what the part costs is
            /// the run's time less that of the run without it; 0: all parts run.
            DEBUG_SKIP: u32 = 0,
            /// 1: `sched_switch` reads past a map value, which every verifier rejects: the tests' way to
            /// see how latprof reports a rejection. 0: dead code the verifier removes.
            FORCE_REJECT: u32 = 0,
        }
    };
}

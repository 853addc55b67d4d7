//! The one place user space names the eBPF object's maps and programs (its globals are named
//! by the settings table, `latprof_common::settings!`).

/// Live tasks: each one's open sleep and its own records.
pub const MAP_TASKS: &str = "TASKS";
pub const MAP_TASK_SLOTS: &str = "TASK_SLOTS";
pub const MAP_SLOT_TIDS: &str = "SLOT_TIDS";
/// The global table: every event (normal mode) or exited tasks' records (lazy mode).
pub const MAP_GLOBAL_LATENCY: &str = "GLOBAL_LATENCY";
/// Per-CPU parts of exit merges (lazy) and of maxima without compare-and-swap.
pub const MAP_MERGED: &str = "MERGED";
/// Kernel backtraces by stack id.
pub const MAP_STACKS: &str = "STACKS";
/// Latency histograms by stack id, per CPU.
pub const MAP_HISTOGRAMS: &str = "HISTOGRAMS";
/// Per-CPU scratch for one backtrace.
pub const MAP_STACK_BUF: &str = "STACK_BUF";
/// The pipeline counters, per CPU, by `Counter`.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// The spike ring buffer.
pub const MAP_SPIKES: &str = "SPIKES";
/// The spike reader's "I am about to sleep" flag.
pub const MAP_READER: &str = "READER";
/// `--debug-checks`: each CPU's log line budget.
pub const MAP_DEBUG_LOG_BUDGET: &str = "DEBUG_LOG_BUDGET";
/// Tick and time-accounting counters, per CPU, by `TickCounter`.
pub const MAP_TICKS: &str = "TICKS";
/// The stack cache: a copy of the sleeping task's kernel stack, per CPU.
pub const MAP_STACK_COPY: &str = "STACK_COPY";
/// The stack cache: frames the last walk found, per CPU.
pub const MAP_WALKED_FRAMES: &str = "WALKED_FRAMES";
/// The stack cache: where a task's user registers sit in its stack, found once per CPU.
pub const MAP_REGS_IN_STACK: &str = "REGS_IN_STACK";
/// The stack cache: each CPU's cache of backtraces by stack shape.
pub const MAP_CPU_CACHE: &str = "CPU_CACHE";
/// The stack cache: the shape being learnt, per CPU.
pub const MAP_LEARNT: &str = "LEARNT";
/// The stack cache's bounded scan: where it is, per CPU (kernels without bpf_loop).
pub const MAP_SCAN_POS: &str = "SCAN_POS";
/// Each CPU's last seen switch (hidden switches).
pub const MAP_LAST_SWITCH: &str = "LAST_SWITCH";
/// Per-CPU scratch for a task's state.
pub const MAP_SCRATCH: &str = "SCRATCH";
/// Set once a hidden switch was seen: from then on sleeps keep what recovering them needs.
pub const MAP_HIDING_SEEN: &str = "HIDING_SEEN";
/// Gaps the kernel hid and the sleeps lost or recovered in them (`HiddenEvent`s).
pub const MAP_HIDDEN: &str = "HIDDEN";
/// Each exiting task's records (`ExitedTask`s).
pub const MAP_EXITED: &str = "EXITED";
/// Per cgroup and cause: exited tasks' records (`CgroupCause` -> `GlobalRecord`, per CPU).
pub const MAP_CGROUP_LATENCY: &str = "CGROUP_LATENCY";
/// `--cgroup`'s cgroups (a cgroup array).
pub const MAP_CGROUP_FILTER: &str = "CGROUP_FILTER";
/// Who ended the sleeps of each cause (`WakerKey` -> `WakerValue`, per CPU).
pub const MAP_WAKERS: &str = "WAKERS";
/// The wakers of each cause and sleeper that found `WAKERS` full (kind `WAKER_OTHER`).
pub const MAP_WAKERS_OTHER: &str = "WAKERS_OTHER";
/// What each counted sleep's waking task was doing meanwhile (`ChainKey` -> `ChainValue`,
/// per CPU; `--chains`).
pub const MAP_CHAINS: &str = "CHAINS";
/// Per CPU: where its preempt count is and the timer callbacks running.
pub const MAP_CPU_CONTEXT: &str = "CPU_CONTEXT";
/// User backtraces (`--user-stacks`), their per-CPU walk buffer, the parts of combined
/// causes, and the ring buffer that announces a user backtrace's first sighting.
pub const MAP_USER_STACKS: &str = "USER_STACKS";
pub const MAP_USER_BUF: &str = "USER_BUF";
pub const MAP_CAUSE_PARTS: &str = "CAUSE_PARTS";
pub const MAP_USER_SEEN: &str = "USER_SEEN";
/// The unwind tables' rows, and where each process maps the files they cover
/// (`--user-stacks`).
pub const MAP_UNWIND_ROWS: &str = "UNWIND_ROWS";
pub const MAP_UNWIND_PROCS: &str = "UNWIND_PROCS";
/// Per CPU: where the unwind tables' steps stand.
pub const MAP_UNWIND_WALK: &str = "UNWIND_WALK";
/// Per CPU: the rules the unwind tables' searches found last.
pub const MAP_UNWIND_RULES: &str = "UNWIND_RULES";
/// By CPU number: the stack a walk reads at its start (`--user-stacks`).
pub const MAP_STACK_WINDOWS: &str = "STACK_WINDOWS";
/// `--debug-defect`: per CPU, the cause of the last sleep counted there.
pub const MAP_DEFECT_LAST: &str = "DEFECT_LAST";
/// Every map of the eBPF object that is latprof's (a test checks both ways).
pub const MAPS: [&str; 40] = [
    MAP_DEFECT_LAST,
    MAP_UNWIND_ROWS,
    MAP_UNWIND_PROCS,
    MAP_UNWIND_WALK,
    MAP_UNWIND_RULES,
    MAP_STACK_WINDOWS,
    MAP_USER_STACKS,
    MAP_USER_BUF,
    MAP_CAUSE_PARTS,
    MAP_USER_SEEN,
    MAP_WAKERS,
    MAP_WAKERS_OTHER,
    MAP_CHAINS,
    MAP_CPU_CONTEXT,
    MAP_TASKS,
    MAP_TASK_SLOTS,
    MAP_SLOT_TIDS,
    MAP_GLOBAL_LATENCY,
    MAP_MERGED,
    MAP_STACKS,
    MAP_HISTOGRAMS,
    MAP_STACK_BUF,
    MAP_COUNTERS,
    MAP_SPIKES,
    MAP_READER,
    MAP_DEBUG_LOG_BUDGET,
    MAP_TICKS,
    MAP_STACK_COPY,
    MAP_WALKED_FRAMES,
    MAP_REGS_IN_STACK,
    MAP_CPU_CACHE,
    MAP_LEARNT,
    MAP_SCAN_POS,
    MAP_SCRATCH,
    MAP_LAST_SWITCH,
    MAP_HIDING_SEEN,
    MAP_HIDDEN,
    MAP_EXITED,
    MAP_CGROUP_LATENCY,
    MAP_CGROUP_FILTER,
];

pub const PROG_SCHED_SWITCH: &str = "sched_switch";
/// Programs named `_nocas` are the same without BPF compare-and-swap (before Linux 5.12).
pub const PROG_SCHED_SWITCH_NOCAS: &str = "sched_switch_nocas";
/// The switch program on the BTF tracepoint, beside the BTF wakeup programs: its tasks'
/// fields are plain loads.
pub const PROG_SCHED_SWITCH_BTF: &str = "sched_switch_btf";
pub const PROG_SCHED_SWITCH_BTF_NOCAS: &str = "sched_switch_btf_nocas";
/// The wakeup program on a raw tracepoint (kernels without BTF tracepoints).
pub const PROG_SCHED_WAKEUP: &str = "sched_wakeup";
pub const PROG_SCHED_WAKEUP_NOCAS: &str = "sched_wakeup_nocas";
/// The wakeup program on the BTF tracepoint: takes backtraces at wakeup, through the stack
/// cache.
pub const PROG_SCHED_WAKEUP_BTF: &str = "sched_wakeup_btf";
/// The stack cache without bpf_loop and bpf_task_pt_regs (a bounded loop; before 5.17).
pub const PROG_SCHED_WAKEUP_BTF_BOUNDED: &str = "sched_wakeup_btf_bounded";
pub const PROG_SCHED_WAKEUP_BTF_BOUNDED_NOCAS: &str = "sched_wakeup_btf_bounded_nocas";
/// The same, every backtrace walked (`--no-stack-cache`, or a kernel that refuses the cache).
pub const PROG_SCHED_WAKEUP_BTF_WALK: &str = "sched_wakeup_btf_walk";
pub const PROG_SCHED_WAKEUP_BTF_WALK_NOCAS: &str = "sched_wakeup_btf_walk_nocas";
pub const PROG_SCHED_PROCESS_EXIT: &str = "sched_process_exit";
pub const PROG_SCHED_PROCESS_EXIT_NOCAS: &str = "sched_process_exit_nocas";
pub const PROG_SCHED_PROCESS_FREE: &str = "sched_process_free";
pub const PROG_SCHED_PROCESS_FREE_NOCAS: &str = "sched_process_free_nocas";
pub const PROG_LOCAL_TIMER_ENTRY: &str = "local_timer_entry";
pub const PROG_TICK_STOP: &str = "tick_stop";
pub const PROG_USER_ENTER: &str = "user_enter";
pub const PROG_USER_EXIT: &str = "user_exit";
/// A task renamed (exec, prctl, /proc/PID/comm): its entry takes the new name.
pub const PROG_TASK_RENAME: &str = "task_rename";
/// Notes each wakeup's waker, in the waker's context: on the BTF tracepoint where the
/// variant's programs are on theirs and the kernel has `bpf_get_current_task_btf` (5.11), else
/// on the raw tracepoint.
pub const PROG_SCHED_WAKING: &str = "sched_waking";
pub const PROG_SCHED_WAKING_BTF: &str = "sched_waking_btf";
/// Tell a timer callback's wakeups from others'.
pub const PROG_HRTIMER_EXPIRE_ENTRY: &str = "hrtimer_expire_entry";
pub const PROG_HRTIMER_EXPIRE_EXIT: &str = "hrtimer_expire_exit";
pub const PROG_TIMER_EXPIRE_ENTRY: &str = "timer_expire_entry";
pub const PROG_TIMER_EXPIRE_EXIT: &str = "timer_expire_exit";
/// The waker programs, each on the raw tracepoint of its name: the ends of timer callbacks
/// before their beginnings, so that no callback is marked running whose end is not watched.
pub const WAKER_PROGRAMS: [&str; 5] = [
    PROG_HRTIMER_EXPIRE_EXIT,
    PROG_TIMER_EXPIRE_EXIT,
    PROG_HRTIMER_EXPIRE_ENTRY,
    PROG_TIMER_EXPIRE_ENTRY,
    PROG_SCHED_WAKING,
];
/// The tick and time-accounting programs, each on the raw tracepoint of its name; a kernel
/// without one of those tracepoints runs without that program.
pub const TICK_PROGRAMS: [&str; 4] = [
    PROG_LOCAL_TIMER_ENTRY,
    PROG_TICK_STOP,
    PROG_USER_ENTER,
    PROG_USER_EXIT,
];
/// Every program in the object; a session loads three latency programs (one variant of each),
/// the rename program and the tick programs whose tracepoints exist.
pub const PROGRAMS: [&str; 26] = [
    PROG_SCHED_WAKING,
    PROG_SCHED_WAKING_BTF,
    PROG_HRTIMER_EXPIRE_ENTRY,
    PROG_HRTIMER_EXPIRE_EXIT,
    PROG_TIMER_EXPIRE_ENTRY,
    PROG_TIMER_EXPIRE_EXIT,
    PROG_SCHED_SWITCH,
    PROG_SCHED_SWITCH_NOCAS,
    PROG_SCHED_SWITCH_BTF,
    PROG_SCHED_SWITCH_BTF_NOCAS,
    PROG_SCHED_WAKEUP,
    PROG_SCHED_WAKEUP_NOCAS,
    PROG_SCHED_WAKEUP_BTF,
    PROG_SCHED_WAKEUP_BTF_BOUNDED,
    PROG_SCHED_WAKEUP_BTF_BOUNDED_NOCAS,
    PROG_SCHED_WAKEUP_BTF_WALK,
    PROG_SCHED_WAKEUP_BTF_WALK_NOCAS,
    PROG_SCHED_PROCESS_EXIT,
    PROG_SCHED_PROCESS_EXIT_NOCAS,
    PROG_SCHED_PROCESS_FREE,
    PROG_SCHED_PROCESS_FREE_NOCAS,
    PROG_LOCAL_TIMER_ENTRY,
    PROG_TICK_STOP,
    PROG_USER_ENTER,
    PROG_USER_EXIT,
    PROG_TASK_RENAME,
];
/// The floor (`--debug-floor`, for the benchmark): for each hook latprof uses, a program of
/// the same type that does nothing, as (program, hook). Those named `_btf` are BTF
/// tracepoints'; every other is a raw tracepoint's.
pub const FLOOR_PROGRAMS: [(&str, &str); 17] = [
    ("floor_switch", "sched_switch"),
    (FLOOR_SWITCH_BTF, "sched_switch"),
    ("floor_wakeup", "sched_wakeup"),
    (FLOOR_WAKEUP_BTF, "sched_wakeup"),
    ("floor_exit", "sched_process_exit"),
    ("floor_free", "sched_process_free"),
    ("floor_rename", "task_rename"),
    ("floor_timer", "local_timer_entry"),
    ("floor_tick_stop", "tick_stop"),
    ("floor_user_ent", "user_enter"),
    ("floor_user_exit", "user_exit"),
    ("floor_waking", "sched_waking"),
    (FLOOR_WAKING_BTF, "sched_waking"),
    ("floor_hrt_entry", "hrtimer_expire_entry"),
    ("floor_hrt_exit", "hrtimer_expire_exit"),
    ("floor_tmr_entry", "timer_expire_entry"),
    ("floor_tmr_exit", "timer_expire_exit"),
];
pub const FLOOR_WAKEUP_BTF: &str = "floor_wakeup_btf";
pub const FLOOR_WAKING_BTF: &str = "floor_waking_btf";
pub const FLOOR_SWITCH_BTF: &str = "floor_switch_btf";
/// Programs a session has loaded besides the tick programs: the three latency programs, the
/// free program and the rename program.
pub const LOADED_PROGRAMS: usize = 5;

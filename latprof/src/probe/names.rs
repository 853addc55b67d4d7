//! The one place user space names the eBPF object's maps, programs and globals.

pub const MAP_TASKS: &str = "TASKS";
pub const MAP_GLOBAL_LATENCY: &str = "GLOBAL_LATENCY";
pub const MAP_STACKS: &str = "STACKS";
pub const MAP_COUNTERS: &str = "COUNTERS";
pub const MAP_SCRATCH: &str = "SCRATCH";
pub const MAP_STACK_BUF: &str = "STACK_BUF";
pub const MAP_HISTOGRAMS: &str = "HISTOGRAMS";
pub const MAPS: [&str; 7] = [
    MAP_HISTOGRAMS,
    MAP_TASKS,
    MAP_GLOBAL_LATENCY,
    MAP_STACKS,
    MAP_COUNTERS,
    MAP_SCRATCH,
    MAP_STACK_BUF,
];

/// Programs, each attached to the raw tracepoint of the same name.
pub const PROGRAMS: [&str; 3] = ["sched_switch", "sched_wakeup", "sched_process_exit"];

pub const GLOBAL_MODE: &str = "MODE";
pub const GLOBAL_FILTER_TGID: &str = "FILTER_TGID";
pub const GLOBAL_SELF_TGID: &str = "SELF_TGID";
pub const GLOBAL_SKIP_KTHREADS: &str = "SKIP_KTHREADS";
pub const GLOBAL_INTER_CUTOFF_NS: &str = "INTER_CUTOFF_NS";
pub const GLOBAL_MIN_SLEEP_NS: &str = "MIN_SLEEP_NS";
pub const GLOBAL_SWITCH_HAS_PREV_STATE: &str = "SWITCH_HAS_PREV_STATE";
pub const GLOBAL_TASK_STATE_OFF: &str = "TASK_STATE_OFF";
pub const GLOBAL_TASK_PID_OFF: &str = "TASK_PID_OFF";
pub const GLOBAL_TASK_FLAGS_OFF: &str = "TASK_FLAGS_OFF";
pub const GLOBAL_TASK_MM_OFF: &str = "TASK_MM_OFF";
pub const GLOBAL_RUNQ: &str = "RUNQ";
pub const GLOBAL_HISTOGRAMS_ON: &str = "HISTOGRAMS_ON";
pub const GLOBAL_STACK_WALK_FRAMES: &str = "STACK_WALK_FRAMES";

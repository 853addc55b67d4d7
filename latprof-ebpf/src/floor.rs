//! The floor: programs that do nothing, one on each hook latprof uses and of the same type
//! (raw tracepoints, and the BTF tracepoints at switch and wakeup). The benchmark attaches them instead of
//! latprof's own (the hidden `--debug-floor`): what they cost is what the kernel charges for
//! running any program there, the least latprof's programs could cost.
//!
//! Each is named `floor_` and a short name of its hook (the kernel keeps 15 bytes of a
//! program's name: these stay apart); none reads or writes anything.

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn floor_switch(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn floor_wakeup(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn floor_wakeup_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn floor_exit(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn floor_free(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "task_rename")]
pub fn floor_rename(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "local_timer_entry")]
pub fn floor_timer(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "tick_stop")]
pub fn floor_tick_stop(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "user_enter")]
pub fn floor_user_ent(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "user_exit")]
pub fn floor_user_exit(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn floor_waking(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_waking")]
pub fn floor_waking_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "hrtimer_expire_entry")]
pub fn floor_hrt_entry(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "hrtimer_expire_exit")]
pub fn floor_hrt_exit(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "timer_expire_entry")]
pub fn floor_tmr_entry(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "timer_expire_exit")]
pub fn floor_tmr_exit(_ctx: RawTracePointContext) -> i32 {
    0
}

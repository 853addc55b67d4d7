//! Tick and time-accounting programs: per-CPU counters only (`TICKS`), one program per raw
//! tracepoint of the same name. A kernel without one of these tracepoints runs without that
//! program.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use latprof_common::{TICK_DEP_BITS, TickCounter, tick_dep_counter};

use crate::maps::tick_count;

#[raw_tracepoint(tracepoint = "local_timer_entry")]
pub fn local_timer_entry(_ctx: RawTracePointContext) -> i32 {
    tick_count(TickCounter::TimerTicks);
    0
}

/// `TP_PROTO(int success, int dependency)`: `dependency` is a mask of `TICK_DEP_MASK_*`.
#[raw_tracepoint(tracepoint = "tick_stop")]
pub fn tick_stop(ctx: RawTracePointContext) -> i32 {
    let success: u64 = ctx.arg(0);
    let dependency: u64 = ctx.arg(1);
    if success & 0xffff_ffff != 0 {
        tick_count(TickCounter::TickStopOk);
        return 0;
    }
    tick_count(TickCounter::TickStopFail);
    for bit in 0..TICK_DEP_BITS {
        if dependency & (1 << bit) != 0
            && let Some(counter) = tick_dep_counter(bit)
        {
            tick_count(counter);
        }
    }
    0
}

#[raw_tracepoint(tracepoint = "user_enter")]
pub fn user_enter(_ctx: RawTracePointContext) -> i32 {
    tick_count(TickCounter::UserEnter);
    0
}

#[raw_tracepoint(tracepoint = "user_exit")]
pub fn user_exit(_ctx: RawTracePointContext) -> i32 {
    tick_count(TickCounter::UserExit);
    0
}

//! latprof's eBPF programs: latencytop's accounting on three scheduler tracepoints, attached
//! as raw tracepoints (no perf buffer in between: perf's tracepoint path drops an event now and
//! then when it finds its per-context recursion slot taken, which lost one wakeup in a few
//! hundred; a raw tracepoint program sees every event, and a skipped run would show in the
//! kernel's recursion_misses).
//!
//! * `sched_switch`: a task leaving the CPU in S or D state starts a sleep; its kernel backtrace
//!   is taken here, where it chose to sleep.
//! * `sched_wakeup`: the sleep ends; it is filtered like latencytop does and accounted into the
//!   task's own records (both modes) and, in normal mode, into the global table.
//! * `sched_process_exit`: in lazy mode the task's records are merged into the global table;
//!   in both modes the task's entry is freed.
//!
//! Settings fixed for a run are `Global`s written by the loader, so the verifier drops the
//! branches a run does not use.
#![no_std]
#![no_main]
// The bpf target has no atomic RMW in core::sync::atomic; the intrinsics lower to BPF_ATOMIC.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic intrinsics, see above")]

mod account;
mod debug;
mod maps;
mod settings;
mod spikes;
mod stack_cache;
mod stacks;
mod switch;
mod ticks;
mod wakeup;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

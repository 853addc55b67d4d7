//! latprof's eBPF programs: latencytop's accounting of why tasks sleep, taken from the
//! scheduler's tracepoints, and per-CPU tick counters. The object holds every variant of every
//! program; user space (`latprof/src/probe`) loads the best variant of each latency program
//! that the kernel accepts, plus the tick programs whose tracepoints exist, and finds programs
//! and maps by their symbol names (`probe/names.rs`) and globals by the settings table both
//! sides expand (`latprof-common/src/settings.rs`): do not rename them.
//!
//! Programs attach as raw or BTF tracepoints, with no perf buffer in between: perf's
//! tracepoint path drops an event now and then when it finds its per-context recursion slot
//! taken, which lost one wakeup in a few hundred; a raw tracepoint program sees every event,
//! and a skipped run would show in the kernel's `recursion_misses`.
//!
//! # Programs
//!
//! * `sched_switch` ([`switch`]): the task coming in stops waiting for a CPU (run-queue
//!   latency, when `RUNQ`); a task leaving the CPU in S or D state starts a sleep; a task
//!   leaving it dead takes an entry made after `sched_process_exit` with it ([`exit`]).
//! * `sched_wakeup` ([`wakeup`]): the sleep ends. It is filtered as latencytop does, and a
//!   counted one is accounted ([`account`]) into the task's own records, the per-cause
//!   histograms and, in normal mode, the global table; one of at least `SPIKE_NS` also goes to
//!   user space as a spike ([`spikes`]). From then on the task waits for a CPU.
//! * `sched_process_exit` ([`exit`]): in lazy mode the task's records are merged into this
//!   CPU's part of the global table; in both modes the task's entry is freed.
//! * `sched_process_free` ([`exit`]): the entry of a task first seen while exiting, made
//!   after `sched_process_exit`, goes when the task is freed, where its last switch was not
//!   seen.
//! * `task_rename` ([`rename`]): a tracked task's name follows exec and renames.
//! * `local_timer_entry`, `tick_stop`, `user_enter`, `user_exit` ([`ticks`]): per-CPU counts
//!   of ticks, tick-stop outcomes and their reasons, and user-mode transitions.
//!
//! # Variants
//!
//! Where a counted sleep's backtrace is taken ([`stacks`] walks and stores them):
//!
//! * At switch-out, `sched_wakeup` (raw tracepoint, which cannot take another task's
//!   backtrace): every sleep's stack is walked where it begins, counted or not (kernels
//!   without BTF tracepoints, `--no-btf-wakeup`).
//! * At wakeup, `sched_wakeup_btf*` (BTF tracepoint; `STACK_AT_WAKEUP`): only counted sleeps,
//!   from the sleeping task, which costs less than a walk at switch-out:
//!   * `sched_wakeup_btf`: through the [`stack_cache`], which mostly answers without a walk
//!     (needs `bpf_loop` and `bpf_task_pt_regs`, Linux 5.17);
//!   * `sched_wakeup_btf_bounded`: the same cache, learnt in a bounded loop instead (kernels
//!     without those helpers, such as Debian 11's 5.10; `--debug-bounded-cache` forces it);
//!   * `sched_wakeup_btf_walk`: every backtrace walked (`--no-stack-cache`, or a kernel that
//!     refuses the cache).
//!
//! The `_nocas` twins (`sched_switch_nocas`, `sched_wakeup_nocas`,
//! `sched_wakeup_btf_bounded_nocas`, `sched_wakeup_btf_walk_nocas`, `sched_process_exit_nocas`,
//! `sched_process_free_nocas`) are the same programs without BPF compare-and-swap, for kernels
//! before 5.12, which reject the instruction even where it never runs: the spike reader's flag
//! is taken with a plain load and store, and normal mode keeps maxima per CPU (`MERGED`) for
//! user space to combine. `sched_wakeup_btf` needs no twin: `bpf_loop` came after
//! compare-and-swap. Each variant is one instantiation of the same code (const parameters
//! `CAS`, `HELPERS`, `BT`), so it holds nothing another kernel would refuse (verifier rule 7 in
//! [`stack_cache`]).
//!
//! # Modules
//!
//! Each file, lowest floor first (a file uses only those above it in this list):
//!
//! * [`floor`]: programs that do nothing, one per hook, for the benchmark's floor
//!   (`--debug-floor`).
//! * [`settings`]: the `Global`s the loader fixes for a run, so the verifier drops the
//!   branches a run does not use.
//! * [`maps`]: every map, and the counters' helpers.
//! * [`shared`]: `--debug-checks`' count of writes to data every CPU shares.
//! * [`kfuncs`]: the kernel functions called where the kernel has them (`bpf_rdonly_cast`:
//!   plain loads of kernel memory), by markers user space rewrites.
//! * [`unwind`]: user frames without frame pointers stepped through by unwind tables.
//! * [`task_table`]: where each task's entry lives: a slot indexed by tid, or the hash.
//!   [`defects`]: `--debug-defect`, wrong answers made on purpose for the tests' mutants,
//!   absent from the programs without the flag.
//! * [`debug`]: `--debug-checks`, counted and logged anomalies, absent from the programs
//!   without the flag.
//! * [`stacks`] (walk and store kernel backtraces), [`stack_cache`] (backtraces without a
//!   walk; the numbered verifier rules), [`ustacks`] (user backtraces, `--user-stacks`).
//! * [`spikes`]: the spike ring buffer. [`chains`]: what a sleep's waker was doing meanwhile
//!   (`--chains`). [`wakers`]: who woke each sleep (`--wakers`).
//! * [`account`]: a counted sleep into records, histograms and tables.
//! * [`recover`]: sleeps whose wakeup the kernel hid, recovered and accounted.
//! * [`exit`]: a task's end (recovery of its open sleep, lazy mode's merge).
//! * [`switch`], [`wakeup`]: the scheduler's programs. [`rename`]: task names. [`ticks`]:
//!   tick counters.
//! * `lib.rs`: the crate's library face (nothing but the build's marker).
#![no_std]
#![no_main]
// The bpf target has no atomic RMW in core::sync::atomic; the intrinsics lower to BPF_ATOMIC.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic intrinsics, see above")]
// Clippy (pedantic, the workspace's lints) runs on this crate with warnings denied; these
// lints do not fit eBPF code anywhere in it.
#![expect(
    clippy::inline_always,
    reason = "what is inlined decides the verifier's work and the 512-byte stack (the verifier \
              rules in stack_cache), so the source decides it, not LLVM's heuristics"
)]
#![expect(
    clippy::cast_possible_truncation,
    reason = "bpfel's usize is 64 bits; the narrowing casts keep a low half on purpose (the tid \
              in pid_tgid) or are of values bounded by masks and map sizes, and a checked \
              conversion would add a branch per cast for the verifier to walk"
)]
#![expect(
    clippy::cast_sign_loss,
    reason = "signed kernel values that are never negative where cast: a pid_t, a helper's \
              length after its error check, an address"
)]
#![expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand every program its context by value"
)]

mod account;
mod chains;
mod debug;
mod defects;
mod exit;
mod floor;
mod kfuncs;
mod maps;
mod recover;
mod rename;
mod settings;
mod shared;
mod spikes;
mod stack_cache;
mod stacks;
mod switch;
mod task_table;
mod ticks;
mod unwind;
mod ustacks;
mod wakers;
mod wakeup;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The object's license, as the kernel reads it: "Dual MIT/GPL" is GPL-compatible, which the
/// GPL-only helpers latprof calls need (`bpf_probe_read_kernel`, `_str`, `bpf_probe_read_user`,
/// `bpf_get_current_task`, `bpf_task_pt_regs`, `bpf_get_stack`); the crate is `MIT OR
/// GPL-2.0-only` to match (LICENSE-MIT, LICENSE-GPL-2.0 beside it).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

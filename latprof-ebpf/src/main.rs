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

mod debug;
mod maps;
mod settings;
mod spikes;
mod ticks;

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    bindings::task_struct,
    cty::c_void,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_stack,
        bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    helpers::{bpf_get_task_stack, bpf_loop, bpf_task_pt_regs, generated},
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use debug::anomaly;
use latprof_common::{
    CACHE_ENTRIES, CACHE_FRAMES, CachedStack, Counter, DEFERRED_STACK, GlobalRecord, HIST_BUCKETS,
    Histogram, LatencyRecord, MODE_LAZY, MODE_NORMAL, NO_STACK, RUNQ_STACK, RawStack, SLEEP_NONE,
    SPIKE_RUNQ, STACK_CHUNK, STACK_FRAMES, STACK_HASH_SEED, SleepVerdict, StackCache,
    TASK_FLAG_KTHREAD, TASK_RECORDS, TaskState, TickCounter, hist_bucket, sleep_kind,
    sleep_verdict, stack_hash, stack_hash_step,
};
use maps::{
    COUNTERS, CPU_CACHE, GLOBAL_LATENCY, HISTOGRAMS, LEARNT, MERGED, REGION_WORDS, SCAN_POS,
    SCRATCH, STACK_BUF, STACK_COPY, STACKS, TASKS, WALKED_FRAMES, count, tick_count,
};
use settings::{
    DEBUG_CHECKS, FILTER_TGID, FORCE_REJECT, HISTOGRAMS_ON, INTER_CUTOFF_NS, MIN_SLEEP_NS, MODE,
    PT_REGS_IN_STACK, RUNQ, SELF_TGID, SKIP_KTHREADS, STACK_AT_WAKEUP, STACK_WALK_FRAMES,
    SWITCH_HAS_PREV_STATE, TASK_FLAGS_OFF, TASK_MM_OFF, TASK_PID_OFF, TASK_STACK_OFF,
    TASK_STATE_OFF, THREAD_SP_OFF, read_field,
};
use spikes::spike;

const PF_EXITING: u32 = 0x4;

// Indexes into these are masked with `size - 1` (the verifier needs every index bounded).
const _: () = assert!(TASK_RECORDS.is_power_of_two());
const _: () = assert!(CACHE_ENTRIES.is_power_of_two());
const _: () = assert!(CACHE_FRAMES.is_power_of_two());
const _: () = assert!(REGION_WORDS.is_power_of_two());
const _: () = assert!((REGION_WORDS / CHUNK_WORDS).is_power_of_two());
const CHUNK_WORDS: usize = STACK_CHUNK / 8;
/// The stack copy's last word: where the hit check puts the word below the user registers.
const OUTER_WORD: usize = REGION_WORDS - 1;
/// A word the hit check zeroes: where the positions past an entry's frames point.
const ZERO_WORD: usize = REGION_WORDS - 2;

// ---- sched_switch: a sleep begins ----

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    try_sched_switch::<true>(&ctx).unwrap_or(1)
}

/// `sched_switch` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_switch::<false>(&ctx).unwrap_or(1)
}

fn try_sched_switch<const CAS: bool>(ctx: &RawTracePointContext) -> Result<i32, i32> {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next
    //          [, unsigned int prev_state])
    let preempt: u64 = ctx.arg(0);
    let state: u64 = if SWITCH_HAS_PREV_STATE.load() == 1 {
        ctx.arg::<u64>(3) & 0xffff_ffff
    } else {
        let prev: *const u8 = ctx.arg(1);
        u64::from(read_field::<u32>(prev, TASK_STATE_OFF.load())?)
    };
    let kind = sleep_kind(preempt & 1 != 0, state);
    tick_count(TickCounter::Switches);
    if FORCE_REJECT.load() == 1
        && let Some(slot) = COUNTERS.get_ptr(0)
    {
        // SAFETY: never runs: the verifier rejects the program for this read (see FORCE_REJECT).
        let past = unsafe { core::ptr::read_volatile(slot.cast::<u8>().wrapping_add(4096)) };
        return Ok(i32::from(past));
    }

    // The task coming in stops waiting for the CPU.
    if RUNQ.load() == 1 {
        runq_end::<CAS>(ctx)?;
    }

    if kind == SLEEP_NONE {
        return Ok(0);
    }
    switch_out(ctx, kind)
}

/// Ends the run-queue wait of the task switched in.
fn runq_end<const CAS: bool>(ctx: &RawTracePointContext) -> Result<(), i32> {
    let next: *const u8 = ctx.arg(2);
    let next_tid = read_field::<i32>(next, TASK_PID_OFF.load())? as u32;
    if next_tid != 0
        && let Some(entry) = TASKS.get_ptr_mut(&next_tid)
    {
        // SAFETY: next is not running yet; only its own events write its entry.
        let entry = unsafe { &mut *entry };
        if entry.runq_start_ns != 0 {
            let delta = unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.runq_start_ns);
            entry.runq_start_ns = 0;
            if delta >= MIN_SLEEP_NS.load() {
                account::<CAS>(entry, RUNQ_STACK, delta);
                count(Counter::RunqCounted);
                spike::<CAS>(next_tid, entry, RUNQ_STACK, delta, SPIKE_RUNQ);
            }
        }
    }
    Ok(())
}

/// The task switched out in S or D state starts a sleep.
fn switch_out(ctx: &RawTracePointContext, kind: u32) -> Result<i32, i32> {
    // prev is the current task at sched_switch.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    if tid == 0 || tgid == SELF_TGID.load() {
        return Ok(0);
    }
    let filter = FILTER_TGID.load();
    if filter != 0 && tgid != filter {
        return Ok(0);
    }
    let entry = match TASKS.get_ptr_mut(&tid) {
        Some(entry) => entry,
        None => match new_task(tid, tgid)? {
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
    // SAFETY: the entry belongs to the current task; only its own events write it.
    unsafe {
        if (*entry).sleep_kind != SLEEP_NONE {
            // The previous sleep never saw its wakeup.
            count(Counter::SleepLost);
        }
        (*entry).sleep_stack = stack;
        (*entry).sleep_kind = kind;
        (*entry).sleep_start_ns = bpf_ktime_get_ns();
    }
    count(Counter::SleepsTracked);
    Ok(0)
}

/// Walks the current kernel stack and stores it; returns its id, or `NO_STACK`.
fn take_stack(ctx: &RawTracePointContext) -> u64 {
    let Some(buf) = STACK_BUF.get_ptr_mut(0) else {
        return NO_STACK;
    };
    // SAFETY: buf is a per-CPU map value of at least `walk_size()` bytes.
    let len = unsafe { bpf_get_stack(ctx.as_ptr(), buf.cast(), walk_size(), 0) };
    count(Counter::StackWalks);
    store_stack(buf, len)
}

/// The backtrace of a task that is not running (where it went to sleep), as latencytop takes
/// it: the kernel leaves out the scheduler's own frames. The frames stay in `STACK_BUF`, their
/// count in `WALKED_FRAMES`.
fn task_stack(task: *mut task_struct) -> u64 {
    let Some(buf) = STACK_BUF.get_ptr_mut(0) else {
        return NO_STACK;
    };
    // SAFETY: task is the BTF tracepoint's trusted task pointer; buf as above.
    let len = unsafe { bpf_get_task_stack(task, buf.cast(), walk_size(), 0) };
    count(Counter::StackWalks);
    // The frame count goes through map memory, which the verifier does not track: one state
    // for the code after a walk instead of one per possible count.
    if let Some(walked) = WALKED_FRAMES.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        unsafe { *walked = if len > 0 { len as u64 / 8 } else { 0 } };
    }
    store_stack(buf, len)
}

/// The backtrace of the sleeping `task`, from its stack cache when the cache can vouch for it,
/// else walked (and learnt, when the task or this CPU walked this backtrace not long ago). Not inlined:
/// its many ways through (each cache entry, hit or miss, learnt or not) end in one return the
/// verifier can prune at, instead of each continuing through the accounting after it.
#[inline(never)]
fn sleeping_stack<C: EbpfContext, const HELPERS: bool>(
    ctx: &C,
    tid: u32,
    task: *mut task_struct,
    entry: &mut TaskState,
) -> u64 {
    let off = THREAD_SP_OFF.load();
    if off == 0 {
        return task_stack(task);
    }
    let Ok(sp) = read_field::<u64>(task.cast_const().cast(), off) else {
        return task_stack(task);
    };
    let regs = if HELPERS {
        // SAFETY: task is the BTF tracepoint's trusted task pointer.
        let regs = unsafe { bpf_task_pt_regs(task) } as u64;
        // The kernel hands the registers' address as a pointer the verifier allows no
        // arithmetic on; read back through a probe read, it is a number.
        // SAFETY: reads a local.
        unsafe { bpf_probe_read_kernel(&raw const regs) }.unwrap_or(0)
    } else {
        // x86-64's task_pt_regs(): at the top of the task's stack.
        read_field::<u64>(task.cast_const().cast(), TASK_STACK_OFF.load())
            .map_or(0, |stack| stack + u64::from(PT_REGS_IN_STACK.load()))
    };
    if regs <= sp {
        return task_stack(task);
    }
    if let Some(stack) = cached_stack(sp, regs, entry) {
        count(Counter::StackCacheHits);
        if DEBUG_CHECKS.load() == 1 {
            let walked = task_stack(task);
            if walked != stack {
                anomaly(ctx, Counter::DebugStackCacheWrong, tid, walked);
            }
        }
        return stack;
    }
    let stack = task_stack(task);
    if stack == NO_STACK {
        return stack;
    }
    remember::<HELPERS>(sp, regs, stack, entry);
    stack
}

/// After a walk: learns the backtrace when this task, or any task on this CPU, slept with it
/// not long ago (a task that sleeps once somewhere no other does, or somewhere new each time,
/// pays no scan), for the task and for this CPU: a new process or thread that sleeps where
/// others have (a fork storm's children, a pool's workers) then finds it in the CPU's cache.
/// Not inlined, for the verifier.
#[inline(never)]
fn remember<const HELPERS: bool>(sp: u64, regs: u64, stack: u64, entry: &mut TaskState) {
    let Some(frames) = WALKED_FRAMES.get_ptr(0) else {
        return;
    };
    // SAFETY: this CPU's slot, written by the walk just before.
    let frames = unsafe { *frames } as usize;
    let Some(cpu) = CPU_CACHE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's cache; programs on one CPU do not run concurrently.
    let cpu = unsafe { &mut *cpu };
    let seen = note_walked(&mut entry.stack_cache, stack) | note_walked(cpu, stack);
    if !seen || frames == 0 || frames > CACHE_FRAMES {
        return;
    }
    let Some(learnt) = learn_stack::<HELPERS>(sp, regs, stack, frames) else {
        return;
    };
    // SAFETY: this CPU's learnt entry.
    let learnt = unsafe { &*learnt };
    keep(&mut entry.stack_cache, learnt);
    keep(cpu, learnt);
}

/// Adds `stack` to a cache's ring of recently walked backtraces; returns whether it was there.
#[inline(always)]
fn note_walked(cache: &mut StackCache, stack: u64) -> bool {
    let mut seen = false;
    for e in 0..CACHE_ENTRIES {
        seen |= cache.recent[e] == stack;
    }
    let at = cache.recent_next as usize % CACHE_ENTRIES;
    cache.recent[at] = stack;
    cache.recent_next = (at as u32 + 1) % CACHE_ENTRIES as u32;
    seen
}

/// Stores a learnt entry in a cache: in the slot that holds its backtrace already (its places
/// changed), else in the next one round the ring.
#[inline(never)]
fn keep(cache: &mut StackCache, learnt: &CachedStack) {
    let mut slot = CACHE_ENTRIES;
    for e in 0..CACHE_ENTRIES {
        if cache.entries[e].words != 0 && cache.entries[e].stack == learnt.stack {
            slot = e;
        }
    }
    if slot == CACHE_ENTRIES {
        slot = cache.next as usize % CACHE_ENTRIES;
        cache.next = (slot as u32 + 1) % CACHE_ENTRIES as u32;
    }
    cache.entries[slot & (CACHE_ENTRIES - 1)] = *learnt;
}

/// A cached backtrace whose return addresses the task's stack holds in their places: the
/// inner frames at the same distances from the saved stack pointer, the outermost (the entry
/// code's, above a syscall's random stack offset) at the same distance below the task's user
/// registers.
/// Not inlined: its ways through end in one return for the verifier.
#[inline(never)]
fn cached_stack(sp: u64, regs: u64, entry: &TaskState) -> Option<u64> {
    let cpu = CPU_CACHE.get_ptr(0)?;
    // SAFETY: this CPU's cache.
    let cpu = unsafe { &*cpu };
    // Between the stack pointer and the user registers: all of this task's stack that an
    // entry can use (a deeper one, from another task, cannot match; reading past the end of
    // the stack would fail).
    let avail = ((regs - sp) / 8) as usize;
    let words = usable_words(&entry.stack_cache, avail)
        .max(usable_words(cpu, avail))
        .min(ZERO_WORD);
    if words == 0 {
        return None;
    }
    let copy = STACK_COPY.get_ptr_mut(0)?;
    // SAFETY: the copy is a per-CPU map value of REGION_WORDS words; a bad read fails safely.
    let read = unsafe {
        generated::bpf_probe_read_kernel(copy.cast(), (words * 8) as u32, sp as *const c_void)
    };
    if read != 0 {
        return None;
    }
    // The word right below the user registers goes to the copy's last word, where the
    // positions of outermost frames point: one loop reads every frame the same way.
    // SAFETY: a probe read fails safely on a bad address; the copy as above.
    unsafe {
        (*copy)[OUTER_WORD] = bpf_probe_read_kernel(regs.wrapping_sub(8) as *const u64).ok()?;
        (*copy)[ZERO_WORD] = 0;
    }
    matching_entry(copy, &entry.stack_cache, words).or_else(|| matching_entry(copy, cpu, words))
}

/// The most words any entry of `cache` that fits in `avail` words needs read.
#[inline(always)]
fn usable_words(cache: &StackCache, avail: usize) -> usize {
    let mut words = 0;
    for e in 0..CACHE_ENTRIES {
        let need = cache.entries[e].words as usize;
        if need <= avail {
            words = words.max(need);
        }
    }
    words
}

/// The backtrace of the first entry of `cache` the copy (of `words` words) matches. Only
/// entries within what was read: the copy past it holds another stack's words.
#[inline(always)]
fn matching_entry(
    copy: *const [u64; REGION_WORDS],
    cache: &StackCache,
    words: usize,
) -> Option<u64> {
    for e in 0..CACHE_ENTRIES {
        let cached = &cache.entries[e];
        if cached.words != 0 && cached.words as usize <= words && cache_entry_matches(copy, cached)
        {
            return Some(cached.stack);
        }
    }
    None
}

/// Whether the copied stack holds `cached`'s return addresses in their places: the same
/// steps for every entry, without a branch.
#[inline(always)]
fn cache_entry_matches(copy: *const [u64; REGION_WORDS], cached: &CachedStack) -> bool {
    // The innermost return address first: most entries that do not match stop here.
    let first = cached.pos[0] as usize & (REGION_WORDS - 1);
    // SAFETY: first is in range of the copy.
    if unsafe { (*copy)[first] } != cached.first {
        return false;
    }
    let mut h = STACK_HASH_SEED;
    for i in 0..CACHE_FRAMES {
        let at = cached.pos[i] as usize & (REGION_WORDS - 1);
        // SAFETY: at is in range of the copy.
        h = stack_hash_step(h, unsafe { (*copy)[at] });
    }
    h == cached.check
}

/// The stack cache's scan over the copied stack: finds, innermost first, the word holding each
/// walked return address.
#[repr(C)]
struct Scan {
    base: u64,
    /// First word of the live stack (the saved stack pointer), from `base`.
    start: u64,
    frames: u64,
}

/// Finds where each of the `frames` return addresses now in `STACK_BUF` sits on the sleeping
/// task's stack; returns the cache entry for `stack` (in per-CPU scratch), or `None` if some
/// is not found.
fn learn_stack<const HELPERS: bool>(
    sp: u64,
    regs: u64,
    stack: u64,
    frames: usize,
) -> Option<*const CachedStack> {
    let learnt = LEARNT.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch entry.
    let slot = unsafe { &mut *learnt };
    let scan_pos = SCAN_POS.get_ptr_mut(0)?;
    // SAFETY: this CPU's scan progress. Positions past the frames point at the word the hit
    // check zeroes, so the check runs the same steps for every entry (no branch).
    unsafe {
        (*scan_pos).found = 0;
        (*scan_pos).pos = [ZERO_WORD as u16; CACHE_FRAMES];
    }
    let base = sp & !(STACK_CHUNK as u64 - 1);
    let mut scan = Scan {
        base,
        start: (sp - base) / 8,
        frames: frames as u64,
    };
    let words = REGION_WORDS as u32 - scan.start as u32;
    if HELPERS {
        // SAFETY: the callback is a static function of this object; scan lives on this stack
        // for the whole call.
        unsafe {
            bpf_loop(
                words,
                scan_word as *const () as *mut c_void,
                (&raw mut scan).cast(),
                0,
            );
        }
    } else {
        scan_bounded(&scan, words as usize);
    }
    // SAFETY: this CPU's scan result.
    let progress = unsafe { &mut *scan_pos };
    if progress.found != frames as u64 || frames == 0 {
        return None;
    }
    // A volatile read keeps the mask, which the compiler would drop as redundant but the
    // verifier needs (frames came through map memory, so it knows no bound).
    // SAFETY: reads a local.
    let last = unsafe { core::ptr::read_volatile(&(frames - 1)) } & (CACHE_FRAMES - 1);
    // Positions grow outwards. The entry code calls into C right below the user registers; a
    // syscall then moves the rest of the stack down by a random offset, so that frame is read
    // from the registers (the copy's OUTER_WORD) and the others from the stack pointer.
    let last_at = sp + u64::from(progress.pos[last]) * 8;
    let outer = last_at.wrapping_add(8) == regs;
    let words = if outer {
        if last == 0 {
            0
        } else {
            // SAFETY: reads a local, as above.
            let k = unsafe { core::ptr::read_volatile(&(last - 1)) } & (CACHE_FRAMES - 1);
            u32::from(progress.pos[k]) + 1
        }
    } else {
        u32::from(progress.pos[last]) + 1
    };
    if words as usize >= ZERO_WORD {
        return None;
    }
    if outer {
        progress.pos[last] = OUTER_WORD as u16;
    }
    // The walk left zeroes past its frames: the check hashes all CACHE_FRAMES of them, as the
    // hit check does.
    let ips = STACK_BUF.get_ptr(0)?;
    let mut check = STACK_HASH_SEED;
    // A loop the compiler cannot unroll (its bound is read through a volatile): unrolled, it
    // loads all 32 frames first and spills them to the stack (256 bytes), and Linux 6.1 adds
    // this frame to the scan callback's into a combined stack over its 512-byte limit. The
    // verifier walks the 32 rounds of this small loop.
    // SAFETY: reads a local.
    let rounds = unsafe { core::ptr::read_volatile(&CACHE_FRAMES) };
    for i in 0..rounds {
        if i >= CACHE_FRAMES {
            break;
        }
        // SAFETY: this CPU's walked frames; i is in range.
        check = stack_hash_step(check, unsafe { (*ips)[i] });
    }
    slot.pos = progress.pos;
    slot.stack = stack;
    slot.check = check;
    // SAFETY: as above.
    slot.first = unsafe { (*ips)[0] };
    slot.outer = u16::from(outer);
    slot.frames = frames as u16;
    slot.words = words.max(1);
    Some(learnt.cast_const())
}

/// `learn_stack`'s scan without `bpf_loop`: the same steps as `scan_word` in a bounded loop
/// (Linux 5.3), written for the verifier, which walks every round: no call and no map lookup
/// per round, and the count of frames found kept in map memory (untracked, so one state per
/// round). Not inlined: verified once.
#[inline(never)]
fn scan_bounded(scan: &Scan, words: usize) {
    let (Some(copy), Some(ips), Some(pos)) = (
        STACK_COPY.get_ptr_mut(0),
        STACK_BUF.get_ptr(0),
        SCAN_POS.get_ptr_mut(0),
    ) else {
        return;
    };
    let start = scan.start as usize;
    let frames = scan.frames as usize;
    for i in 0..REGION_WORDS {
        let word = start + i;
        if i >= words || word >= REGION_WORDS {
            break;
        }
        if i == 0 || word % CHUNK_WORDS == 0 {
            // The volatile read keeps the mask the compiler finds redundant (word < 512) and
            // the verifier needs.
            // SAFETY: reads a local.
            let chunk = unsafe { core::ptr::read_volatile(&(word / CHUNK_WORDS)) }
                & (REGION_WORDS / CHUNK_WORDS - 1);
            // SAFETY: chunk is in range of the copy; a read past the end of the stack fails
            // safely (and ends the scan).
            let read = unsafe {
                generated::bpf_probe_read_kernel(
                    (*copy).as_mut_ptr().add(chunk * CHUNK_WORDS).cast(),
                    STACK_CHUNK as u32,
                    (scan.base + (chunk * STACK_CHUNK) as u64) as *const c_void,
                )
            };
            if read != 0 {
                break;
            }
        }
        // SAFETY: this CPU's scan progress; a volatile read, so the count stays in map memory.
        let k = unsafe { core::ptr::read_volatile(&raw const (*pos).found) } as usize;
        if k >= frames {
            break;
        }
        let k = k & (CACHE_FRAMES - 1);
        // SAFETY: reads a local (the mask kept as above).
        let at = unsafe { core::ptr::read_volatile(&word) } & (REGION_WORDS - 1);
        // SAFETY: at and k are in range of the copy and the walked frames.
        if unsafe { (*copy)[at] == (*ips)[k] } {
            // SAFETY: as above.
            unsafe {
                (*pos).pos[k] = (word - start) as u16;
                core::ptr::write_volatile(&raw mut (*pos).found, k as u64 + 1);
            }
        }
    }
}

/// One step of `learn_stack`'s scan: word `start + i` of the copy (reading each chunk of the
/// stack as the scan reaches it). Returns 1 to stop.
#[inline(never)]
extern "C" fn scan_word(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is learn_stack's Scan.
    let scan = unsafe { &mut *ctx.cast::<Scan>() };
    let (Some(copy), Some(ips), Some(pos)) = (
        STACK_COPY.get_ptr_mut(0),
        STACK_BUF.get_ptr(0),
        SCAN_POS.get_ptr_mut(0),
    ) else {
        return 1;
    };
    let word = (scan.start + i) as usize;
    if word >= REGION_WORDS {
        return 1;
    }
    if i == 0 || word % CHUNK_WORDS == 0 {
        let chunk = (word / CHUNK_WORDS) & (REGION_WORDS / CHUNK_WORDS - 1);
        // SAFETY: chunk is in range of the copy; a read past the end of the stack fails safely
        // (and ends the scan).
        let read = unsafe {
            generated::bpf_probe_read_kernel(
                (*copy).as_mut_ptr().add(chunk * CHUNK_WORDS).cast(),
                STACK_CHUNK as u32,
                (scan.base + (chunk * STACK_CHUNK) as u64) as *const c_void,
            )
        };
        if read != 0 {
            return 1;
        }
    }
    // SAFETY: this CPU's scan progress.
    let progress = unsafe { &mut *pos };
    let k = progress.found as usize;
    if k >= CACHE_FRAMES || k >= scan.frames as usize {
        return 1;
    }
    // SAFETY: word and k are in range of the copy and the walked frames.
    if unsafe { (*copy)[word & (REGION_WORDS - 1)] == (*ips)[k] } {
        progress.pos[k] = (word - scan.start as usize) as u16;
        progress.found += 1;
        if progress.found >= scan.frames {
            return 1;
        }
    }
    0
}

#[inline(always)]
fn walk_size() -> u32 {
    STACK_WALK_FRAMES.load().min(STACK_FRAMES as u32) * 8
}

/// Stores the `len` bytes of frames in `buf` (the kernel zero-fills the rest of the walk size;
/// the buffer past it is never written) and returns their id, or `NO_STACK`.
fn store_stack(buf: *mut RawStack, len: i64) -> u64 {
    if len <= 0 {
        return NO_STACK;
    }
    let frames = (len as usize / 8).min(STACK_FRAMES);
    // SAFETY: per-CPU buffer, filled by the caller.
    let id = stack_hash(unsafe { &*buf }, frames);
    if STACKS.get_ptr(&id).is_some() {
        return id;
    }
    // SAFETY: as above.
    match STACKS.insert(&id, unsafe { &*buf }, u64::from(BPF_NOEXIST)) {
        // -EEXIST: another CPU stored the same stack first.
        Ok(()) | Err(-17) => id,
        Err(_) => NO_STACK,
    }
}

/// Creates the entry of the current task; `None` when it is exiting or the table is full.
fn new_task(tid: u32, tgid: u32) -> Result<Option<*mut TaskState>, i32> {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let flags: u32 = read_field(task, TASK_FLAGS_OFF.load())?;
    if flags & PF_EXITING != 0 {
        count(Counter::ExitingSkipped);
        return Ok(None);
    }
    let mm: u64 = read_field(task, TASK_MM_OFF.load())?;
    let template = SCRATCH.get_ptr_mut(0).ok_or(1)?;
    // SAFETY: per-CPU scratch; stale records past nr_records are never read.
    unsafe {
        (*template).sleep_start_ns = 0;
        (*template).runq_start_ns = 0;
        (*template).sleep_stack = NO_STACK;
        (*template).sleep_kind = SLEEP_NONE;
        (*template).tgid = tgid;
        (*template).flags = if mm == 0 { TASK_FLAG_KTHREAD } else { 0 };
        (*template).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        (*template).nr_records = 0;
        let cache = &mut (*template).stack_cache;
        cache.recent = [NO_STACK; CACHE_ENTRIES];
        cache.recent_next = 0;
        cache.next = 0;
        for e in 0..CACHE_ENTRIES {
            cache.entries[e].words = 0;
        }
        if TASKS
            .insert(&tid, &*template, u64::from(BPF_NOEXIST))
            .is_err()
        {
            count(Counter::TaskTableFull);
            return Ok(None);
        }
    }
    Ok(TASKS.get_ptr_mut(&tid))
}

// ---- sched_wakeup: the sleep ends ----

// How a wakeup program gets a counted sleep's backtrace. Each program is built for one (a
// const parameter), so a program holds no code, helper call or instruction of the others: an
// older kernel rejects an unknown instruction even where it can never run.
/// Walked at switch-out already (the raw tracepoint cannot take another task's backtrace).
const BT_SWITCH_OUT: u8 = 0;
/// Walked at wakeup from the sleeping task (BTF tracepoint).
const BT_WALK: u8 = 1;
/// At wakeup, from the stack cache when it can vouch for it (BTF tracepoint, `bpf_loop`).
const BT_CACHED: u8 = 2;
/// The same without `bpf_loop` and `bpf_task_pt_regs` (before 5.17 and 5.15): the stack is
/// scanned in a bounded loop, the user registers found from the task's stack.
const BT_CACHED_BOUNDED: u8 = 3;

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn sched_wakeup(ctx: RawTracePointContext) -> i32 {
    try_sched_wakeup::<true>(&ctx).unwrap_or(1)
}

/// `sched_wakeup` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn sched_wakeup_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_wakeup::<false>(&ctx).unwrap_or(1)
}

fn try_sched_wakeup<const CAS: bool>(ctx: &RawTracePointContext) -> Result<i32, i32> {
    // TP_PROTO(struct task_struct *p)
    let wakee: *const u8 = ctx.arg(0);
    wake::<_, CAS, BT_SWITCH_OUT>(ctx, wakee, core::ptr::null_mut())
}

/// The wakeup program where BTF tracepoints and `bpf_loop` exist: takes the backtrace of a
/// counted sleep from the wakee, through the stack cache.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<true, BT_CACHED>(&ctx).unwrap_or(1)
}

/// The stack cache without `bpf_loop` and `bpf_task_pt_regs`.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_bounded(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<true, BT_CACHED_BOUNDED>(&ctx).unwrap_or(1)
}

/// `sched_wakeup_btf_bounded` for kernels without BPF compare-and-swap (before 5.12).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_bounded_nocas(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<false, BT_CACHED_BOUNDED>(&ctx).unwrap_or(1)
}

/// BTF tracepoint wakeup that walks every counted sleep's stack (no `bpf_loop`).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_walk(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<true, BT_WALK>(&ctx).unwrap_or(1)
}

/// `sched_wakeup_btf_walk` for kernels without BPF compare-and-swap (before 5.12).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf_walk_nocas(ctx: BtfTracePointContext) -> i32 {
    try_sched_wakeup_btf::<false, BT_WALK>(&ctx).unwrap_or(1)
}

/// The wakeup program where BTF tracepoints exist: the same as `sched_wakeup`, and it takes the
/// backtrace of a counted sleep from the wakee.
fn try_sched_wakeup_btf<const CAS: bool, const BT: u8>(
    ctx: &BtfTracePointContext,
) -> Result<i32, i32> {
    // TP_PROTO(struct task_struct *p)
    let wakee: *mut task_struct = ctx.arg(0);
    wake::<_, CAS, BT>(ctx, wakee.cast_const().cast(), wakee)
}

/// A wakeup of `task`: ends its open sleep; `stack_of` (null for the raw program) is the same
/// task as a pointer the kernel trusts for taking its backtrace.
#[inline(always)]
fn wake<C: EbpfContext, const CAS: bool, const BT: u8>(
    ctx: &C,
    task: *const u8,
    stack_of: *mut task_struct,
) -> Result<i32, i32> {
    let tid = read_field::<i32>(task, TASK_PID_OFF.load())? as u32;
    let Some(entry) = TASKS.get_ptr_mut(&tid) else {
        if DEBUG_CHECKS.load() == 1 && tid != 0 {
            // A sleep latprof never saw begin: the task slept before latprof attached (or is
            // filtered out).
            anomaly(ctx, Counter::DebugWakeupWithoutSleep, tid, 0);
        }
        return Ok(0);
    };
    // SAFETY: the wakee is not running; ttwu serializes wakeups of one task (pi_lock).
    let entry = unsafe { &mut *entry };
    if entry.sleep_kind != SLEEP_NONE {
        count(Counter::Wakeups);
        end_sleep::<C, CAS, BT>(ctx, tid, entry, stack_of);
        if RUNQ.load() == 1 {
            // From now on the task waits for a CPU.
            entry.runq_start_ns = unsafe { bpf_ktime_get_ns() };
        }
    }
    Ok(0)
}

/// Ends the open sleep of `entry` now: filters it like latencytop and accounts it. With a
/// `wakee` (and `STACK_AT_WAKEUP`), a counted sleep's backtrace is taken from it now.
fn end_sleep<C: EbpfContext, const CAS: bool, const BT: u8>(
    ctx: &C,
    tid: u32,
    entry: &mut TaskState,
    wakee: *mut task_struct,
) {
    let kind = entry.sleep_kind;
    entry.sleep_kind = SLEEP_NONE;
    let now = unsafe { bpf_ktime_get_ns() };
    if DEBUG_CHECKS.load() == 1 && now < entry.sleep_start_ns {
        anomaly(
            ctx,
            Counter::DebugTimeBackwards,
            tid,
            entry.sleep_start_ns - now,
        );
    }
    let delta = now.saturating_sub(entry.sleep_start_ns);
    let verdict = sleep_verdict(kind, delta, MIN_SLEEP_NS.load(), INTER_CUTOFF_NS.load());
    match verdict {
        SleepVerdict::TooShort => count(Counter::SkippedZero),
        SleepVerdict::OverCutoff => count(Counter::SkippedCutoff),
        SleepVerdict::Count => {
            let stack = if entry.sleep_stack == DEFERRED_STACK {
                let stack = if wakee.is_null() {
                    NO_STACK
                } else if BT == BT_CACHED {
                    sleeping_stack::<C, true>(ctx, tid, wakee, entry)
                } else if BT == BT_CACHED_BOUNDED {
                    sleeping_stack::<C, false>(ctx, tid, wakee, entry)
                } else if BT == BT_WALK {
                    task_stack(wakee)
                } else {
                    NO_STACK
                };
                if stack == NO_STACK {
                    count(Counter::StackMissing);
                    if DEBUG_CHECKS.load() == 1 {
                        anomaly(ctx, Counter::DebugStackFailed, tid, 0);
                    }
                }
                stack
            } else {
                entry.sleep_stack
            };
            account::<CAS>(entry, stack, delta);
            count(Counter::Counted);
            spike::<CAS>(tid, entry, stack, delta, kind);
        }
    }
}

/// Adds one latency to the task's record of `stack` (and, in normal mode, the global one).
/// Not inlined: the ways through its record search end in one return for the verifier.
#[inline(never)]
fn account<const CAS: bool>(entry: &mut TaskState, stack: u64, delta: u64) {
    if HISTOGRAMS_ON.load() == 1 {
        histogram_add(stack, delta);
    }
    let in_global = entry.flags & TASK_FLAG_KTHREAD == 0 || SKIP_KTHREADS.load() == 0;
    let n = entry.nr_records as usize;
    let mut found = false;
    for i in 0..TASK_RECORDS {
        if i >= n {
            break;
        }
        let rec = &mut entry.records[i];
        if rec.stack_id == stack {
            rec.count += 1;
            rec.total_ns += delta;
            if delta > rec.max_ns {
                rec.max_ns = delta;
            }
            found = true;
            break;
        }
    }
    if !found {
        if n < TASK_RECORDS {
            // The mask looks redundant but is not to Linux 6.1's verifier: it follows this
            // branch even after the search above proved n >= TASK_RECORDS (an impossible
            // range it does not prune), and then needs the index bounded. A volatile read keeps
            // the mask from being optimised away.
            // SAFETY: reads a local.
            let n = unsafe { core::ptr::read_volatile(&n) } & (TASK_RECORDS - 1);
            entry.records[n] = LatencyRecord {
                stack_id: stack,
                count: 1,
                total_ns: delta,
                max_ns: delta,
            };
            entry.nr_records = n as u32 + 1;
        } else {
            count(Counter::TaskRecordsFull);
            if MODE.load() == MODE_LAZY && in_global {
                merged_add::<CAS>(stack, 1, delta, delta);
            }
        }
    }
    if MODE.load() == MODE_NORMAL && in_global {
        global_add::<CAS>(stack, 1, delta, delta);
    }
}

/// Counts `delta` in the per-CPU histogram of `stack`.
#[inline(always)]
fn histogram_add(stack: u64, delta: u64) {
    let hist = match HISTOGRAMS.get_ptr_mut(&stack) {
        Some(hist) => hist,
        None => {
            let zero: Histogram = [0; HIST_BUCKETS];
            let _ = HISTOGRAMS.insert(&stack, &zero, u64::from(BPF_NOEXIST));
            match HISTOGRAMS.get_ptr_mut(&stack) {
                Some(hist) => hist,
                None => {
                    count(Counter::HistTableFull);
                    return;
                }
            }
        }
    };
    let bucket = hist_bucket(delta);
    if bucket < HIST_BUCKETS {
        // SAFETY: this CPU's copy; bucket is in range.
        unsafe { (*hist)[bucket] += 1 };
    }
}

/// Lazy mode's merge: adds to this CPU's part of the global table (user space adds the CPUs'
/// parts to the shared table when it reads): no atomic operation, no cache line shared with
/// the other CPUs.
#[inline(always)]
fn merged_add<const CAS: bool>(stack: u64, n: u64, total_ns: u64, max_ns: u64) {
    match MERGED.get_ptr_mut(&stack) {
        Some(rec) => {
            // SAFETY: this CPU's value; programs on one CPU do not run concurrently.
            let rec = unsafe { &mut *rec };
            rec.count += n;
            rec.total_ns += total_ns;
            if max_ns > rec.max_ns {
                rec.max_ns = max_ns;
            }
        }
        None => {
            // A new key starts at zero on every CPU but this one.
            let first = GlobalRecord {
                count: n,
                total_ns,
                max_ns,
            };
            if MERGED
                .insert(&stack, &first, u64::from(BPF_NOEXIST))
                .is_err()
            {
                // Full (or another CPU made the key meanwhile): the shared table still takes it.
                global_add::<CAS>(stack, n, total_ns, max_ns);
            }
        }
    }
}

/// Adds to the global record of `stack`: the one structure every CPU shares.
#[inline(always)]
fn global_add<const CAS: bool>(stack: u64, n: u64, total_ns: u64, max_ns: u64) {
    let rec = match GLOBAL_LATENCY.get_ptr_mut(&stack) {
        Some(rec) => rec,
        None => {
            let first = GlobalRecord {
                count: n,
                total_ns,
                max_ns,
            };
            if GLOBAL_LATENCY
                .insert(&stack, &first, u64::from(BPF_NOEXIST))
                .is_ok()
            {
                return;
            }
            // Lost the race to another CPU, or the table is full.
            match GLOBAL_LATENCY.get_ptr_mut(&stack) {
                Some(rec) => rec,
                None => {
                    count(Counter::GlobalTableFull);
                    return;
                }
            }
        }
    };
    // SAFETY: map value pointers stay valid for the program's run; updates are atomic.
    unsafe {
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut (*rec).count, n);
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut (*rec).total_ns, total_ns);
        if !CAS {
            // No compare-and-swap: the maximum goes to this CPU's part instead, which user
            // space combines with the shared record (exact, at one more lookup).
            merged_max(stack, max_ns);
            return;
        }
        let max = &raw mut (*rec).max_ns;
        // Bounded compare-and-swap: the verifier needs a bounded loop, and a loser only retries
        // while its value is still larger.
        for _ in 0..4 {
            let cur = core::ptr::read_volatile(max);
            if max_ns <= cur {
                break;
            }
            let _ = atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(max, cur, max_ns);
        }
    }
}

/// Raises this CPU's part of the maximum of `stack` (for kernels without compare-and-swap).
#[inline(always)]
fn merged_max(stack: u64, max_ns: u64) {
    match MERGED.get_ptr_mut(&stack) {
        Some(rec) => {
            // SAFETY: this CPU's value; programs on one CPU do not run concurrently.
            let rec = unsafe { &mut *rec };
            if max_ns > rec.max_ns {
                rec.max_ns = max_ns;
            }
        }
        None => {
            let first = GlobalRecord {
                count: 0,
                total_ns: 0,
                max_ns,
            };
            if MERGED
                .insert(&stack, &first, u64::from(BPF_NOEXIST))
                .is_err()
            {
                count(Counter::GlobalTableFull);
            }
        }
    }
}

// ---- sched_process_exit: lazy merge ----

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(ctx: RawTracePointContext) -> i32 {
    try_sched_process_exit::<true>(&ctx).unwrap_or(1)
}

/// `sched_process_exit` for kernels without BPF compare-and-swap (before 5.12).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit_nocas(ctx: RawTracePointContext) -> i32 {
    try_sched_process_exit::<false>(&ctx).unwrap_or(1)
}

/// Runs in the exiting task: `current` is the task whose records are merged.
fn try_sched_process_exit<const CAS: bool>(_ctx: &RawTracePointContext) -> Result<i32, i32> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(entry) = TASKS.get_ptr(&tid) else {
        return Ok(0);
    };
    // SAFETY: the exiting task is current; only its own events write its entry.
    let entry = unsafe { &*entry };
    if entry.sleep_kind != SLEEP_NONE {
        // A running task is not asleep: that sleep's wakeup never reached latprof.
        count(Counter::SleepLost);
    }
    if MODE.load() == MODE_LAZY
        && (entry.flags & TASK_FLAG_KTHREAD == 0 || SKIP_KTHREADS.load() == 0)
    {
        count(Counter::MergesBegun);
        let n = entry.nr_records as usize;
        for i in 0..TASK_RECORDS {
            if i >= n {
                break;
            }
            let rec = &entry.records[i];
            merged_add::<CAS>(rec.stack_id, rec.count, rec.total_ns, rec.max_ns);
        }
        let _ = TASKS.remove(&tid);
        count(Counter::ExitMerges);
        count(Counter::MergesDone);
    } else {
        if DEBUG_CHECKS.load() == 1 && MODE.load() == MODE_LAZY && entry.nr_records > 0 {
            // Records that reach no global table (a kernel thread's, kept out).
            anomaly(
                _ctx,
                Counter::DebugExitWithRecords,
                tid,
                u64::from(entry.nr_records),
            );
        }
        let _ = TASKS.remove(&tid);
    }
    Ok(0)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

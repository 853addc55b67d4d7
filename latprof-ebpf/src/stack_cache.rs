//! The stack cache: a sleeping task's backtrace at its wakeup without walking its kernel stack.
//!
//! # Algorithm
//!
//! A walk (`bpf_get_task_stack`) is most of what a counted wakeup costs. A task that sleeps
//! again where it slept before has the same return addresses at the same places on its stack,
//! and the unwinder would read exactly those words: where they all hold what they held, the
//! walk would give the same backtrace. Each task (`TaskState::stack_cache`) and each CPU
//! (`CPU_CACHE`, for a new process or thread that sleeps where others did: a fork storm's
//! children, a pool's workers) keeps `CACHE_ENTRIES` learnt backtraces.
//!
//! * **Lookup** (`cached_stack`): copy the task's stack from its saved stack pointer
//!   (`thread.sp`, at `THREAD_SP_OFF`) towards its user registers into `STACK_COPY`, as far as
//!   the deepest entry that fits needs (an entry deeper than this stack, from another task,
//!   cannot match), and the word right below the registers into the copy's `OUTER_WORD`. An
//!   entry matches when the copy holds its innermost return address at its first position and
//!   the hash of the words at all its `CACHE_FRAMES` positions is the hash it learnt. The
//!   task's entries are tried first, then the CPU's. A hit returns the entry's stack id;
//!   anything else walks. Where the kernel has the `bpf_rdonly_cast` kfunc (Linux 6.2;
//!   `kfuncs`), nothing is copied: each word an entry checks is a plain load where it lies
//!   (`InPlace`), not one helper call for the whole region (`Copied`).
//! * **Positions**: the inner frames sit at fixed distances from the stack pointer; the
//!   outermost one (the entry code's call into C, right below the user registers) does not,
//!   since a syscall moves the rest of the stack down by a random offset
//!   (`randomize_kstack_offset`), so it is read from below the registers (`OUTER_WORD`).
//!   Positions past an entry's frames point at `ZERO_WORD`, which the lookup zeroes, so every
//!   entry is checked with the same steps and no branch per frame.
//! * **Learning** (`remember`): after a walk, both rings of recently walked backtraces note it
//!   (`note_walked`); only one that either had seen already is learnt, so a task that sleeps
//!   once, or somewhere new each time, pays no scan. `learn_stack` scans the stack innermost
//!   first for the word holding each walked return address (`scan_word` under `bpf_loop`, or
//!   `scan_bounded`), hashes the frames, and `keep` stores the entry in both caches: in the
//!   slot that holds the same backtrace (its places changed), else the next round the ring.
//! * `--debug-checks` walks every hit as well and counts a difference
//!   (`debug_stack_cache_wrong`).
//!
//! Two builds, by the `HELPERS` parameter: `true` for `sched_wakeup_btf` (`bpf_loop`, Linux
//! 5.17, and `bpf_task_pt_regs`, 5.15); `false` for `sched_wakeup_btf_bounded{,_nocas}`
//! (Debian 11's 5.10): the scan is a bounded loop and the user registers are found at the top
//! of the task's stack (`TASK_STACK_OFF` plus `PT_REGS_IN_STACK`, x86-64's `task_pt_regs()`).
//!
//! # Verifier rules
//!
//! What the verifiers of the kernels latprof is tested on (6.18, 6.12, Debian 12's 6.1, Debian
//! 11's 5.10) need from this code and the rest of the crate; the code cites them by number.
//!
//! 1. **Volatile reads keep masks.** Every index into a map value must be provably in range.
//!    Where the compiler has already proved it, it drops a bounding mask as redundant; the
//!    verifier, which knows less (a count that came through map memory, rule 3) or follows a
//!    branch it could prune (6.1 follows an impossible one in `account`), then rejects the
//!    access. `core::ptr::read_volatile(&x) & (N - 1)` keeps the mask.
//! 2. **Masks need power-of-two sizes.** `x & (N - 1)` bounds `x` below `N` only when `N` is a
//!    power of two: every masked size has a `const _: () = assert!(N.is_power_of_two());`
//!    beside its use.
//! 3. **Counts go through map memory.** The verifier tracks the exact values in registers and
//!    on the stack and verifies what follows once per value that differs; it tracks nothing in
//!    map memory. The walk's frame count (`WALKED_FRAMES`) and the scan's progress
//!    (`SCAN_POS`) sit in per-CPU maps, so the code after them is verified once, not once per
//!    count.
//! 4. **A function that is not inlined is a pruning point.** Its ways through (each cache
//!    entry, hit or miss, learnt or not; each record slot) end in one return where the
//!    verifier finds them equal and stops; inlined, each would go on through the caller's code
//!    on its own, multiplying what the verifier walks (1M instructions at most per program).
//! 5. **Without `bpf_loop`, loops are walked round by round** (bounded loops, Linux 5.3): on
//!    5.10 the scan is a loop whose rounds are small (no helper call, no map lookup, the count
//!    found in map memory, rule 3). Under `bpf_loop` the callback is verified once for any
//!    round.
//! 6. **512 bytes of stack for a whole call chain**, and Linux 6.1 counts the `bpf_loop`
//!    callback's frame on top of its caller's: the frame that calls `bpf_loop` must stay
//!    small, so `learn_stack`'s hash loop is not unrolled (unrolled, it spilled the 32 frames
//!    and the chain needed 544 bytes).
//! 7. **No `BPF_CMPXCHG` at all on 5.10** (compare-and-swap came in 5.12): its verifier rejects
//!    a program that holds one even where it can never run, and an older kernel can refuse a
//!    helper or instruction it does not know the same way. So the stack cache uses no atomic
//!    operation (its state is per task or per CPU), and each program is built from const
//!    parameters (`CAS`, `HELPERS`, `BT`) to hold only what its kernel accepts: the `_nocas`
//!    programs no compare-and-swap, the bounded ones no `bpf_loop` or `bpf_task_pt_regs`.

use aya_ebpf::{
    EbpfContext,
    bindings::task_struct,
    cty::c_void,
    helpers::{bpf_loop, bpf_probe_read_kernel, bpf_task_pt_regs, generated},
};
use latprof_common::{
    CACHE_ENTRIES, CACHE_FRAMES, CachedStack, Counter, NO_STACK, STACK_CHUNK, STACK_HASH_SEED,
    StackCache, TaskState, stack_hash_step,
};

use crate::{
    debug::anomaly,
    kfuncs,
    maps::{
        CPU_CACHE, LEARNT, REGION_WORDS, REGS_IN_STACK, SCAN_POS, STACK_BUF, STACK_COPY,
        WALKED_FRAMES, count,
    },
    settings::{DEBUG_CHECKS, PT_REGS_IN_STACK, TASK_STACK_OFF, THREAD_SP_OFF, read_btf_field},
    stacks::task_stack,
};

// Masked sizes (rule 2): a slot, a frame, a word of the copy, a chunk of it, a stack address
// rounded down to a chunk.
const _: () = assert!(CACHE_ENTRIES.is_power_of_two());
const _: () = assert!(CACHE_FRAMES.is_power_of_two());
const _: () = assert!(REGION_WORDS.is_power_of_two());
const _: () = assert!((REGION_WORDS / CHUNK_WORDS).is_power_of_two());
const _: () = assert!(STACK_CHUNK.is_power_of_two());
/// Words of a chunk: the scan reads the stack a chunk at a time as it reaches it.
const CHUNK_WORDS: usize = STACK_CHUNK / 8;
/// The stack copy's last word: where the hit check puts the word below the user registers.
const OUTER_WORD: usize = REGION_WORDS - 1;
/// A word the hit check zeroes: where the positions past an entry's frames point.
const ZERO_WORD: usize = REGION_WORDS - 2;

/// The backtrace of the sleeping `task`, from its stack cache when the cache can vouch for it,
/// else walked (and learnt, when the task or this CPU walked this backtrace not long ago).
// Not inlined: its ways through end in one return, not each through the accounting (rule 4).
#[inline(never)]
pub(crate) fn sleeping_stack<C: EbpfContext, const HELPERS: bool>(
    ctx: &C,
    tid: u32,
    task: *mut task_struct,
    entry: &mut TaskState,
) -> u64 {
    let off = THREAD_SP_OFF.load();
    if off == 0 {
        return task_stack(task);
    }
    // The BTF tracepoint's task: a plain load.
    let sp = read_btf_field::<u64>(task.cast_const().cast(), off);
    let regs = if HELPERS {
        user_regs(task)
    } else {
        // x86-64's task_pt_regs(): at the top of the task's stack.
        read_btf_field::<u64>(task.cast_const().cast(), TASK_STACK_OFF.load())
            + u64::from(PT_REGS_IN_STACK.load())
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

/// The sleeping `task`'s user registers' address: its stack's lowest address plus where
/// `bpf_task_pt_regs` put them the first time on this CPU (`REGS_IN_STACK`; the same for every
/// task of a kernel, whatever padding its configuration leaves above them), so a wakeup reads
/// one field instead of calling two helpers.
#[inline(always)]
fn user_regs(task: *mut task_struct) -> u64 {
    // 0 where the kernel's BTF gave no offset: the helper every time.
    let stack = match TASK_STACK_OFF.load() {
        0 => 0,
        off => read_btf_field::<u64>(task.cast_const().cast(), off),
    };
    let Some(place) = REGS_IN_STACK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; programs on one CPU do not run concurrently.
    let place = unsafe { &mut *place };
    if *place != 0 && stack != 0 {
        return stack + *place;
    }
    // SAFETY: task is the BTF tracepoint's trusted task pointer.
    let regs = unsafe { bpf_task_pt_regs(task) } as u64;
    // The kernel hands the registers' address as a pointer the verifier allows no
    // arithmetic on; read back through a probe read, it is a number.
    // SAFETY: reads a local.
    let regs = unsafe { bpf_probe_read_kernel(&raw const regs) }.unwrap_or(0);
    if stack != 0 && regs > stack && regs - stack < MAX_REGS_IN_STACK {
        *place = regs - stack;
    }
    regs
}

/// Above this many bytes from its lowest address the registers are not in the task's stack
/// (x86-64's stacks are 16 KiB, 32 with KASAN): `user_regs` keeps no place then.
const MAX_REGS_IN_STACK: u64 = 64 * 1024;

/// After a walk: learns the backtrace when this task, or any task on this CPU, slept with it
/// not long ago (a task that sleeps once somewhere no other does, or somewhere new each time,
/// pays no scan), for the task and for this CPU: a new process or thread that sleeps where
/// others have (a fork storm's children, a pool's workers) then finds it in the CPU's cache.
// Not inlined: seen or not, learnt or not, its ways through end in one return (rule 4).
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
    // `|`, not `||`: both rings must note this walk, also when the task's had seen it already.
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
    // No early exit: the same steps for any ring.
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
// Not inlined: its slot search ends in one return (rule 4), and the two caches share its code.
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
// Not inlined: hit in either cache or miss, its ways through end in one return (rule 4).
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
    if kfuncs::rdonly_cast_on() {
        // Read where they lie, each word an entry checks by a plain load: no copy.
        let stack = InPlace {
            sp,
            outer: kfuncs::kernel_read(regs.wrapping_sub(8)),
        };
        return matching_entry(&stack, &entry.stack_cache, words)
            .or_else(|| matching_entry(&stack, cpu, words));
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
    let stack = Copied(copy);
    matching_entry(&stack, &entry.stack_cache, words).or_else(|| matching_entry(&stack, cpu, words))
}

/// The sleeper's stack words as the hit check reads them, by their place in the copy
/// (`OUTER_WORD` the word below the user registers, `ZERO_WORD` zero).
trait StackWords {
    fn word(&self, at: usize) -> u64;
}

/// The stack copied into `STACK_COPY`.
struct Copied(*const [u64; REGION_WORDS]);

impl StackWords for Copied {
    #[inline(always)]
    fn word(&self, at: usize) -> u64 {
        // SAFETY: the masked place is in range of the copy.
        unsafe { (*self.0)[at & (REGION_WORDS - 1)] }
    }
}

/// The stack itself, read word by word with plain loads (`kfuncs::kernel_read`), where the
/// kernel has `bpf_rdonly_cast`: a checked entry reads only its own words, and no helper call.
struct InPlace {
    /// The saved stack pointer: place `at` is the word at `sp + 8 * at`.
    sp: u64,
    /// The word right below the user registers.
    outer: u64,
}

impl StackWords for InPlace {
    #[inline(always)]
    fn word(&self, at: usize) -> u64 {
        match at {
            OUTER_WORD => self.outer,
            ZERO_WORD => 0,
            _ => kfuncs::kernel_read(self.sp + 8 * at as u64),
        }
    }
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
fn matching_entry(copy: &impl StackWords, cache: &StackCache, words: usize) -> Option<u64> {
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
fn cache_entry_matches(copy: &impl StackWords, cached: &CachedStack) -> bool {
    // The innermost return address first: most entries that do not match stop here.
    let first = cached.pos[0] as usize & (REGION_WORDS - 1);
    if copy.word(first) != cached.first {
        return false;
    }
    let frames = cached.frames as usize;
    let (mut a, mut b) = (STACK_HASH_SEED, STACK_HASH_SEED ^ CHECK_LANE);
    for i in 0..CACHE_FRAMES / 2 {
        if 2 * i >= frames {
            break;
        }
        let at = cached.pos[2 * i] as usize & (REGION_WORDS - 1);
        let next = cached.pos[2 * i + 1] as usize & (REGION_WORDS - 1);
        a = stack_hash_step(a, copy.word(at));
        b = stack_hash_step(b, copy.word(next));
    }
    check_of(a, b) == cached.check
}

/// The seed of the check's second lane.
const CHECK_LANE: u64 = 0x5bd1_e995;

/// The check of a backtrace from its two lanes. Each lane hashes every other frame, up to the
/// backtrace's frames rounded up to even (the word past an odd count is zero on both sides:
/// the walk leaves zeroes past its frames, the positions past them point at `ZERO_WORD`):
/// two independent multiply chains take half as long as one, and frames past the backtrace's
/// take nothing.
#[inline(always)]
fn check_of(a: u64, b: u64) -> u64 {
    a ^ b.rotate_left(32)
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
    // SAFETY: this CPU's scan progress. Positions past the frames point at `ZERO_WORD`.
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
    // The mask kept (rule 1): `frames` came through map memory, the verifier knows no bound.
    // SAFETY: reads a local.
    let last = unsafe { core::ptr::read_volatile(&(frames - 1)) } & (CACHE_FRAMES - 1);
    // Positions grow outwards; an outermost frame right below the user registers is read from
    // there (`OUTER_WORD`, see Positions above).
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
    // The walk left zeroes past its frames: the check hashes them as the hit check does
    // (`check_of`).
    let ips = STACK_BUF.get_ptr(0)?;
    let (mut a, mut b) = (STACK_HASH_SEED, STACK_HASH_SEED ^ CHECK_LANE);
    // Not unrolled (its bound read through a volatile), to keep this frame small (rule 6); the
    // verifier walks its 16 small rounds.
    // SAFETY: reads a local.
    let rounds = unsafe { core::ptr::read_volatile(&(CACHE_FRAMES / 2)) };
    for i in 0..rounds {
        if i >= CACHE_FRAMES / 2 || 2 * i >= frames {
            break;
        }
        // SAFETY: this CPU's walked frames; 2 * i + 1 is in range.
        unsafe {
            a = stack_hash_step(a, (*ips)[2 * i]);
            b = stack_hash_step(b, (*ips)[2 * i + 1]);
        }
    }
    let check = check_of(a, b);
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

/// `learn_stack`'s scan without `bpf_loop`: the same steps as `scan_word` in a bounded loop,
/// written for a verifier that walks every round (rule 5).
// Not inlined: its rounds end in one return, verified apart from the learning after it (rule 4).
#[inline(never)]
#[expect(
    clippy::manual_is_multiple_of,
    reason = "`is_multiple_of` orders this loop's blocks differently; the 5.10 verifier walks \
              every round, so the code stays as it was verified there"
)]
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
            // The mask kept (rule 1): the compiler knows word < 512, the verifier does not.
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
        // SAFETY: this CPU's scan progress; a volatile read, so the count stays in map memory
        // (rule 3).
        let k = unsafe { core::ptr::read_volatile(&raw const (*pos).found) } as usize;
        if k >= frames {
            break;
        }
        let k = k & (CACHE_FRAMES - 1);
        // SAFETY: reads a local (the mask kept, rule 1).
        let at = unsafe { core::ptr::read_volatile(&raw const word) } & (REGION_WORDS - 1);
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
// Not inlined: `bpf_loop` calls it by address, as a BPF function of its own (rule 5).
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
    if i == 0 || word.is_multiple_of(CHUNK_WORDS) {
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

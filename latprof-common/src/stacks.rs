//! Backtraces: kernel stack ids and the reserved ones, the hashes both sides compute, user
//! backtraces and the parts of a record id, the per-task stack cache.

use core::mem::size_of;

use crate::SLEEP_UNINTERRUPTIBLE;

/// Frames kept per raw kernel backtrace (the kernel's PERF_MAX_STACK_DEPTH).
pub const STACK_FRAMES: usize = 127;

/// A raw kernel backtrace: instruction pointers, innermost first, zero-filled after the last.
pub type RawStack = [u64; STACK_FRAMES];

/// Stack id used when latprof could not store a backtrace (stack table full).
pub const NO_STACK: u64 = u64::MAX;

/// Pseudo stack id of run-queue latency ("waiting for CPU": from wakeup to running), kept in
/// the same records as the sleep causes.
pub const RUNQ_STACK: u64 = u64::MAX - 1;

/// `TaskState::sleep_stack` of a sleep whose backtrace is to be taken at wakeup, if it counts.
pub const DEFERRED_STACK: u64 = u64::MAX - 2;

/// Pseudo stack id of recovered sleeps whose backtrace was to be taken at their wakeup, which
/// the kernel hid from tracing: found still open later, their length comes from the task's
/// run time and run-queue wait since (`Counter::SleepsRecovered`), their backtrace is gone.
pub const RECOVERED_STACK: u64 = u64::MAX - 3;

/// The lowest reserved stack id: the hashes of real backtraces stay below it.
pub const RESERVED_STACKS: u64 = RECOVERED_STACK;

/// XORed into a backtrace's id for the records of its uninterruptible (D) sleeps, so that S
/// and D sleeps at one backtrace are counted apart (`latprof serve`'s `state` label). Its
/// frames stay stored under the plain id; views that show backtraces merge the two, as
/// /proc/latency_stats does.
pub const D_STATE_SALT: u64 = 0x5bd1_e995_7f4a_7c15;

/// The record id of a sleep of `kind` at backtrace `stack`: the plain id for an
/// interruptible sleep (and for the reserved pseudo backtraces), salted for an
/// uninterruptible one.
#[inline(always)]
#[must_use]
pub fn stack_for_state(stack: u64, kind: u32) -> u64 {
    if kind == SLEEP_UNINTERRUPTIBLE && stack < RESERVED_STACKS {
        let salted = stack ^ D_STATE_SALT;
        if salted < RESERVED_STACKS {
            return salted;
        }
    }
    stack
}

/// Frames kept per user-space backtrace (`--user-stacks`).
pub const USER_FRAMES: usize = 127;

/// Words of a user stack kept from its stack pointer up when the backtrace is first stored:
/// where a frameless leaf function (glibc's `read`) keeps its caller's return address, which
/// the frame-pointer chain skips; user space finds it with the binary's `.eh_frame`.
pub const USER_WINDOW: usize = 64;

/// `TaskState::sleep_ustack` and `CauseParts::user` of a sleep without a user backtrace.
pub const NO_USER: u64 = 0;

/// Seeds the hash of a combined (kernel + user) cause apart from plain backtraces.
const USER_SALT: u64 = 0x2545_f491_4f6c_dd1d;

/// A user-space backtrace as first stored: the process, its frames (return addresses,
/// innermost first, the user instruction pointer at the syscall first) and the stack words at
/// the user stack pointer then.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserStack {
    pub tgid: u32,
    /// Frames in `frames` (the rest is stale).
    pub nr: u32,
    /// The stack pointer of frame `stepped - 1` (the user stack pointer at the syscall where
    /// `stepped` is 1; 0: not read), the address of `window[0]`.
    pub sp: u64,
    /// The address space's layout (`layout_key`) the frames are addresses in.
    pub layout: u64,
    /// The frames the unwind tables stepped through, the first included (1: none): user space
    /// unwinds frameless callers from the last of them, over the window.
    pub stepped: u32,
    pub reserved: u32,
    pub frames: [u64; USER_FRAMES],
    pub window: [u64; USER_WINDOW],
}
const _: () = assert!(size_of::<UserStack>() == 32 + 8 * (USER_FRAMES + USER_WINDOW));

/// The kernel and user backtraces of a combined cause id (`combine`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CauseParts {
    pub kernel: u64,
    pub user: u64,
}
const _: () = assert!(size_of::<CauseParts>() == 16);

/// Sent when a user backtrace is first stored, so that user space reads the process's memory
/// map while it still lives (the process may exit before the next snapshot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserSeen {
    pub tgid: u32,
    pub tid: u32,
    pub user_stack: u64,
    /// The process's layout then (`layout_key`): user space checks that the memory map it
    /// reads is still that one (not the program the process exec'd since).
    pub layout: u64,
}
const _: () = assert!(size_of::<UserSeen>() == 24);

/// What tells one program image's address space from another: where its code starts and ends
/// and where its stack began (`mm_struct`'s `start_code`, `end_code`, `start_stack`, shown in
/// `/proc/PID/stat` too). Set at exec (randomized there), kept by fork: the forked children
/// of a process share its backtraces' ids, an exec'd program gets new ones. Never 0.
#[inline(always)]
#[must_use]
pub fn layout_key(start_code: u64, end_code: u64, start_stack: u64) -> u64 {
    let h = stack_hash_step(STACK_HASH_SEED ^ USER_SALT, start_code);
    let h = stack_hash_step(stack_hash_step(h, end_code), start_stack);
    stack_hash_finish(h) | 1
}

/// The id of a user backtrace in the address space of layout `layout` (`layout_key`): the same
/// addresses are other code in another program. Never `NO_USER`.
#[inline(always)]
#[must_use]
pub fn user_stack_hash(layout: u64, frames: &[u64; USER_FRAMES], len: usize) -> u64 {
    let mut h = stack_hash_step(STACK_HASH_SEED ^ USER_SALT, layout);
    for (i, ip) in frames.iter().enumerate() {
        if i >= len {
            break;
        }
        h = stack_hash_step(h, *ip);
    }
    let id = stack_hash_finish(h);
    if id == NO_USER { 1 } else { id }
}

/// The record id of a sleep at kernel backtrace `kernel` whose task was at user backtrace
/// `user`: `kernel` itself without a user part, and for the reserved pseudo backtraces (their
/// user part is not kept); otherwise a hash of the two (user space finds the parts in
/// `CAUSE_PARTS`). The D-state salt (`stack_for_state`) applies to the result.
#[inline(always)]
#[must_use]
pub fn combine(kernel: u64, user: u64) -> u64 {
    if user == NO_USER || kernel >= RESERVED_STACKS {
        return kernel;
    }
    stack_hash_finish(stack_hash_step(
        stack_hash_step(STACK_HASH_SEED ^ USER_SALT, kernel),
        user,
    ))
}

/// The stack id of a backtrace: a 64-bit hash of its frames. The kernel's own stack-id map keeps
/// one stack per hash bucket and refuses a second one that falls in the same bucket, which would
/// lose backtraces at random; a 64-bit key makes a collision practically impossible.
#[inline(always)]
#[must_use]
pub fn stack_hash(frames: &RawStack, len: usize) -> u64 {
    let mut h = STACK_HASH_SEED;
    for (i, ip) in frames.iter().enumerate() {
        if i >= len {
            break;
        }
        h = stack_hash_step(h, *ip);
    }
    stack_hash_finish(h)
}

/// [`stack_hash`] one frame at a time, for frames that are not in one array (the stack cache
/// reads them from their places on the kernel stack): seed, a step per frame, finish.
pub const STACK_HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

#[inline(always)]
#[must_use]
pub fn stack_hash_step(h: u64, ip: u64) -> u64 {
    (h.rotate_left(5) ^ ip).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[inline(always)]
#[must_use]
pub fn stack_hash_finish(mut h: u64) -> u64 {
    h ^= h >> 33;
    // Keep clear of the reserved ids.
    if h >= RESERVED_STACKS { h - 4 } else { h }
}

/// Frames the stack cache can check (`CachedStack::pos`); deeper backtraces are walked every
/// time.
pub const CACHE_FRAMES: usize = 32;

/// Backtraces cached per task: a task that cycles through a few places (fsync's three waits)
/// finds each of them.
pub const CACHE_ENTRIES: usize = 4;

/// Bytes of kernel stack, from the sleeping task's saved stack pointer (rounded down to
/// `STACK_CHUNK`), that the stack cache reads: frames beyond them are walked every time.
pub const STACK_REGION: usize = 4096;

/// The stack cache reads the kernel stack in aligned chunks of this size, so that no read
/// crosses the end of the stack (which is page-aligned).
pub const STACK_CHUNK: usize = 512;

/// A stack cache: a task has one, and each CPU one shared by the tasks woken there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackCache {
    pub entries: [CachedStack; CACHE_ENTRIES],
    /// Ids of the backtraces walked lately (a ring): one walked again is learnt into
    /// `entries`.
    pub recent: [u64; CACHE_ENTRIES],
    /// Next `recent` and `entries` slots to replace.
    pub recent_next: u32,
    pub next: u32,
}
const _: () =
    assert!(size_of::<StackCache>() == (size_of::<CachedStack>() + 8) * CACHE_ENTRIES + 8);

/// One backtrace in a stack cache: its id and where each of its return addresses sat
/// on the task's kernel stack, in 8-byte words from the saved stack pointer. A later sleep
/// whose stack holds the same return addresses in the same places has the same backtrace: the
/// unwinder would read exactly those words.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CachedStack {
    pub stack: u64,
    /// The hash of the words at all `CACHE_FRAMES` positions when learnt (the return
    /// addresses, then zeroes): the hit check compares this.
    pub check: u64,
    /// The innermost return address, compared before the hash.
    pub first: u64,
    /// Words from the stack pointer to read to see every inner position (0: empty slot).
    pub words: u32,
    /// The backtrace's frames, and 1 if its outermost one sits right below the task's user
    /// registers (the entry code's call, above a syscall's random stack offset) and is read
    /// from there: the check needs neither (`pos` says it all); they are there for whoever
    /// inspects the map.
    pub frames: u16,
    pub outer: u16,
    pub pos: [u16; CACHE_FRAMES],
}
const _: () = assert!(size_of::<CachedStack>() == 32 + 2 * CACHE_FRAMES);

//! Every type that crosses latprof's kernel/user boundary, and nothing else.
//!
//! Layouts are `#[repr(C)]` without implicit padding and checked by size assertions, so the eBPF
//! programs and the user-space reader can never disagree on a field offset.
#![no_std]
// The helpers here run inside the eBPF programs too, where a call that is not inlined becomes a
// BPF-to-BPF call whose frame counts against the verifier's 512-byte stack limit.
#![allow(clippy::inline_always)]

use core::mem::size_of;

/// Causes kept per task, as latencytop's `LT_SAVECOUNT`. A task with more distinct causes sends
/// the overflow straight to the global table (counted in [`Counter::TaskRecordsFull`]).
pub const TASK_RECORDS: usize = 32;

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

/// `TaskState::sleep_flags` bit: the sleep began without a memory map (an exiting task after
/// exit_mm), so it stays out of the global table if recovered.
pub const SLEEP_NO_MM: u32 = 1;

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
    /// The user stack pointer at the syscall (0: not read), the address of `window[0]`.
    pub sp: u64,
    /// The address space's layout (`layout_key`) the frames are addresses in.
    pub layout: u64,
    pub frames: [u64; USER_FRAMES],
    pub window: [u64; USER_WINDOW],
}
const _: () = assert!(size_of::<UserStack>() == 24 + 8 * (USER_FRAMES + USER_WINDOW));

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

/// Log2 buckets of a cause's latency histogram: bucket `i` holds latencies of `2^i` to
/// `2^(i+1)` microseconds (bucket 0 also holds those under 1 µs).
pub const HIST_BUCKETS: usize = 32;

/// A per-CPU latency histogram of one cause.
pub type Histogram = [u32; HIST_BUCKETS];

/// The histogram bucket of a latency.
#[inline(always)]
#[must_use]
pub fn hist_bucket(ns: u64) -> usize {
    let mut v = ns / 1000;
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    if r >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        r
    }
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

/// `Global` value of `MODE`: per-task state only, merged into the global table at exit.
pub const MODE_LAZY: u32 = 0;
/// `Global` value of `MODE`: every accounted sleep also updates the global table.
pub const MODE_NORMAL: u32 = 1;

/// `TaskState::sleep_kind`: not sleeping (or the sleep is not being tracked).
pub const SLEEP_NONE: u32 = 0;
/// `TaskState::sleep_kind`: interruptible sleep (S).
pub const SLEEP_INTERRUPTIBLE: u32 = 1;
/// `TaskState::sleep_kind`: uninterruptible sleep (D, or the idle state I).
pub const SLEEP_UNINTERRUPTIBLE: u32 = 2;

/// `TaskState::flags`: the task had no mm when first seen (a kernel thread). latencytop keeps
/// those out of the global table; so does latprof.
pub const TASK_FLAG_KTHREAD: u32 = 1;
/// `TaskState::flags`: the task was already exiting when first seen. Its entry may be made
/// after `sched_process_exit` removed the last one (a sleep in `exit_files`' task work), so
/// `sched_process_free` removes it when the task is freed.
pub const TASK_FLAG_EXITING: u32 = 2;
/// `TaskState::flags`: the entry was made at this sleep's start, the task's first that latprof
/// traced. Its waking may have come before the entry existed (the waker ran `sched_waking`
/// while the task was still switching out), so its waker is unknown for a reason of its own.
/// Cleared at the wakeup (`--wakers`).
pub const TASK_FLAG_FIRST_SLEEP: u32 = 4;
/// `TaskState::flags`: set at the wakeup that ended the first sleep with no waking seen, for
/// the waker accounting of that sleep (`--wakers`); cleared at the next wakeup.
pub const TASK_FLAG_WAKING_RACED: u32 = 8;
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

/// What happens to a finished sleep. One definition for the eBPF programs and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SleepVerdict {
    Count,
    /// Shorter than the minimum (latencytop drops zero-microsecond sleeps).
    TooShort,
    /// An interruptible sleep longer than the cutoff (usually a wait the program asked for).
    OverCutoff,
}

/// latencytop's filter: drop sleeps under `min_ns`, and interruptible sleeps over `cutoff_ns`.
#[inline(always)]
#[must_use]
pub fn sleep_verdict(kind: u32, delta_ns: u64, min_ns: u64, cutoff_ns: u64) -> SleepVerdict {
    if delta_ns < min_ns {
        SleepVerdict::TooShort
    } else if kind == SLEEP_INTERRUPTIBLE && delta_ns > cutoff_ns {
        SleepVerdict::OverCutoff
    } else {
        SleepVerdict::Count
    }
}

/// The kind of sleep a switch-out starts, from the raw task state the scheduler saw, as
/// latencytop decides at dequeue: TASK_INTERRUPTIBLE is a sleep (S), TASK_UNINTERRUPTIBLE a block
/// (D; TASK_IDLE and TASK_KILLABLE include it). A preempted task does not sleep, whatever its
/// state.
///
/// TASK_WAKING: where the state is read from the task at the switch (kernels whose
/// sched_switch has no prev_state), a wakeup on another CPU may already have replaced the sleep
/// state once the scheduler dequeued the task (Linux 5.8 to 5.17; 5.18 added prev_state for
/// this). The task did go to sleep, as latencytop counts it; which kind is lost, and the sleep
/// ends at once, far under the cutoff: counted as a block, which the cutoff never drops.
#[inline(always)]
#[must_use]
pub fn sleep_kind(preempt: bool, state: u64) -> u32 {
    const TASK_INTERRUPTIBLE: u64 = 0x1;
    const TASK_UNINTERRUPTIBLE: u64 = 0x2;
    const TASK_WAKING: u64 = 0x200;
    if preempt {
        SLEEP_NONE
    } else if state & TASK_INTERRUPTIBLE != 0 {
        SLEEP_INTERRUPTIBLE
    } else if state & (TASK_UNINTERRUPTIBLE | TASK_WAKING) != 0 {
        SLEEP_UNINTERRUPTIBLE
    } else {
        SLEEP_NONE
    }
}

/// One cause: a backtrace with count, total and maximum, in one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyRecord {
    pub stack_id: u64,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The sleeper's cgroup v2 id when its sleeps began (0: cgroups not tracked). A task that
    /// moves to another cgroup starts new records there.
    pub cgroup: u64,
}
const _: () = assert!(size_of::<LatencyRecord>() == 40);

/// Key of the per-cgroup tables (`CGROUP_LATENCY`, `HISTOGRAMS`): a cause in a cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CgroupCause {
    /// cgroup v2 id (the inode number of its directory); 0: cgroups not tracked.
    pub cgroup: u64,
    pub stack_id: u64,
}
const _: () = assert!(size_of::<CgroupCause>() == 16);

/// Value of the global table, keyed by stack id (u64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalRecord {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}
const _: () = assert!(size_of::<GlobalRecord>() == 24);

impl GlobalRecord {
    /// Adds `count` sleeps of `total_ns` in all, the longest `max_ns`.
    pub fn add(&mut self, count: u64, total_ns: u64, max_ns: u64) {
        self.count += count;
        self.total_ns += total_ns;
        self.max_ns = self.max_ns.max(max_ns);
    }

    /// Adds another record's sleeps.
    pub fn merge(&mut self, other: &Self) {
        self.add(other.count, other.total_ns, other.max_ns);
    }

    /// Adds a task record's sleeps.
    pub fn merge_task(&mut self, rec: &LatencyRecord) {
        self.add(rec.count, rec.total_ns, rec.max_ns);
    }
}

/// Everything latprof keeps for one task (keyed by tid): the sleep in progress and its causes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskState {
    pub sleep_start_ns: u64,
    /// When the task was woken (0: not waiting for a CPU).
    pub runq_start_ns: u64,
    pub sleep_stack: u64,
    /// At the sleep's start, the task's `se.sum_exec_runtime` and `sched_info.run_delay`
    /// (where the kernel has them): a sleep whose wakeup was hidden is recovered from them.
    pub sleep_exec_ns: u64,
    pub sleep_run_delay_ns: u64,
    /// The task's cgroup v2 id when its last sleep began: its sleep and the run-queue wait
    /// after it are that cgroup's (0: cgroups not tracked).
    pub cgroup: u64,
    /// The task's user backtrace when its open sleep began (`--user-stacks`; `NO_USER`: none).
    pub sleep_ustack: u64,
    /// `--user-stacks`' memo of this task, each exact: the memory map whose layout
    /// (`layout_key`) was read last and the task's exec count then (`self_exec_id`: an exec's
    /// new map may take the freed map's address, a shell's own after two execs), that layout,
    /// and the last kernel + user cause known to be in `CAUSE_PARTS` (entries are never
    /// removed).
    pub user_mm: u64,
    pub user_exec: u64,
    pub user_layout: u64,
    pub user_cause: u64,
    pub sleep_kind: u32,
    pub tgid: u32,
    pub flags: u32,
    pub nr_records: u32,
    /// Bit i: `records[i]` is the task's own and stays out of the global table (accounted
    /// while the task had no memory map, as latencytop's `account_global_scheduler_latency`
    /// skips such tasks; or a kernel thread's).
    pub task_only: u32,
    /// `SLEEP_NO_MM`: when the open sleep began (and kept what recovering it needs), the task
    /// had no memory map.
    pub sleep_flags: u32,
    pub comm: [u8; 16],
    /// Who is waking the task, from `sched_waking` (in the waker's context), taken at the
    /// matching `sched_wakeup` and cleared there: a `WAKER_*` kind (`WAKER_UNSEEN`: none
    /// pending), the waking task's ids and name (`WAKER_TASK` only) and, with
    /// `--waker-stacks`, the waker's backtrace (0: none).
    pub waker_stack: u64,
    pub waker_kind: u32,
    pub waker_tgid: u32,
    pub waker_tid: u32,
    /// The low 32 bits of the `task_struct` address of the task that made the entry: tells it
    /// from a task that took its tid over (a thread that calls exec takes its leader's) before
    /// `sched_process_free` retires an exiting task's entry.
    pub task_low: u32,
    pub waker_comm: [u8; 16],
    /// The backtraces of the task's recent sleeps and where their return addresses sat.
    pub stack_cache: StackCache,
    pub records: [LatencyRecord; TASK_RECORDS],
}
const _: () = assert!(
    size_of::<TaskState>()
        == 168 + size_of::<StackCache>() + size_of::<LatencyRecord>() * TASK_RECORDS
);
// One bit of `task_only` per record.
const _: () = assert!(TASK_RECORDS <= 32);

/// `TaskState::waker_kind` and `WakerKey::kind`: no `sched_waking` was seen for the wakeup
/// (it raced the sleep's start, or the kernel hid it).
pub const WAKER_UNSEEN: u32 = 0;
/// A task woke it (in task context): the waker's tgid, tid and name are kept.
pub const WAKER_TASK: u32 = 1;
/// A timer's callback woke it (an hrtimer or a timer wheel timer, in whatever context the
/// kernel runs them: hard or soft interrupt, or a timer thread on PREEMPT_RT).
pub const WAKER_TIMER: u32 = 2;
/// A hard interrupt's handler (a device, an inter-processor interrupt, irq_work).
pub const WAKER_HARDIRQ: u32 = 3;
/// A softirq (network receive, tasklets, RCU, block completion...).
pub const WAKER_SOFTIRQ: u32 = 4;
/// A non-maskable interrupt.
pub const WAKER_NMI: u32 = 5;
/// `WakerKey::kind` of a cause's wakeups whose own waker found the waker table full.
pub const WAKER_OTHER: u32 = 6;

/// A `WAKER_*` kind as exports write it.
#[must_use]
pub fn waker_kind_name(kind: u32) -> &'static str {
    match kind {
        WAKER_TASK => "task",
        WAKER_TIMER => "timer",
        WAKER_HARDIRQ => "hardirq",
        WAKER_SOFTIRQ => "softirq",
        WAKER_NMI => "nmi",
        WAKER_OTHER => "other",
        _ => "unseen",
    }
}

/// Key of the waker table (`WAKERS`): one waker of one cause, for one sleeping process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WakerKey {
    /// The sleep's record id (its backtrace, salted for D: `stack_for_state`).
    pub cause: u64,
    /// The waker's kernel backtrace when it woke (`--waker-stacks`; 0: not taken,
    /// `NO_STACK`: the stack table was full).
    pub waker_stack: u64,
    /// The sleeping process.
    pub sleeper_tgid: u32,
    /// `WAKER_*`.
    pub kind: u32,
    /// The waking task (`WAKER_TASK`; 0 otherwise).
    pub waker_tgid: u32,
    pub waker_tid: u32,
}
const _: () = assert!(size_of::<WakerKey>() == 32);

/// Value of the waker table: the sleeps it ended, and the waker's name when first seen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakerValue {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<WakerValue>() == 40);

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

/// Each CPU's last `sched_switch` as latprof saw it, to find the switches it did not see.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSwitch {
    /// The task the last seen switch put on this CPU (its `task_struct` address; 0: none yet).
    pub last_in: u64,
    /// When that switch was (bpf_ktime_get_ns), written after any `HiddenEvent` it sent: a
    /// reader that sees it past a time has every gap this CPU had up to then in the log.
    pub last_ns: u64,
    /// The tid of the last task during whose time on this CPU switches went unseen.
    pub hidden_tid: u32,
    /// Explicit padding to 8-byte alignment.
    pub reserved: u32,
    /// That task's name when the gap was found (it may have exited by the time user space
    /// reads this).
    pub hidden_comm: [u8; 16],
}
const _: () = assert!(size_of::<CpuSwitch>() == 40);

/// `HiddenEvent::kind`: switches went unseen on `cpu` from `start_ns` (its last seen switch)
/// to `end_ns` (the switch that found it); `tid` is the task it ran then.
pub const HIDDEN_GAP: u32 = 1;
/// `--debug-hide-wakeups` dropped a wakeup on `cpu` at `start_ns` (= `end_ns`): a gap made on
/// purpose, of no length.
pub const HIDDEN_GAP_DEBUG: u32 = 2;
/// `tid`'s sleep from `start_ns` was found still open at `end_ns`, and lost.
pub const HIDDEN_SLEEP_LOST: u32 = 3;
/// The same, recovered: woken at `woken_ns`.
pub const HIDDEN_SLEEP_RECOVERED: u32 = 4;
/// `tid`'s sleep from `start_ns` to `end_ns` (its seen wakeup) was counted, but no waking of
/// it was seen (`--wakers`: its waker is "unseen").
pub const HIDDEN_WAKER_UNSEEN: u32 = 5;
/// The same for the task's first traced sleep (`TASK_FLAG_FIRST_SLEEP`): its waking may have
/// raced the making of its entry, not something the kernel hid.
pub const HIDDEN_WAKER_RACED: u32 = 6;

/// What the kernel hid and what that cost, sent through the `HIDDEN` ring buffer so that user
/// space can check that each sleep lost or recovered overlapped a gap it saw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HiddenEvent {
    /// `HIDDEN_*`.
    pub kind: u32,
    pub cpu: u32,
    pub tid: u32,
    /// The sleeper's process (lost and recovered sleeps; 0 for gaps): each process's own
    /// losses are told apart.
    pub tgid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// A recovered sleep's wakeup; 0 otherwise.
    pub woken_ns: u64,
}
const _: () = assert!(size_of::<HiddenEvent>() == 40);

/// Per-CPU counters of the pipeline, indexes into the `COUNTERS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Switch-outs in S or D state that latprof started tracking.
    SleepsTracked = 0,
    /// Wakeups that ended a tracked sleep.
    Wakeups,
    /// Sleeps accounted into a record.
    Counted,
    /// Interruptible sleeps longer than the cutoff (not counted, like latencytop).
    SkippedCutoff,
    /// Sleeps shorter than one microsecond (not counted, like latencytop).
    SkippedZero,
    /// Backtraces not stored (the stack table was full, or the kernel could not walk the
    /// stack); the sleep is counted under "stack unavailable".
    StackMissing,
    /// Sleeps not tracked because the task table was full (lost: raise `--max-tasks`).
    TaskTableFull,
    /// Causes beyond `TASK_RECORDS` for one task, sent straight to the global table.
    TaskRecordsFull,
    /// Records lost because the global table was full (raise `--max-records`).
    GlobalTableFull,
    /// Tasks whose records were merged into the global table at exit (lazy mode).
    ExitMerges,
    /// Entries made for a task already exiting: one latprof first saw exiting, or one whose
    /// entry its exit merge had retired and that slept again after `sched_process_exit`
    /// (where that hook runs before `exit_mm`). Tracked as the kernel does; retired when the
    /// task is freed.
    ExitingFirstSeen,
    /// Exit merges begun; with `MergesDone`, lets the reader see a merge in flight.
    MergesBegun,
    /// Exit merges finished.
    MergesDone,
    /// Tracked sleeps still open when their task went to sleep again: the kernel never ran
    /// latprof's programs for their wakeup (nor for the task's return to a CPU). Not counted.
    SleepLost,
    /// Run-queue waits (wakeup to running) accounted.
    RunqCounted,
    /// Histogram updates lost because the histogram table was full (raise --max-records).
    HistTableFull,
    /// Spike events written to the ring buffer.
    SpikesSubmitted,
    /// Spike submissions that woke the reader.
    SpikeWakeups,
    /// Spike submissions that did not wake the reader (it was not waiting).
    SpikeWakeupsSuppressed,
    /// Spike events lost because the ring buffer was full.
    SpikesDropped,
    /// `--debug-checks`: a wakeup of a tracked task with no open sleep.
    DebugWakeupWithoutSleep,
    /// `--debug-checks`: a clock reading earlier than the sleep's start.
    DebugTimeBackwards,
    /// `--debug-checks`: the kernel could not take a backtrace.
    DebugStackFailed,
    /// `--debug-checks`: a task exited with records that were not merged (normal mode, or a
    /// kernel thread kept out of the global table).
    DebugExitWithRecords,
    /// Kernel stacks walked (at switch-out, or at wakeup when the cache could not answer).
    StackWalks,
    /// Backtraces taken from the stack cache instead of a walk.
    StackCacheHits,
    /// `--debug-checks`: a backtrace from the stack cache differed from a walk of the same
    /// sleep (every hit is walked as well to check it).
    DebugStackCacheWrong,
    /// `sched_switch` events whose outgoing task is not the one the CPU's previous event
    /// switched in: the kernel ran no BPF program for the switches in between (some kernels
    /// hide tasks from tracing while they run; their wakeups are invisible too).
    SwitchesHidden,
    /// Counted sleeps of kernel threads: kept out of the global table, as latencytop does
    /// (without `--pid`).
    KthreadSleeps,
    /// Counted sleeps of user tasks without a memory map (exiting, after exit_mm): the task's
    /// own, kept out of the global table, as latencytop does (without `--pid`).
    NoMmSleeps,
    /// Sleeps found still open at their task's next sleep or exit (their wakeup was hidden)
    /// and recovered: woken at `now - run time since - run-queue wait since`, then filtered
    /// and counted like any other (those that pass are in `Counted` too).
    SleepsRecovered,
    /// Run-queue waits not measured: their wakeup was hidden (its time is known only after
    /// the fact, from the recovered sleep).
    RunqUnknown,
    /// Events of the `HIDDEN` log lost because its ring buffer was full: the sleeps lost or
    /// recovered then cannot be checked against the gaps.
    HiddenLogFull,
    /// Records lost from the per-cgroup table because it was full (raise --max-records).
    CgroupTableFull,
    /// Counted sleeps whose `sched_waking` was not seen (it came before the sleep's start
    /// was traced, or the kernel hid it): their waker is unknown.
    WakerUnseen,
    /// Counted sleeps whose waker found the waker table full: counted under their cause's
    /// `other` waker (a table of its own), or only here when that one was full too.
    WakerTableFull,
    /// Entries of tasks first seen while exiting that were still there when the task was
    /// freed (made by a sleep after `sched_process_exit`), removed then.
    ExitingFreed,
    /// Walks that returned no user frame (a task without a user context, or a fault at once).
    UserStackEmpty,
    /// User backtraces not stored: the user stack table was full (raise --max-user-stacks).
    UserStackTableFull,
    /// First sightings of user backtraces not sent to user space: their ring buffer was full
    /// (the process's memory map may then be read too late to name them).
    UserSeenLost,
    /// Combined causes whose parts were not stored: their table was full.
    CausePartsFull,
    /// User backtraces named that were cut short (`[truncated]`: a frame that is no return
    /// address, as a program without frame pointers leaves, or no program entry reached).
    /// Counted by latprof's user space when it names them, not by the kernel.
    UserStackTruncated,
    /// Voluntary switches to wait for a PREEMPT_RT sleeping spinlock (`TASK_RTLOCK_WAIT`):
    /// neither an interruptible nor an uninterruptible sleep, not counted by latencytop nor by
    /// latprof; counted here so that a task's voluntary switches add up.
    RtlockWaits,
}

/// Number of entries in the `COUNTERS` array.
pub const COUNTER_COUNT: u32 = Counter::RtlockWaits as u32 + 1;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Self; COUNTER_COUNT as usize] = [
        Self::SleepsTracked,
        Self::Wakeups,
        Self::Counted,
        Self::SkippedCutoff,
        Self::SkippedZero,
        Self::StackMissing,
        Self::TaskTableFull,
        Self::TaskRecordsFull,
        Self::GlobalTableFull,
        Self::ExitMerges,
        Self::ExitingFirstSeen,
        Self::MergesBegun,
        Self::MergesDone,
        Self::SleepLost,
        Self::RunqCounted,
        Self::HistTableFull,
        Self::SpikesSubmitted,
        Self::SpikeWakeups,
        Self::SpikeWakeupsSuppressed,
        Self::SpikesDropped,
        Self::DebugWakeupWithoutSleep,
        Self::DebugTimeBackwards,
        Self::DebugStackFailed,
        Self::DebugExitWithRecords,
        Self::StackWalks,
        Self::StackCacheHits,
        Self::DebugStackCacheWrong,
        Self::SwitchesHidden,
        Self::KthreadSleeps,
        Self::NoMmSleeps,
        Self::SleepsRecovered,
        Self::RunqUnknown,
        Self::HiddenLogFull,
        Self::CgroupTableFull,
        Self::WakerUnseen,
        Self::WakerTableFull,
        Self::ExitingFreed,
        Self::UserStackEmpty,
        Self::UserStackTableFull,
        Self::UserSeenLost,
        Self::CausePartsFull,
        Self::UserStackTruncated,
        Self::RtlockWaits,
    ];

    /// Its name in exports (JSON keys, OpenMetrics labels, `stats --counters`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::SleepsTracked => "sleeps_tracked",
            Self::Wakeups => "wakeups",
            Self::Counted => "counted",
            Self::SkippedCutoff => "skipped_cutoff",
            Self::SkippedZero => "skipped_zero",
            Self::StackMissing => "stack_missing",
            Self::TaskTableFull => "task_table_full",
            Self::TaskRecordsFull => "task_records_full",
            Self::GlobalTableFull => "global_table_full",
            Self::ExitMerges => "exit_merges",
            Self::ExitingFirstSeen => "exiting_first_seen",
            Self::MergesBegun => "merges_begun",
            Self::MergesDone => "merges_done",
            Self::SleepLost => "sleep_lost",
            Self::RunqCounted => "runq_counted",
            Self::HistTableFull => "hist_table_full",
            Self::SpikesSubmitted => "spikes_submitted",
            Self::SpikeWakeups => "spike_wakeups",
            Self::SpikeWakeupsSuppressed => "spike_wakeups_suppressed",
            Self::SpikesDropped => "spikes_dropped",
            Self::DebugWakeupWithoutSleep => "debug_wakeup_without_sleep",
            Self::DebugTimeBackwards => "debug_time_backwards",
            Self::DebugStackFailed => "debug_stack_failed",
            Self::DebugExitWithRecords => "debug_exit_with_records",
            Self::StackWalks => "stack_walks",
            Self::StackCacheHits => "stack_cache_hits",
            Self::DebugStackCacheWrong => "debug_stack_cache_wrong",
            Self::SwitchesHidden => "switches_hidden",
            Self::KthreadSleeps => "kthread_sleeps",
            Self::NoMmSleeps => "no_mm_sleeps",
            Self::SleepsRecovered => "sleeps_recovered",
            Self::RunqUnknown => "runq_unknown",
            Self::HiddenLogFull => "hidden_log_full",
            Self::CgroupTableFull => "cgroup_table_full",
            Self::WakerUnseen => "waker_unseen",
            Self::WakerTableFull => "waker_table_full",
            Self::ExitingFreed => "exiting_freed",
            Self::UserStackEmpty => "user_stack_empty",
            Self::UserStackTableFull => "user_stack_table_full",
            Self::UserSeenLost => "user_seen_lost",
            Self::CausePartsFull => "cause_parts_full",
            Self::UserStackTruncated => "user_stack_truncated",
            Self::RtlockWaits => "rtlock_waits",
        }
    }

    /// What a non-zero value lost or left out, for the user's warning line; `None` for the
    /// counters that lose nothing. The header's "drops" is the sum of these.
    #[must_use]
    pub const fn loss(self) -> Option<&'static str> {
        match self {
            Self::StackMissing => {
                Some("backtraces not stored: stack table full (raise --max-stacks)")
            }
            Self::TaskTableFull => Some("sleeps not tracked: task table full (raise --max-tasks)"),
            Self::GlobalTableFull => Some("records lost: global table full (raise --max-records)"),
            Self::SleepLost => Some("sleeps lost: the kernel did not run latprof for their wakeup"),
            Self::RunqUnknown => {
                Some("run-queue waits not measured: their wakeup was hidden from tracing")
            }
            Self::HistTableFull => Some("histogram updates lost: table full (raise --max-records)"),
            Self::SpikesDropped => Some("spike events lost: the ring buffer was full"),
            Self::CgroupTableFull => {
                Some("per-cgroup records lost: table full (raise --max-records)")
            }
            Self::WakerTableFull => Some(
                "wakers not told apart: waker table full, counted as \"other\" (raise --max-wakers)",
            ),
            Self::UserStackTableFull => {
                Some("user backtraces not stored: user stack table full (raise --max-user-stacks)")
            }
            Self::UserSeenLost => {
                Some("user backtraces announced late: their ring buffer was full")
            }
            Self::CausePartsFull => {
                Some("kernel + user causes not told apart: their table was full")
            }
            Self::HiddenLogFull => {
                Some("hidden-switch events lost: their log was full (lost sleeps go unchecked)")
            }
            _ => None,
        }
    }
}

const _: () = {
    let mut i = 0;
    while i < Counter::ALL.len() {
        assert!(Counter::ALL[i] as usize == i);
        i += 1;
    }
};

/// What a spike was.
pub const SPIKE_SLEEP_INTERRUPTIBLE: u32 = SLEEP_INTERRUPTIBLE;
pub const SPIKE_SLEEP_UNINTERRUPTIBLE: u32 = SLEEP_UNINTERRUPTIBLE;
pub const SPIKE_RUNQ: u32 = 3;

/// Ring buffer wakeup policies (`--wakeup`).
pub const WAKEUP_ADAPTIVE: u32 = 0;
pub const WAKEUP_ALWAYS: u32 = 1;

/// One sleep or run-queue wait over `--spike`, sent to user space through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpikeEvent {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) when it ended.
    pub end_ns: u64,
    pub duration_ns: u64,
    /// Backtrace of the sleep (`RUNQ_STACK` for a run-queue wait, `NO_STACK` if none).
    pub stack_id: u64,
    pub tid: u32,
    pub tgid: u32,
    /// CPU where it ended (the waker's for a sleep, the task's for a run-queue wait).
    pub cpu: u32,
    /// `SPIKE_*`.
    pub kind: u32,
    pub comm: [u8; 16],
    /// Who ended it (a sleep's waker; `WAKER_UNSEEN` for a run-queue wait): `WAKER_*`, and
    /// the waking task's ids and name for `WAKER_TASK`.
    pub waker_kind: u32,
    pub waker_tgid: u32,
    pub waker_tid: u32,
    /// Explicit padding to 8-byte alignment.
    pub reserved: u32,
    pub waker_comm: [u8; 16],
}
const _: () = assert!(size_of::<SpikeEvent>() == 88);

/// Per-CPU counters of the kernel's tick and time accounting, indexes into the `TICKS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickCounter {
    /// Local timer interrupts (irq_vectors:local_timer_entry).
    TimerTicks = 0,
    /// The tick was stopped (timer:tick_stop with success=1: idle, or nohz_full with one task).
    TickStopOk,
    /// A nohz_full CPU could not stop its tick (timer:tick_stop with success=0); the
    /// dependencies that kept it are counted below, one per bit.
    TickStopFail,
    DepPosixTimer,
    DepPerfEvents,
    DepSched,
    DepClockUnstable,
    DepRcu,
    DepRcuExp,
    /// Context switches on this CPU.
    Switches,
    /// Context tracking: the CPU entered user mode (context_tracking:user_enter).
    UserEnter,
    /// Context tracking: the CPU left user mode (context_tracking:user_exit).
    UserExit,
}

/// Number of entries in the `TICKS` array.
pub const TICK_COUNTER_COUNT: u32 = TickCounter::UserExit as u32 + 1;
/// `tick_dep_bits` in include/linux/tick.h: bit n of timer:tick_stop's `dependency`.
pub const TICK_DEP_BITS: u32 = 6;

/// The counter of a tick dependency bit (`TICK_DEP_BIT_*`), if latprof knows it.
#[must_use]
pub const fn tick_dep_counter(bit: u32) -> Option<TickCounter> {
    match bit {
        0 => Some(TickCounter::DepPosixTimer),
        1 => Some(TickCounter::DepPerfEvents),
        2 => Some(TickCounter::DepSched),
        3 => Some(TickCounter::DepClockUnstable),
        4 => Some(TickCounter::DepRcu),
        5 => Some(TickCounter::DepRcuExp),
        _ => None,
    }
}

impl TickCounter {
    /// A tick dependency's name as the kernel's trace output prints it (`TICK_DEP_MASK_*`);
    /// `None` for the counters that are not dependencies.
    #[must_use]
    pub const fn dep_name(self) -> Option<&'static str> {
        match self {
            Self::DepPosixTimer => Some("POSIX_TIMER"),
            Self::DepPerfEvents => Some("PERF_EVENTS"),
            Self::DepSched => Some("SCHED"),
            Self::DepClockUnstable => Some("CLOCK_UNSTABLE"),
            Self::DepRcu => Some("RCU"),
            Self::DepRcuExp => Some("RCU_EXP"),
            _ => None,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), Copy, built only of integers, with no implicit padding
    // (checked by the size assertions above).
    unsafe impl aya::Pod for super::LatencyRecord {}
    unsafe impl aya::Pod for super::GlobalRecord {}
    unsafe impl aya::Pod for super::TaskState {}
    unsafe impl aya::Pod for super::CpuSwitch {}
    unsafe impl aya::Pod for super::CgroupCause {}
    unsafe impl aya::Pod for super::WakerKey {}
    unsafe impl aya::Pod for super::WakerValue {}
    unsafe impl aya::Pod for super::UserStack {}
    unsafe impl aya::Pod for super::CauseParts {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn stack_hash_covers_exactly_the_frames() {
        let mut a = [0u64; STACK_FRAMES];
        a[0] = 0xffff_ffff_8100_0010;
        a[1] = 0xffff_ffff_8100_0020;
        let mut b = a;
        b[1] = 0xffff_ffff_8100_0021;
        assert_ne!(stack_hash(&a, 2), stack_hash(&b, 2));
        assert_eq!(stack_hash(&a, 1), stack_hash(&b, 1));
        let mut swapped = a;
        swapped.swap(0, 1);
        assert_ne!(stack_hash(&a, 2), stack_hash(&swapped, 2));
        assert_ne!(stack_hash(&a, 2), NO_STACK);
    }

    #[test]
    fn histogram_buckets_are_log2_microseconds() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1_999), 0);
        assert_eq!(hist_bucket(2_000), 1);
        assert_eq!(hist_bucket(3_999), 1);
        assert_eq!(hist_bucket(4_000), 2);
        assert_eq!(hist_bucket(2_000_000), 10); // 2 ms: 1024..2047 us
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn filter_is_latencytops() {
        let v = |kind, delta| sleep_verdict(kind, delta, 1_000, 5 * MS);
        assert_eq!(v(SLEEP_INTERRUPTIBLE, 2 * MS), SleepVerdict::Count);
        assert_eq!(v(SLEEP_INTERRUPTIBLE, 5 * MS), SleepVerdict::Count);
        assert_eq!(v(SLEEP_INTERRUPTIBLE, 5 * MS + 1), SleepVerdict::OverCutoff);
        // Uninterruptible sleeps have no cutoff.
        assert_eq!(v(SLEEP_UNINTERRUPTIBLE, 900 * MS), SleepVerdict::Count);
        assert_eq!(v(SLEEP_UNINTERRUPTIBLE, 999), SleepVerdict::TooShort);
        assert_eq!(v(SLEEP_INTERRUPTIBLE, 0), SleepVerdict::TooShort);
        // --all-sleeps passes u64::MAX as the cutoff.
        assert_eq!(
            sleep_verdict(SLEEP_INTERRUPTIBLE, 60_000 * MS, 1_000, u64::MAX),
            SleepVerdict::Count
        );
    }

    #[test]
    fn states_map_like_the_kernel() {
        assert_eq!(sleep_kind(false, 0x1), SLEEP_INTERRUPTIBLE);
        // TASK_INTERRUPTIBLE | TASK_FREEZABLE (nanosleep).
        assert_eq!(sleep_kind(false, 0x2001), SLEEP_INTERRUPTIBLE);
        assert_eq!(sleep_kind(false, 0x2), SLEEP_UNINTERRUPTIBLE);
        // TASK_IDLE = TASK_UNINTERRUPTIBLE | TASK_NOLOAD; TASK_KILLABLE = .. | TASK_WAKEKILL.
        assert_eq!(sleep_kind(false, 0x402), SLEEP_UNINTERRUPTIBLE);
        assert_eq!(sleep_kind(false, 0x102), SLEEP_UNINTERRUPTIBLE);
        // TASK_WAKING, read from the task: a sleep whose wakeup has begun.
        assert_eq!(sleep_kind(false, 0x200), SLEEP_UNINTERRUPTIBLE);
        assert_eq!(sleep_kind(true, 0x200), SLEEP_NONE);
        // Running, stopped, traced, dead.
        for state in [0x0, 0x4, 0x8, 0x80] {
            assert_eq!(sleep_kind(false, state), SLEEP_NONE, "state {state:#x}");
        }
        // Preempted on its way to sleep: still runnable.
        assert_eq!(sleep_kind(true, 0x1), SLEEP_NONE);
        assert_eq!(sleep_kind(true, 0x2), SLEEP_NONE);
    }
}

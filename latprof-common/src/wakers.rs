//! Wakers: the kinds of what ends a sleep, and the waker table's key and value.

use core::mem::size_of;

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

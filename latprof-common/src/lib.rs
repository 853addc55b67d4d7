//! Every type that crosses latprof's kernel/user boundary, and nothing else.
//!
//! Layouts are `#[repr(C)]` without implicit padding and checked by size assertions, so the eBPF
//! programs and the user-space reader can never disagree on a field offset.
#![no_std]
// The helpers here run inside the eBPF programs too, where a call that is not inlined becomes a
// BPF-to-BPF call whose frame counts against the verifier's 512-byte stack limit.
#![allow(clippy::inline_always)]

mod chains;
mod counters;
mod defects;
mod events;
mod kfuncs;
mod records;
mod settings;
mod stacks;
mod unwind;
mod wakers;

pub use chains::*;
pub use counters::*;
pub use defects::*;
pub use events::*;
pub use kfuncs::*;
pub use records::*;
pub use stacks::*;
pub use unwind::*;
pub use wakers::*;

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
    unsafe impl aya::Pod for super::ChainKey {}
    unsafe impl aya::Pod for super::ChainValue {}
    unsafe impl aya::Pod for super::UserStack {}
    unsafe impl aya::Pod for super::CauseParts {}
    unsafe impl aya::Pod for super::ProcUnwind {}
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

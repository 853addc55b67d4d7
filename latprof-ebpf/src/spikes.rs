//! Spike events: a sleep or run-queue wait of at least `SPIKE_NS` goes to user space through
//! the `SPIKES` ring buffer, and the reader is woken only when it asked to be (`READER`) or the
//! buffer fills: one wakeup serves a burst, as the kernel's own tracing does.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg};

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_smp_processor_id,
};
use latprof_common::{Counter, SpikeEvent, TaskState, WAKER_TASK, WAKEUP_ALWAYS};

use crate::{
    maps::{READER, SPIKES, count},
    settings::{SPIKE_NS, WAKEUP_POLICY},
};

/// Adaptive wakeups (`WAKEUP_ADAPTIVE`) wake the reader anyway once the buffer holds this many
/// bytes: a reader that never said it sleeps still gets the events before the buffer fills.
const SPIKE_FILL_MARK: u64 = 64 * 1024;

/// Sends a sleep or wait of `delta` ns that ended at `end_ns` as a spike event when it reaches
/// `SPIKE_NS`.
#[inline(always)]
pub(crate) fn spike<const CAS: bool>(
    tid: u32,
    entry: &TaskState,
    stack: u64,
    delta: u64,
    kind: u32,
    end_ns: u64,
    waker_kind: u32,
) {
    if delta < SPIKE_NS.load() {
        return;
    }
    // The kernel tracing fix: wake the reader only if it waits (or the buffer fills). The
    // event that finds it waiting takes the flag, so one wakeup serves a burst.
    let wake = WAKEUP_POLICY.load() == WAKEUP_ALWAYS
        || READER.get_ptr_mut(0).is_some_and(|w| {
            // SAFETY: a map value pointer, valid for the program's run.
            unsafe {
                if CAS {
                    atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(w, 1, 0).0 == 1
                } else {
                    // Without compare-and-swap (before 5.12): two events that both find the
                    // flag raised both wake the reader (one wakeup too many); none that finds
                    // it raised skips the wakeup, so no wakeup is lost.
                    let raised = core::ptr::read_volatile(w) == 1;
                    if raised {
                        core::ptr::write_volatile(w, 0);
                    }
                    raised
                }
            }
        })
        || SPIKES.query(u64::from(BPF_RB_AVAIL_DATA)) >= SPIKE_FILL_MARK;
    let Some(mut slot) = SPIKES.reserve::<SpikeEvent>(0) else {
        count(Counter::SpikesDropped);
        return;
    };
    slot.write(SpikeEvent {
        end_ns,
        duration_ns: delta,
        stack_id: stack,
        tid,
        tgid: entry.tgid,
        cpu: unsafe { bpf_get_smp_processor_id() },
        kind,
        comm: entry.comm,
        waker_kind,
        waker_tgid: if waker_kind == WAKER_TASK {
            entry.waker_tgid
        } else {
            0
        },
        waker_tid: if waker_kind == WAKER_TASK {
            entry.waker_tid
        } else {
            0
        },
        reserved: 0,
        waker_comm: if waker_kind == WAKER_TASK {
            entry.waker_comm
        } else {
            [0; 16]
        },
    });
    if wake {
        slot.submit(u64::from(BPF_RB_FORCE_WAKEUP));
        count(Counter::SpikeWakeups);
    } else {
        slot.submit(u64::from(BPF_RB_NO_WAKEUP));
        count(Counter::SpikeWakeupsSuppressed);
    }
    count(Counter::SpikesSubmitted);
}

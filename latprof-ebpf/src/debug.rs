//! `--debug-checks`: consistency checks that count an anomaly (`Counter::Debug*`) and log it
//! through aya-log. Every call sits behind `DEBUG_CHECKS`, a setting, so a run without the flag
//! holds none of this code after the verifier; aya-log is never on the switch path otherwise.

use aya_ebpf::{EbpfContext, helpers::bpf_ktime_get_ns};
use aya_log_ebpf::warn;
use latprof_common::Counter;

use crate::maps::{DEBUG_LOG_BUDGET, count};

/// Every call sits behind `DEBUG_CHECKS`, so without the flag the verifier removes it.
#[inline(always)]
pub(crate) fn anomaly<C: EbpfContext>(ctx: &C, counter: Counter, tid: u32, value: u64) {
    count(counter);
    let Some(budget) = DEBUG_LOG_BUDGET.get_ptr_mut(0) else {
        return;
    };
    let second = unsafe { bpf_ktime_get_ns() } / 1_000_000_000;
    // SAFETY: this CPU's slot.
    let budget = unsafe { &mut *budget };
    if budget[0] != second {
        budget[0] = second;
        budget[1] = 0;
    }
    if budget[1] >= 10 {
        return;
    }
    budget[1] += 1;
    match counter {
        Counter::DebugWakeupWithoutSleep => {
            warn!(ctx, "wakeup of tid {} with no recorded sleep", tid);
        }
        Counter::DebugTimeBackwards => {
            warn!(
                ctx,
                "tid {}: clock {} ns before its sleep began", tid, value
            );
        }
        Counter::DebugStackFailed => warn!(ctx, "tid {}: backtrace could not be taken", tid),
        Counter::DebugStackCacheWrong => warn!(
            ctx,
            "tid {}: the stack cache's backtrace differs from the walked one ({})", tid, value
        ),
        Counter::DebugExitWithRecords => warn!(
            ctx,
            "tid {} exited with {} records merged nowhere", tid, value
        ),
        // A check added without its own line still says which counter it bumped.
        _ => warn!(
            ctx,
            "tid {}: anomaly counted in counter {} ({})", tid, counter as u32, value
        ),
    }
}

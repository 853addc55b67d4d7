//! The header: the interval's totals, rates and the pipeline's counters.

use crate::collect::Snapshot;

/// Header numbers: rates between two snapshots, totals since attach.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// Seconds since the first snapshot.
    pub elapsed_s: f64,
    /// latprof's program runs per second (every scheduler event it handled).
    pub events_per_s: f64,
    /// Everything that did not fit or was lost (see `Counters::losses`).
    pub drops: u64,
    /// Kernel time per program run, from the kernel's BPF run-time statistics.
    pub cost_ns_per_event: Option<f64>,
    /// latprof's eBPF programs' share of one CPU.
    pub cpu_percent: Option<f64>,
}

/// Header of `cur`, with rates over `prev` -> `cur` and elapsed time since `first`.
#[must_use]
pub fn header(first: &Snapshot, prev: Option<&Snapshot>, cur: &Snapshot) -> Header {
    let drops = cur.counters.lost();
    let runs = |s: &Snapshot| -> (u64, u64) {
        s.programs
            .iter()
            .fold((0, 0), |(t, n), (_, time, count)| (t + time, n + count))
    };
    let mut h = Header {
        elapsed_s: cur.taken_ns.saturating_sub(first.taken_ns) as f64 / 1e9,
        drops,
        ..Header::default()
    };
    if let Some(prev) = prev {
        let (t1, n1) = runs(prev);
        let (t2, n2) = runs(cur);
        let dt = cur.taken_ns.saturating_sub(prev.taken_ns) as f64 / 1e9;
        if dt > 0.0 {
            h.events_per_s = n2.saturating_sub(n1) as f64 / dt;
            h.cpu_percent = Some(t2.saturating_sub(t1) as f64 / 1e9 / dt * 100.0);
        }
        if n2 > n1 {
            h.cost_ns_per_event = Some(t2.saturating_sub(t1) as f64 / (n2 - n1) as f64);
        }
    }
    h
}

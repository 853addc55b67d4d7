//! Stretches a recording holds no snapshot for: its recorder stopped (SIGSTOP, a debugger, a
//! machine too loaded to run it) and went on later (`cmd::stalls` says so as it happens). Nothing in the file marks them but two
//! timestamps far apart (issue 53, R14), so the reader finds them and says so, one line a gap,
//! the first few listed and the rest summed in one more line.

use std::time::Duration;

use crate::time;

/// Gaps listed one by one; the rest are summed.
const LISTED: usize = 5;

/// Two snapshots this far apart (in intervals) have a gap between them, when the time missed
/// is also at least [`MIN_MISSED`]. A snapshot's time is taken once it is read, and reading
/// waits up to 2 s for user frames to be named (the last one 10 s: it is left out), so two
/// snapshots of a recorder that ran are up to an interval and 2 s apart.
const INTERVALS: u64 = 3;
const MIN_MISSED: Duration = Duration::from_secs(3);

/// A gap after snapshot `after`: the time with no snapshot beyond the one interval expected.
#[derive(Debug, PartialEq, Eq)]
pub struct Gap {
    pub after: usize,
    pub from_wall_ns: u64,
    pub to_wall_ns: u64,
    pub missed: Duration,
}

/// The gaps between snapshots taken at `times` (CLOCK_MONOTONIC, CLOCK_REALTIME in ns, in
/// order) every `interval_ns`, but before the last. The monotonic clock measures them: a change of the wall clock
/// is no gap (time a machine spends suspended is none either: nothing ran then).
#[must_use]
pub fn find(times: &[(u64, u64)], interval_ns: u64) -> Vec<Gap> {
    let before_last = &times[..times.len().saturating_sub(1)];
    before_last
        .windows(2)
        .enumerate()
        .filter_map(|(i, w)| {
            let ((mono_a, wall_a), (mono_b, wall_b)) = (w[0], w[1]);
            let apart = mono_b.saturating_sub(mono_a);
            is_gap(apart, interval_ns).then(|| Gap {
                after: i,
                from_wall_ns: wall_a,
                to_wall_ns: wall_b,
                missed: Duration::from_nanos(apart.saturating_sub(interval_ns)),
            })
        })
        .collect()
}

/// Whether two snapshots `apart_ns` apart, taken every `interval_ns`, have a gap between
/// them.
fn is_gap(apart_ns: u64, interval_ns: u64) -> bool {
    let missed = Duration::from_nanos(apart_ns.saturating_sub(interval_ns));
    apart_ns >= interval_ns.saturating_mul(INTERVALS) && missed >= MIN_MISSED
}

/// What the reader says of `gaps`: a line for each of the first [`LISTED`], one for the rest.
#[must_use]
pub fn lines(gaps: &[Gap], interval_ns: u64) -> Vec<String> {
    let every = time::format_duration(Duration::from_nanos(interval_ns));
    let mut out: Vec<String> = gaps
        .iter()
        .take(LISTED)
        .map(|g| {
            format!(
                "no snapshot for {} from {} to {} (UTC; one every {every} expected): the recorder did not run then (stopped, or starved of CPU), and those sleeps are counted in the snapshot after it",
                time::format_duration(g.missed),
                time::rfc3339_utc(g.from_wall_ns),
                time::rfc3339_utc(g.to_wall_ns),
            )
        })
        .collect();
    if gaps.len() > LISTED {
        let rest = &gaps[LISTED..];
        let missed: Duration = rest.iter().map(|g| g.missed).sum();
        out.push(format!(
            "{} more gaps like these, {} without a snapshot in all",
            rest.len(),
            time::format_duration(missed)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Snapshots a second apart at `monos` (seconds), the wall clock 1000 s ahead.
    fn at(monos: &[u64]) -> Vec<(u64, u64)> {
        monos.iter().map(|&m| (m * S, (m + 1000) * S)).collect()
    }

    #[test]
    fn a_stopped_recorder_leaves_one_gap() {
        let gaps = find(&at(&[1, 2, 3, 45, 46, 47]), S);
        assert_eq!(
            gaps,
            [Gap {
                after: 2,
                from_wall_ns: 1003 * S,
                to_wall_ns: 1045 * S,
                missed: Duration::from_secs(41),
            }]
        );
        let lines = lines(&gaps, S);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("no snapshot for 41"), "{}", lines[0]);
    }

    #[test]
    fn late_snapshots_and_wall_clock_steps_are_no_gaps() {
        let end = (100 * S, 100 * S);
        // 2.9 intervals apart at 1 s; 50 ms apart and 2.5 s late (naming's wait).
        let late = [(0, 0), (29 * S / 10, 29 * S / 10), end];
        assert_eq!(find(&late, S), []);
        let named = [(0, 0), (255 * S / 100, 255 * S / 100), end];
        assert_eq!(find(&named, S / 20), []);
        // The wall clock stepped an hour; the monotonic one went on a second.
        let stepped = [(S, S), (2 * S, 3600 * S), end];
        assert_eq!(find(&stepped, S), []);
        // The last snapshot waits up to 10 s for names.
        assert_eq!(find(&at(&[1, 2, 12]), S), []);
    }

    #[test]
    fn many_gaps_are_summed_past_the_first_few() {
        let monos: Vec<u64> = (0..21).map(|i| i * 10).collect();
        let gaps = find(&at(&monos), S);
        assert_eq!(gaps.len(), 19);
        let lines = lines(&gaps, S);
        assert_eq!(lines.len(), LISTED + 1);
        assert!(
            lines[LISTED].starts_with("14 more gaps like these"),
            "{}",
            lines[LISTED]
        );
    }
}

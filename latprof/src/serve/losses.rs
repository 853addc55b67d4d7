//! `serve`'s log of what it loses. A service is read by its metrics, but nobody watches every
//! counter: a kernel table that fills, a naming budget that a user spent, went by with no
//! word in the journal. Each read, every loss counter (`Counter::loss`) that grew is told in
//! one line, at most once per `EVERY` per counter (what grew meanwhile is told with the next
//! line), so that a table full for hours writes a line a minute, not one a read.

use std::time::{Duration, Instant};

use latprof_common::{COUNTER_COUNT, Counter};

use crate::collect::Counters;

/// The least time between two lines of one counter.
pub const EVERY: Duration = Duration::from_secs(60);

/// The loss counters as last told.
#[derive(Debug)]
pub struct Losses {
    /// Each counter's value when last told (or at the first read).
    told: [u64; COUNTER_COUNT as usize],
    /// When each was last told.
    at: [Option<Instant>; COUNTER_COUNT as usize],
}

impl Default for Losses {
    fn default() -> Self {
        Self {
            told: [0; COUNTER_COUNT as usize],
            at: [None; COUNTER_COUNT as usize],
        }
    }
}

impl Losses {
    /// The lines to log for the counters of a read taken at `now`.
    pub fn read(&mut self, counters: &Counters, now: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        for counter in Counter::ALL {
            let Some(what) = counter.loss() else {
                continue;
            };
            let i = counter as usize;
            let value = counters.0[i];
            let grew = value.saturating_sub(self.told[i]);
            let due = self.at[i].is_none_or(|at| now.duration_since(at) >= EVERY);
            if grew > 0 && due {
                lines.push(format!(
                    "{grew} more {what} ({value} in all: latprof_dropped_total{{kind=\"{}\"}})",
                    counter.name()
                ));
                self.told[i] = value;
                self.at[i] = Some(now);
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_loss_is_told_once_a_minute_with_what_grew_meanwhile() {
        let mut losses = Losses::default();
        let mut c = Counters::default();
        let t0 = Instant::now();
        assert_eq!(
            losses.read(&c, t0),
            Vec::<String>::new(),
            "nothing lost: nothing said"
        );
        c.0[Counter::StackMissing as usize] = 5;
        // Not a loss: never told.
        c.0[Counter::Counted as usize] = 1000;
        let lines = losses.read(&c, t0 + Duration::from_secs(1));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("5 more backtraces not stored"),
            "{lines:?}"
        );
        assert!(lines[0].contains("stack_missing"), "{lines:?}");
        c.0[Counter::StackMissing as usize] = 9;
        assert_eq!(
            losses.read(&c, t0 + Duration::from_secs(30)),
            Vec::<String>::new()
        );
        c.0[Counter::StackMissing as usize] = 12;
        let lines = losses.read(&c, t0 + Duration::from_secs(61));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("7 more backtraces"), "{lines:?}");
        assert_eq!(
            losses.read(&c, t0 + Duration::from_secs(200)),
            Vec::<String>::new()
        );
    }
}

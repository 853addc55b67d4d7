//! The recorder says when it did not run for a while (stopped with SIGSTOP, starved of CPU):
//! its recording shows such a stretch only as two snapshots far apart (issue 53, R14). A
//! thread of its own wakes every tenth of a second and measures how late it woke: a stopped
//! process's threads all stop, wherever the recorder was (waiting, or taking a snapshot,
//! which may itself take seconds naming user frames without the recorder being stalled).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::time;

/// How often the watching thread wakes.
const TICK: Duration = Duration::from_millis(100);
/// Woken this much later (and at least an interval), latprof did not run.
const LATE: Duration = Duration::from_secs(1);
/// One line a minute at most.
const EVERY: Duration = Duration::from_secs(60);

/// The watching thread; stopped when dropped.
pub struct Stalls {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Stalls {
    /// Starts watching for stalls of a recorder that takes a snapshot every `interval`. A
    /// thread that cannot start leaves the recording as it was, unwatched.
    #[must_use]
    pub fn watch(interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("latprof-stalls".to_owned())
                .spawn(move || {
                    let mut said = Said::new(interval);
                    let mut last = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        thread::sleep(TICK);
                        let now = Instant::now();
                        let late = now.duration_since(last).saturating_sub(TICK);
                        last = now;
                        if let Some(line) = said.line(late, now) {
                            eprintln!("latprof: warning: {line}");
                        }
                    }
                })
                .ok()
        };
        Self { stop, thread }
    }
}

impl Drop for Stalls {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What to say of a wake this late, once a minute at most.
struct Said {
    interval: Duration,
    at: Option<Instant>,
}

impl Said {
    fn new(interval: Duration) -> Self {
        Self { interval, at: None }
    }

    fn line(&mut self, late: Duration, now: Instant) -> Option<String> {
        if late < LATE.max(self.interval) || self.at.is_some_and(|s| now.duration_since(s) < EVERY)
        {
            return None;
        }
        self.at = Some(now);
        Some(format!(
            "latprof did not run for {} (stopped, or starved of CPU): the recording has no snapshot for that stretch (one every {} expected); its sleeps are in the next one",
            time::format_duration(late),
            time::format_duration(self.interval)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_wake_is_said_once_a_minute() {
        let mut s = Said::new(Duration::from_millis(100));
        let t0 = Instant::now();
        assert_eq!(s.line(Duration::from_millis(900), t0), None);
        assert!(s.line(Duration::from_secs(2), t0).is_some());
        assert_eq!(
            s.line(Duration::from_secs(5), t0 + Duration::from_secs(30)),
            None
        );
        assert!(
            s.line(Duration::from_secs(5), t0 + Duration::from_secs(61))
                .is_some()
        );
        // At an interval of 5 s, 3 s late costs no snapshot.
        let mut slow = Said::new(Duration::from_secs(5));
        assert_eq!(slow.line(Duration::from_secs(3), t0), None);
    }
}

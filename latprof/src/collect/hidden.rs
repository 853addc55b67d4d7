//! Checks each sleep the kernel hid from latprof against the gaps latprof saw.
//!
//! Some kernels run no BPF program while certain tasks are current. `sched_switch` finds such
//! a gap afterwards (the task going out is not the one last switched in) and logs it, from the
//! CPU's last seen switch to the one that found it; a sleep found still open later is logged as
//! lost or recovered, with when it began and when it was found. Its wakeup, which latprof never
//! saw, fell between the two, inside a gap on some CPU: a lost or recovered sleep that
//! overlapped no gap was lost for another reason, a bug latprof must show rather than blame on
//! the kernel.
//!
//! A gap is logged only when it ends, maybe after the sleep it explains was found, and on
//! another CPU. So a sleep waits until every online CPU has a seen switch after it was found
//! (`CpuSwitch::last_ns`, written after the gap's event): by then every gap that could explain
//! it is in the log. A CPU that stays idle is visited (a thread of latprof's runs there once)
//! when a sleep waits on it.

use std::{collections::BTreeMap, sync::Mutex, thread, time::Duration};

use anyhow::{Context as _, Result};
use latprof_common::{
    HIDDEN_GAP, HIDDEN_GAP_DEBUG, HIDDEN_SLEEP_LOST, HIDDEN_SLEEP_RECOVERED, HIDDEN_SLEEP_SHORT,
    HIDDEN_WAKER_RACED, HIDDEN_WAKER_UNSEEN, HiddenEvent,
};

use crate::probe::Maps;

/// Gaps kept, merged where they overlap; past this the two oldest merge into one (a coarser
/// past, never a forgotten one).
const MAX_GAPS: usize = 4096;
/// Sleeps kept waiting for a verdict; past this the oldest is judged on what is known.
const MAX_WAITING: usize = 4096;
/// Unexplained sleeps kept as examples for the warning.
const MAX_EXAMPLES: usize = 4;
/// Processes whose explained losses are kept apart; past this, the rest count under pid 0.
const MAX_PROCESSES: usize = 4096;

/// What the check found, cumulative since the probe attached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HiddenSleeps {
    /// Gaps the kernel's hiding left (a run of unseen switches on one CPU).
    pub gaps: u64,
    /// Wakeups `--debug-hide-wakeups` hid on purpose.
    pub debug_gaps: u64,
    /// Sleeps lost or recovered that overlapped a gap: their wakeup was hidden.
    pub explained: u64,
    /// Sleeps lost or recovered that overlapped none: lost for another reason.
    pub unexplained: u64,
    /// Sleeps not judged yet: a CPU had no seen switch since (latprof could not visit it).
    pub waiting: u64,
    /// A few unexplained sleeps: (tid, began, found), CLOCK_MONOTONIC ns.
    pub examples: Vec<(u32, u64, u64)>,
    /// Counted sleeps whose waking was not seen (`--wakers`: waker "unseen"), each checked
    /// against the gaps as lost ones are: explained, and not.
    pub unseen_explained: u64,
    pub unseen_unexplained: u64,
    /// Counted first sleeps of a task whose waking was unseen: it may have come before latprof
    /// made the task's entry (at that sleep's start), a race of latprof's, not the kernel's.
    pub unseen_raced: u64,
    /// Each process's explained losses and unseen wakings: what its own numbers lack, told
    /// apart from every other process's (pid 0: processes past `MAX_PROCESSES`).
    pub by_pid: BTreeMap<u32, ProcessHidden>,
}

/// One process's sleeps whose wakeup or waking the kernel hid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessHidden {
    /// Lost: neither counted nor recovered.
    pub lost: u64,
    /// Counted, with waker "unseen" (where the kernel hid switches).
    pub waker_unseen: u64,
    /// Counted, with waker "unseen": a task's first traced sleep, whose waking may have come
    /// before latprof made its entry.
    pub waker_raced: u64,
    /// Not counted: shorter than 1 us, like latencytop (not the kernel's doing; told here so
    /// that the process's numbers add up to the sleeps it slept).
    pub short: u64,
}

impl ProcessHidden {
    /// `self` less `base` (a process's over an interval).
    #[must_use]
    pub fn since(self, base: Self) -> Self {
        Self {
            lost: self.lost.saturating_sub(base.lost),
            waker_unseen: self.waker_unseen.saturating_sub(base.waker_unseen),
            waker_raced: self.waker_raced.saturating_sub(base.waker_raced),
            short: self.short.saturating_sub(base.short),
        }
    }
}

impl HiddenSleeps {
    /// The check's numbers over `base` -> `self`, named as `stats --counters` and JSON name
    /// them (the waiting ones are a state, as of `self`).
    #[must_use]
    pub fn counters(&self, base: Option<&Self>) -> [(&'static str, u64); 6] {
        let since = |n: u64, f: fn(&Self) -> u64| n.saturating_sub(base.map_or(0, f));
        [
            (
                "hidden_sleeps_explained",
                since(self.explained, |b| b.explained),
            ),
            (
                "hidden_sleeps_unexplained",
                since(self.unexplained, |b| b.unexplained),
            ),
            ("hidden_sleeps_waiting", self.waiting),
            (
                "waker_unseen_explained",
                since(self.unseen_explained, |b| b.unseen_explained),
            ),
            (
                "waker_unseen_unexplained",
                since(self.unseen_unexplained, |b| b.unseen_unexplained),
            ),
            (
                "waker_unseen_first_sleep",
                since(self.unseen_raced, |b| b.unseen_raced),
            ),
        ]
    }

    /// `pid`'s sleeps whose wakeup or waking was hidden.
    #[must_use]
    pub fn of(&self, pid: u32) -> ProcessHidden {
        self.by_pid.get(&pid).copied().unwrap_or_default()
    }

    /// The line naming the processes whose sleeps under 1 us latprof left out, with how many
    /// (`None`: none). Not a warning: latencytop leaves them out too.
    #[must_use]
    pub fn short_by_process(&self) -> Option<String> {
        let by_pid: Vec<String> = self
            .by_pid
            .iter()
            .filter(|(_, p)| p.short > 0)
            .map(|(pid, p)| format!("pid {pid} ({})", p.short))
            .collect();
        (!by_pid.is_empty()).then(|| {
            format!(
                "sleeps under 1us not counted, by process: {}",
                shown(&by_pid)
            )
        })
    }

    /// The warning lines for sleeps the check could not put in a gap.
    #[must_use]
    pub fn losses(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.unexplained > 0 {
            let seen: Vec<String> = self
                .examples
                .iter()
                .map(|(tid, from, to)| format!("tid {tid} from {from} to {to} ns"))
                .collect();
            out.push(format!(
                "{} lost or recovered sleeps overlapped no hidden switch: lost for another reason, a latprof bug (e.g. {})",
                self.unexplained,
                seen.join(", ")
            ));
        }
        let by_pid: Vec<String> = self
            .by_pid
            .iter()
            .filter(|(_, p)| p.lost + p.waker_unseen + p.waker_raced > 0)
            .map(|(pid, p)| {
                format!(
                    "pid {pid} ({} lost, {} waker unseen, {} first sleep)",
                    p.lost, p.waker_unseen, p.waker_raced
                )
            })
            .collect();
        if !by_pid.is_empty() {
            out.push(format!(
                "lost sleeps and unseen wakings, by process: {}",
                shown(&by_pid)
            ));
        }
        if self.unseen_unexplained > 0 {
            out.push(format!(
                "{} sleeps counted with their waking unseen outside every stretch where the kernel hid switches (their waker is \"unseen\")",
                self.unseen_unexplained
            ));
        }
        if self.waiting > 0 {
            out.push(format!(
                "{} lost or recovered sleeps not yet checked against hidden switches: a CPU had no switch latprof saw since",
                self.waiting
            ));
        }
        out
    }
}

/// `items` joined, the first 64 of them (enough for every process a run's hidden stretches
/// touched here: one to three), and how many more.
fn shown(items: &[String]) -> String {
    const SHOWN: usize = 64;
    let more = items.len().saturating_sub(SHOWN);
    let out = items[..items.len().min(SHOWN)].join(", ");
    if more > 0 {
        format!("{out} and {more} more")
    } else {
        out
    }
}

/// A sleep lost or recovered, waiting for its verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiting {
    tid: u32,
    tgid: u32,
    /// `HIDDEN_SLEEP_*` or `HIDDEN_WAKER_UNSEEN`.
    kind: u32,
    began: u64,
    found: u64,
}

/// The gaps seen and the sleeps waiting; pure bookkeeping, fed by `Log`.
#[derive(Debug, Default)]
pub(crate) struct Check {
    /// Disjoint, sorted by start (so by end too): the union of every gap seen.
    gaps: Vec<(u64, u64)>,
    waiting: Vec<Waiting>,
    out: HiddenSleeps,
}

impl Check {
    pub(crate) fn event(&mut self, e: &HiddenEvent) {
        match e.kind {
            HIDDEN_GAP => {
                self.out.gaps += 1;
                self.add_gap(e.start_ns, e.end_ns);
            }
            HIDDEN_GAP_DEBUG => {
                self.out.debug_gaps += 1;
                self.add_gap(e.start_ns, e.end_ns);
            }
            HIDDEN_SLEEP_SHORT => {
                // Nothing to check: latprof left it out, the kernel hid nothing.
                self.process(e.tgid).short += 1;
            }
            HIDDEN_WAKER_RACED => {
                // Nothing to check against the gaps: the task's first traced sleep.
                self.out.unseen_raced += 1;
                self.process(e.tgid).waker_raced += 1;
            }
            HIDDEN_SLEEP_LOST | HIDDEN_SLEEP_RECOVERED | HIDDEN_WAKER_UNSEEN => {
                if self.waiting.len() >= MAX_WAITING {
                    let oldest = self.waiting.remove(0);
                    self.judge(oldest);
                }
                self.waiting.push(Waiting {
                    tid: e.tid,
                    tgid: e.tgid,
                    kind: e.kind,
                    began: e.start_ns,
                    found: e.end_ns,
                });
            }
            _ => {}
        }
    }

    fn add_gap(&mut self, start: u64, end: u64) {
        let (start, end) = (start.min(end), start.max(end));
        // The first gap that ends at or after `start`: every one before it ends earlier.
        let first = self.gaps.partition_point(|&(_, e)| e < start);
        // Past the last gap that starts at or before `end`.
        let last = self.gaps.partition_point(|&(s, _)| s <= end);
        if first < last {
            let merged = (
                start.min(self.gaps[first].0),
                end.max(self.gaps[last - 1].1),
            );
            self.gaps.splice(first..last, [merged]);
        } else {
            self.gaps.insert(first, (start, end));
        }
        if self.gaps.len() > MAX_GAPS {
            let second = self.gaps.remove(1);
            self.gaps[0].1 = second.1;
        }
    }

    /// Whether any gap overlaps `[from, to]`.
    fn overlaps(&self, from: u64, to: u64) -> bool {
        // The last gap that starts at or before `to`; gaps are disjoint, so it ends latest.
        let n = self.gaps.partition_point(|&(s, _)| s <= to);
        n > 0 && self.gaps[n - 1].1 >= from
    }

    fn judge(&mut self, w: Waiting) {
        let explained = self.overlaps(w.began, w.found);
        if w.kind == HIDDEN_WAKER_UNSEEN {
            if explained {
                self.out.unseen_explained += 1;
                self.process(w.tgid).waker_unseen += 1;
            } else {
                self.out.unseen_unexplained += 1;
            }
        } else if explained {
            self.out.explained += 1;
            if w.kind == HIDDEN_SLEEP_LOST {
                self.process(w.tgid).lost += 1;
            }
        } else {
            self.out.unexplained += 1;
            if self.out.examples.len() < MAX_EXAMPLES {
                self.out.examples.push((w.tid, w.began, w.found));
            }
        }
    }

    /// Process `tgid`'s tally (pid 0's past `MAX_PROCESSES`).
    fn process(&mut self, tgid: u32) -> &mut ProcessHidden {
        let by_pid = &mut self.out.by_pid;
        let pid = if by_pid.len() < MAX_PROCESSES || by_pid.contains_key(&tgid) {
            tgid
        } else {
            0
        };
        by_pid.entry(pid).or_default()
    }

    /// Judges every waiting sleep that a gap explains, or that every CPU has passed
    /// (`seen_until`: the earliest of the online CPUs' last seen switches, read before the
    /// events were).
    pub(crate) fn settle(&mut self, seen_until: u64) {
        let waiting = std::mem::take(&mut self.waiting);
        for w in waiting {
            if self.overlaps(w.began, w.found) || seen_until > w.found {
                self.judge(w);
            } else {
                self.waiting.push(w);
            }
        }
        self.out.waiting = self.waiting.len() as u64;
    }

    pub(crate) fn result(&self) -> HiddenSleeps {
        self.out.clone()
    }
}

/// The `HIDDEN` log's reader and its check, owned by the collector (one per probe: the log is
/// drained by whoever reads it).
#[derive(Debug, Default)]
pub struct Log {
    check: Mutex<Check>,
}

impl Log {
    /// Reads what the kernel logged since the last call and judges what it can; where sleeps
    /// wait on a CPU with no seen switch since, visits each online CPU once and judges again.
    pub fn read(&self, maps: &Maps) -> Result<HiddenSleeps> {
        let mut check = self
            .check
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cpus = crate::cpus::online();
        drain(maps, &cpus, &mut check)?;
        if !check.waiting.is_empty() {
            visit(&cpus);
            drain(maps, &cpus, &mut check)?;
        }
        Ok(check.result())
    }
}

/// One pass: the CPUs' last seen switches, then the log, then the verdicts.
fn drain(maps: &Maps, cpus: &[usize], check: &mut Check) -> Result<()> {
    let last = maps.last_switch.get(&0, 0).context("read LAST_SWITCH")?;
    let seen_until = cpus
        .iter()
        .map(|&c| last.get(c).map_or(0, |s| s.last_ns))
        .min()
        .unwrap_or(0);
    let mut ring = maps.hidden();
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<HiddenEvent>() {
            // SAFETY: the kernel wrote a whole HiddenEvent (size checked); the read is
            // unaligned-safe.
            let e = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<HiddenEvent>()) };
            check.event(&e);
        }
    }
    check.settle(seen_until);
    Ok(())
}

/// Runs a short-lived thread of latprof's on each of `cpus`: its switch out is one latprof
/// sees, which ends any gap open there.
fn visit(cpus: &[usize]) {
    let threads: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            thread::spawn(move || {
                // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
                }
                thread::sleep(Duration::from_micros(200));
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(start: u64, end: u64) -> HiddenEvent {
        HiddenEvent {
            kind: HIDDEN_GAP,
            start_ns: start,
            end_ns: end,
            ..HiddenEvent::default()
        }
    }

    fn lost(tid: u32, began: u64, found: u64) -> HiddenEvent {
        HiddenEvent {
            kind: HIDDEN_SLEEP_LOST,
            tid,
            start_ns: began,
            end_ns: found,
            ..HiddenEvent::default()
        }
    }

    #[test]
    fn a_sleep_inside_a_gap_is_explained_one_outside_is_not() {
        let mut c = Check::default();
        c.event(&gap(100, 200));
        c.event(&lost(7, 150, 300));
        c.event(&lost(8, 250, 300));
        c.settle(301);
        let r = c.result();
        assert_eq!((r.explained, r.unexplained, r.waiting), (1, 1, 0));
        assert_eq!(r.examples, vec![(8, 250, 300)]);
        assert!(r.losses()[0].starts_with("1 lost or recovered sleeps overlapped no hidden"));
    }

    #[test]
    fn each_process_keeps_its_own_explained_losses() {
        let mut c = Check::default();
        c.event(&gap(100, 200));
        c.event(&HiddenEvent {
            tgid: 40,
            ..lost(41, 150, 300)
        });
        c.event(&HiddenEvent {
            tgid: 40,
            ..lost(40, 160, 300)
        });
        c.event(&HiddenEvent {
            tgid: 50,
            ..lost(50, 170, 300)
        });
        // Recovered: counted, so not lost from its process.
        c.event(&HiddenEvent {
            kind: HIDDEN_SLEEP_RECOVERED,
            tgid: 50,
            ..lost(51, 150, 300)
        });
        // Unexplained: no process is excused by it.
        c.event(&HiddenEvent {
            tgid: 60,
            ..lost(60, 250, 300)
        });
        c.settle(301);
        let r = c.result();
        assert_eq!((r.explained, r.unexplained), (4, 1));
        assert_eq!((r.of(40).lost, r.of(50).lost, r.of(60).lost), (2, 1, 0));
        // A counted sleep whose waking was unseen: its process's, if a gap explains it.
        c.event(&HiddenEvent {
            kind: HIDDEN_WAKER_UNSEEN,
            tgid: 40,
            ..lost(41, 190, 320)
        });
        c.event(&HiddenEvent {
            kind: HIDDEN_WAKER_UNSEEN,
            tgid: 40,
            ..lost(41, 310, 320)
        });
        c.settle(321);
        let r = c.result();
        assert_eq!((r.unseen_explained, r.unseen_unexplained), (1, 1));
        c.event(&HiddenEvent {
            kind: HIDDEN_WAKER_RACED,
            tgid: 50,
            ..lost(51, 400, 420)
        });
        let r = c.result();
        assert_eq!(r.unseen_raced, 1);
        assert_eq!(
            r.of(40),
            ProcessHidden {
                lost: 2,
                waker_unseen: 1,
                waker_raced: 0,
                short: 0,
            }
        );
        assert_eq!(r.of(50).waker_raced, 1);
        let losses = r.losses();
        assert!(
            losses
                .iter()
                .any(|l| l.starts_with("1 sleeps counted with their waking unseen")),
            "{losses:?}"
        );
        assert!(
            losses.contains(
                &"lost sleeps and unseen wakings, by process: pid 40 (2 lost, 1 waker unseen, 0 first sleep), pid 50 (1 lost, 0 waker unseen, 1 first sleep)"
                    .to_owned()
            ),
            "{losses:?}"
        );
    }

    #[test]
    fn short_sleeps_are_told_by_process_and_judged_against_nothing() {
        let mut c = Check::default();
        assert_eq!(c.result().short_by_process(), None);
        for (tgid, tid) in [(40, 41), (40, 42), (7, 7)] {
            c.event(&HiddenEvent {
                kind: HIDDEN_SLEEP_SHORT,
                tgid,
                ..lost(tid, 100, 100)
            });
        }
        let r = c.result();
        assert_eq!((r.of(40).short, r.of(7).short), (2, 1));
        assert_eq!((r.of(40).lost, r.waiting, r.unexplained), (0, 0, 0));
        // Not a loss: no warning line, a line of its own.
        assert_eq!(r.losses(), Vec::<String>::new());
        assert_eq!(
            r.short_by_process().as_deref(),
            Some("sleeps under 1us not counted, by process: pid 7 (1), pid 40 (2)")
        );
        assert_eq!(r.of(40).since(r.of(40)), ProcessHidden::default());
    }

    #[test]
    fn a_sleep_waits_until_every_cpu_has_passed_it() {
        let mut c = Check::default();
        c.event(&lost(7, 150, 300));
        // A CPU last seen at 290 may still be in a gap that began before 300.
        c.settle(290);
        assert_eq!(c.result().waiting, 1);
        // That gap, found later, explains it.
        c.event(&gap(120, 400));
        c.settle(400);
        let r = c.result();
        assert_eq!((r.explained, r.unexplained, r.waiting), (1, 0, 0));
    }

    #[test]
    fn gaps_merge_and_stay_bounded() {
        let mut c = Check::default();
        c.event(&gap(10, 20));
        c.event(&gap(30, 40));
        c.event(&gap(15, 35));
        assert_eq!(c.gaps, vec![(10, 40)]);
        c.event(&gap(50, 50));
        c.event(&gap(45, 46));
        assert_eq!(c.gaps, vec![(10, 40), (45, 46), (50, 50)]);
        for i in 0..(MAX_GAPS as u64 + 10) {
            c.event(&gap(1000 + 10 * i, 1001 + 10 * i));
        }
        assert_eq!(c.gaps.len(), MAX_GAPS);
        assert!(c.gaps.windows(2).all(|w| w[0].1 < w[1].0));
        // The coarser past still covers what the gaps covered.
        assert!(c.overlaps(45, 45) && c.overlaps(1000, 1000));
        let last = 1000 + 10 * (MAX_GAPS as u64 + 9);
        assert!(c.overlaps(last, last + 1));
        assert!(!c.overlaps(last + 2, last + 5));
    }

    #[test]
    fn a_debug_gap_of_no_length_explains_the_sleep_around_it() {
        let mut c = Check::default();
        c.event(&HiddenEvent {
            kind: HIDDEN_GAP_DEBUG,
            start_ns: 500,
            end_ns: 500,
            ..HiddenEvent::default()
        });
        c.event(&lost(1, 400, 600));
        c.event(&lost(2, 501, 600));
        c.settle(1000);
        let r = c.result();
        assert_eq!((r.debug_gaps, r.explained, r.unexplained), (1, 1, 1));
    }
}

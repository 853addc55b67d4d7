//! What `latprof serve` publishes after each read of the kernel's tables: the cumulative
//! series per (reason, state) that /metrics renders, and a window of one-second deltas per
//! backtrace that /debug/pprof/offcpu sums. The collection side builds it; HTTP handlers only
//! read the latest published value, so no client holds anything collection needs.
//!
//! Memory stays bounded however many tasks come and go: everything here is keyed by kernel
//! stack id (bounded by `--max-stacks`), series by (reason, state) (bounded by
//! `--max-series`), and the window by its length.
use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use latprof_common::{HIST_BUCKETS, RESERVED_STACKS, RUNQ_STACK};

use crate::{
    collect::Snapshot,
    export::{
        counters::cpu_ticks,
        openmetrics::{Live, Series},
        pprof,
    },
    probe::{KernelFacts, ProbeConfig},
    reasons::Reasons,
    symbols::{Backtrace, Kallsyms},
};

/// The longest profile `/debug/pprof/offcpu?seconds=N` serves, in reads (one a second by
/// default).
pub const WINDOW: usize = MAX_SECONDS as usize;

/// The most `seconds` a profile may ask for.
pub const MAX_SECONDS: u32 = 300;

/// The series label for everything past `--max-series`.
pub const OTHER: &str = "other";

/// One backtrace as it is exposed: function names only, its reason, its state.
#[derive(Debug)]
pub struct Named {
    pub frames: Vec<String>,
    pub reason: String,
    pub state: &'static str,
    /// Index into the series.
    slot: usize,
}

/// What one read added: per backtrace, the sleeps that ended since the read before.
#[derive(Debug, Default)]
pub struct Delta {
    /// CLOCK_MONOTONIC of the read.
    pub taken_ns: u64,
    pub samples: Vec<(Arc<Named>, u64, u64)>,
}

/// The value HTTP handlers read: immutable once published.
#[derive(Debug, Default)]
pub struct Published {
    pub live: Live,
    /// The last reads' deltas, oldest first, at most [`WINDOW`].
    pub window: Vec<Arc<Delta>>,
    /// CLOCK_MONOTONIC and CLOCK_REALTIME of the latest read.
    pub taken_ns: u64,
    pub wall_ns: u64,
}

impl Published {
    /// The profile of the sleeps that ended in the last `seconds` (by the reads that saw them
    /// end), gzipped pprof.
    #[must_use]
    pub fn profile(&self, seconds: u32, now_ns: u64) -> Vec<u8> {
        let span = u64::from(seconds) * 1_000_000_000;
        let since = now_ns.saturating_sub(span);
        let mut merged: HashMap<(&[String], &str), (u64, u64)> = HashMap::new();
        for delta in self.window.iter().filter(|d| d.taken_ns > since) {
            for (named, count, ns) in &delta.samples {
                let e = merged
                    .entry((named.frames.as_slice(), named.reason.as_str()))
                    .or_default();
                e.0 += count;
                e.1 += ns;
            }
        }
        let mut samples: Vec<pprof::Sample<'_>> = merged
            .into_iter()
            .map(|((frames, reason), (count, total_ns))| pprof::Sample {
                frames: frames.iter().map(String::as_str).collect(),
                reason,
                count,
                total_ns,
            })
            .collect();
        samples.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.frames.cmp(&b.frames)));
        let end = self.wall_ns;
        pprof::encode(&samples, end.saturating_sub(span), span)
    }
}

/// Builds [`Published`] values from successive snapshots.
pub struct Accumulator {
    reasons: Reasons,
    depth: usize,
    max_series: usize,
    named: HashMap<u64, Arc<Named>>,
    /// Cumulative numbers per stack id, never decreasing: a read that raced with an exit merge
    /// (and counted a task twice or not at all) neither lowers a counter nor counts twice.
    totals: HashMap<u64, (u64, u64)>,
    hist: HashMap<u64, [u64; HIST_BUCKETS]>,
    /// (reason, state) per series index; a pair keeps its index for the whole run, so a
    /// counter never moves between its own series and "other".
    slots: Vec<(String, &'static str)>,
    slot_of: HashMap<(String, &'static str), usize>,
    folded: HashSet<(String, &'static str)>,
    window: VecDeque<Arc<Delta>>,
    collections: u64,
    mode: &'static str,
    /// At most this many cgroup series, `cgroup="other"` among them.
    max_cgroups: usize,
    /// Cumulative (count, ns) per cgroup id, never decreasing; bounded by the kernel's
    /// per-cgroup table and the live tasks.
    cgroup_totals: HashMap<u64, (u64, u64)>,
    /// The series of each cgroup id; a cgroup keeps its series for the whole run.
    cgroup_slot: HashMap<u64, usize>,
    /// Series names (cgroup names), "other" among them once any was folded.
    cgroup_series: Vec<String>,
    /// Cgroups folded into "other".
    cgroups_folded: u64,
}

/// The default of `--max-cgroups`.
pub const MAX_CGROUPS: usize = 30;

/// A reason as a label: an unnamed first frame (an address) gives no address away.
fn public_reason(reason: String) -> String {
    if reason.starts_with("[0x") {
        "[unknown]".to_owned()
    } else {
        reason
    }
}

impl Accumulator {
    #[must_use]
    pub fn new(reasons: Reasons, depth: usize, max_series: usize, mode: &'static str) -> Self {
        Self {
            reasons,
            depth,
            max_series: max_series.max(2),
            named: HashMap::new(),
            totals: HashMap::new(),
            hist: HashMap::new(),
            slots: Vec::new(),
            slot_of: HashMap::new(),
            folded: HashSet::new(),
            window: VecDeque::with_capacity(WINDOW),
            collections: 0,
            mode,
            max_cgroups: MAX_CGROUPS,
            cgroup_totals: HashMap::new(),
            cgroup_slot: HashMap::new(),
            cgroup_series: Vec::new(),
            cgroups_folded: 0,
        }
    }

    /// At most `n` cgroup series (at least 2: one and "other").
    #[must_use]
    pub fn with_max_cgroups(mut self, n: usize) -> Self {
        self.max_cgroups = n.max(2);
        self
    }

    /// The cgroup series: each cgroup's cumulative numbers under its name, the largest new
    /// ones admitted first while there is room, the rest under "other".
    fn cgroups(&mut self, snap: &Snapshot) -> Vec<(String, u64, u64)> {
        let mut now: HashMap<u64, (u64, u64)> = HashMap::new();
        for (key, rec) in snap.cgroup_records() {
            let e = now.entry(key.cgroup).or_default();
            e.0 += rec.count;
            e.1 += rec.total_ns;
        }
        let mut new: Vec<(u64, u64)> = now
            .iter()
            .filter(|(id, _)| !self.cgroup_slot.contains_key(id))
            .map(|(id, (_, ns))| (*id, *ns))
            .collect();
        new.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (id, _) in new {
            let slot = if self.cgroup_series.len() + 1 < self.max_cgroups {
                self.cgroup_series.push(crate::model::cgroup_name(snap, id));
                self.cgroup_series.len() - 1
            } else {
                self.cgroups_folded += 1;
                if let Some(i) = self.cgroup_series.iter().position(|n| n == OTHER) {
                    i
                } else {
                    self.cgroup_series.push(OTHER.to_owned());
                    self.cgroup_series.len() - 1
                }
            };
            self.cgroup_slot.insert(id, slot);
        }
        for (id, (count, ns)) in now {
            let t = self.cgroup_totals.entry(id).or_default();
            *t = (t.0.max(count), t.1.max(ns));
        }
        let mut out: Vec<(String, u64, u64)> = self
            .cgroup_series
            .iter()
            .map(|name| (name.clone(), 0, 0))
            .collect();
        for (id, (count, ns)) in &self.cgroup_totals {
            let s = &mut out[self.cgroup_slot[id]];
            s.1 += count;
            s.2 += ns;
        }
        out
    }

    fn slot(&mut self, reason: &str, state: &'static str) -> usize {
        if let Some(&i) = self.slot_of.get(&(reason.to_owned(), state)) {
            return i;
        }
        // The last place is kept for "other".
        let key = if self.slots.len() + 1 < self.max_series && reason != OTHER {
            (reason.to_owned(), state)
        } else {
            self.folded.insert((reason.to_owned(), state));
            (OTHER.to_owned(), "SD")
        };
        if let Some(&i) = self.slot_of.get(&key) {
            return i;
        }
        let i = self.slots.len();
        self.slots.push(key.clone());
        self.slot_of.insert(key, i);
        i
    }

    fn named(&mut self, stack: u64, snap: &Snapshot, syms: &Kallsyms) -> Arc<Named> {
        if let Some(n) = self.named.get(&stack) {
            return Arc::clone(n);
        }
        let backtrace = Backtrace::of(
            stack,
            snap.stacks.get(&stack).map(Vec::as_slice),
            syms,
            self.depth,
        );
        let reason = public_reason(self.reasons.reason(&backtrace));
        let state = if stack == RUNQ_STACK {
            "R"
        } else if snap.uninterruptible.contains(&stack) {
            "D"
        } else if stack >= RESERVED_STACKS {
            // The pseudo backtraces (none stored, wakeup hidden) hold both kinds.
            "SD"
        } else {
            "S"
        };
        let slot = self.slot(&reason, state);
        let named = Arc::new(Named {
            frames: backtrace
                .lines()
                .into_iter()
                .map(|f| pprof::public_frame(f).to_owned())
                .collect(),
            reason,
            state,
            slot,
        });
        self.named.insert(stack, Arc::clone(&named));
        named
    }

    /// Takes in one read of the kernel's tables and returns what to publish.
    pub fn update(
        &mut self,
        snap: &Snapshot,
        syms: &Kallsyms,
        kernel: &KernelFacts,
        config: &ProbeConfig,
    ) -> Published {
        let mut delta = Delta {
            taken_ns: snap.taken_ns,
            samples: Vec::new(),
        };
        let mut records: Vec<_> = snap.global_records().into_iter().collect();
        records.sort_unstable_by_key(|(stack, _)| *stack);
        for (stack, rec) in records {
            let named = self.named(stack, snap, syms);
            let total = self.totals.entry(stack).or_default();
            let (dc, dn) = (
                rec.count.saturating_sub(total.0),
                rec.total_ns.saturating_sub(total.1),
            );
            *total = (total.0.max(rec.count), total.1.max(rec.total_ns));
            if dc > 0 {
                delta.samples.push((named, dc, dn));
            }
        }
        for (stack, h) in &snap.histograms {
            // Only backtraces the records named: a histogram's stack may be a kernel thread's
            // alone, whose sleeps stay out of the global table.
            if !self.named.contains_key(stack) {
                continue;
            }
            let acc = self.hist.entry(*stack).or_insert([0; HIST_BUCKETS]);
            for (a, n) in acc.iter_mut().zip(h) {
                *a = (*a).max(u64::from(*n));
            }
        }
        let mut series: Vec<Series> = self
            .slots
            .iter()
            .map(|(reason, state)| Series {
                reason: reason.clone(),
                state,
                count: 0,
                total_ns: 0,
                buckets: [0; HIST_BUCKETS],
            })
            .collect();
        for (stack, (count, ns)) in &self.totals {
            let s = &mut series[self.named[stack].slot];
            s.count += count;
            s.total_ns += ns;
        }
        for (stack, h) in &self.hist {
            let s = &mut series[self.named[stack].slot];
            for (a, n) in s.buckets.iter_mut().zip(h) {
                *a += n;
            }
        }
        if self.window.len() == WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(Arc::new(delta));
        self.collections += 1;
        let cgroups = self.cgroups(snap);
        Published {
            live: Live {
                series,
                folded: self.folded.len() as u64,
                cgroups,
                cgroups_folded: self.cgroups_folded,
                counters: snap.counters.clone(),
                programs: snap.programs.clone(),
                cpus: cpu_ticks(kernel, None, snap),
                collections: self.collections,
                tables: vec![
                    (
                        "tasks",
                        snap.tasks.len() as u64,
                        u64::from(config.max_tasks),
                    ),
                    (
                        "records",
                        snap.global.len() as u64,
                        u64::from(config.max_records),
                    ),
                    (
                        "stacks",
                        snap.stacks.len() as u64,
                        u64::from(config.max_stacks),
                    ),
                ],
                mode: self.mode,
            },
            window: self.window.iter().cloned().collect(),
            taken_ns: snap.taken_ns,
            wall_ns: snap.wall_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use latprof_common::GlobalRecord;
    use prost::Message as _;

    use super::*;
    use crate::{
        export::openmetrics::{Flavor, render_live},
        probe::Mode,
    };

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81200000 T hrtimer_nanosleep
ffffffff81210000 T alpha_wait
ffffffff81220000 T beta_wait
ffffffff81230000 T gamma_wait
ffffffff81300000 T do_syscall_64
ffffffff81400000 T __sched_text_start
ffffffff81401000 T __sched_text_end
ffffffff81401000 T __lock_text_start
ffffffff81402000 T __lock_text_end
";

    /// Stack i: one distinct first frame each (1: hrtimer_nanosleep, a known reason).
    fn snap(records: &[(u64, u64)], t: u64) -> Snapshot {
        let first = [
            0,
            0xffff_ffff_8120_0010,
            0xffff_ffff_8121_0010,
            0xffff_ffff_8122_0010,
            0xffff_ffff_8123_0010,
        ];
        Snapshot {
            mode: Mode::Normal,
            global: records
                .iter()
                .map(|&(stack, count)| {
                    (
                        stack,
                        GlobalRecord {
                            count,
                            total_ns: count * 2_000_000,
                            max_ns: 2_000_000,
                        },
                    )
                })
                .collect(),
            stacks: (1..=4u64)
                .zip(&first[1..])
                .map(|(i, &ip)| (i, vec![ip, 0xffff_ffff_8130_0010]))
                .collect(),
            histograms: [(1, {
                let mut h = [0u32; HIST_BUCKETS];
                h[10] = 7;
                h
            })]
            .into_iter()
            .collect(),
            taken_ns: t * 1_000_000_000,
            wall_ns: t * 1_000_000_000,
            ..Snapshot::default()
        }
    }

    fn update(acc: &mut Accumulator, s: &Snapshot) -> Published {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        acc.update(s, &syms, &KernelFacts::default(), &ProbeConfig::default())
    }

    #[test]
    fn series_fold_into_other_stay_put_and_never_go_down() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 3, "normal");
        let p = update(&mut acc, &snap(&[(1, 10), (2, 1), (3, 1), (4, 1)], 1));
        let names: Vec<&str> = p.live.series.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(
            names,
            ["Application requested delay", "[alpha_wait]", "other"]
        );
        assert_eq!(p.live.series[2].count, 2);
        assert_eq!(p.live.folded, 2);
        assert_eq!(p.live.series[0].buckets[10], 7);
        // A read that missed some of stack 3 (an exit merge in flight) lowers nothing; stack
        // 2 grows.
        let p = update(&mut acc, &snap(&[(1, 10), (2, 5), (3, 0), (4, 1)], 2));
        assert_eq!(p.live.series[1].count, 5);
        assert_eq!(p.live.series[2].count, 2);
        assert_eq!(p.window.len(), 2);
        // Rendered: each series' cumulative buckets end at +Inf.
        let text = render_live(&p.live, Flavor::Prometheus);
        assert!(
            text.contains("latprof_sleeps_total{reason=\"other\",state=\"SD\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("latprof_sleep_duration_seconds_bucket{reason=\"Application requested delay\",state=\"S\",le=\"0.002048\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("le=\"+Inf\"} 7\n"), "{text}");
        assert!(
            text.contains("# TYPE latprof_sleeps_total counter"),
            "{text}"
        );
        let om = render_live(&p.live, Flavor::OpenMetrics);
        assert!(om.contains("# TYPE latprof_sleeps counter"), "{om}");
        assert!(om.ends_with("# EOF\n"));
    }

    #[test]
    fn profiles_cover_the_last_seconds_only() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        update(&mut acc, &snap(&[(1, 10)], 1));
        let p = update(&mut acc, &snap(&[(1, 13), (2, 4)], 2));
        let decode = |gz: Vec<u8>| {
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(gz.as_slice())
                .read_to_end(&mut raw)
                .unwrap();
            pprof::Profile::decode(raw.as_slice()).unwrap()
        };
        // The last second (now: 2.5 s): 3 more nanosleeps and 4 of stack 2.
        let last = decode(p.profile(1, 2_500_000_000));
        let mut counts: Vec<i64> = last.sample.iter().map(|s| s.value[0]).collect();
        counts.sort_unstable();
        assert_eq!(counts, [3, 4]);
        let all = decode(p.profile(300, 2_500_000_000));
        let mut counts: Vec<i64> = all.sample.iter().map(|s| s.value[0]).collect();
        counts.sort_unstable();
        assert_eq!(counts, [4, 13]);
    }

    #[test]
    fn the_window_is_bounded() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        let mut p = Published::default();
        for t in 1..=(WINDOW as u64 + 50) {
            p = update(&mut acc, &snap(&[(1, t)], t));
        }
        assert_eq!(p.window.len(), WINDOW);
    }

    /// Cgroup series: the largest new cgroups admitted while there is room, the rest under
    /// "other", counted; a cgroup's counter never goes down when a read misses some of it.
    #[test]
    fn cgroups_fold_into_other_and_never_go_down() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal").with_max_cgroups(3);
        let with = |cgroups: &[(u64, u64)], t: u64| {
            let mut s = snap(&[(1, 1)], t);
            s.cgroups = cgroups
                .iter()
                .map(|&(id, count)| {
                    (
                        latprof_common::CgroupCause {
                            cgroup: id,
                            stack_id: 1,
                        },
                        GlobalRecord {
                            count,
                            total_ns: count * 1000,
                            max_ns: 1000,
                        },
                    )
                })
                .collect();
            s
        };
        // Three cgroups for two places: the two largest get theirs, the third is "other".
        let p = update(&mut acc, &with(&[(10, 5), (11, 50), (12, 20)], 1));
        assert_eq!(
            p.live.cgroups,
            vec![
                ("cgroup 11".to_owned(), 50, 50_000),
                ("cgroup 12".to_owned(), 20, 20_000),
                ("other".to_owned(), 5, 5_000),
            ]
        );
        assert_eq!(p.live.cgroups_folded, 1);
        let p = update(&mut acc, &with(&[(10, 6), (11, 40), (12, 21), (13, 2)], 2));
        // 11 read lower (a raced read) stays at 50; 10 and 13 come after the room ran out.
        assert_eq!(
            p.live.cgroups,
            vec![
                ("cgroup 11".to_owned(), 50, 50_000),
                ("cgroup 12".to_owned(), 21, 21_000),
                ("other".to_owned(), 8, 8_000),
            ]
        );
        assert_eq!(p.live.cgroups_folded, 2);
        let text = render_live(&p.live, Flavor::OpenMetrics);
        assert!(
            text.contains("latprof_cgroup_sleeps_total{cgroup=\"other\"} 8"),
            "{text}"
        );
    }
}

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

use latprof_common::HIST_BUCKETS;

use crate::{
    collect::Snapshot,
    export::{
        counters::cpu_ticks,
        openmetrics::{Live, Series},
        pprof,
    },
    probe::{KernelFacts, ProbeConfig},
    reasons::Reasons,
    symbols::Kallsyms,
};

/// The reads a window keeps to cover [`MAX_SECONDS`] at one read every `interval` (at least
/// one read).
#[must_use]
pub fn window_reads(interval: std::time::Duration) -> usize {
    let span = std::time::Duration::from_secs(u64::from(MAX_SECONDS));
    let reads = span.as_nanos().div_ceil(interval.as_nanos().max(1));
    usize::try_from(reads).unwrap_or(usize::MAX).max(1)
}

/// The most `seconds` a profile may ask for.
pub const MAX_SECONDS: u32 = 300;

pub use super::cgroup_series::{MAX_CGROUPS, OTHER};

/// The frame that stands for a user backtrace not named by the naming deadline (a large JIT
/// map, a busy CPU): named by a later read once its name comes.
pub const UNNAMED: &str = "[unnamed]";

/// One backtrace as it is exposed: function names only (the kernel's; the user frames' with
/// their files), its reason, its state.
#[derive(Debug)]
pub struct Named {
    pub kernel: Vec<String>,
    pub user: Vec<crate::ustacks::UserFrame>,
    pub reason: String,
    pub state: &'static str,
    /// Index into the series.
    slot: usize,
    /// For a backtrace shown with [`UNNAMED`] user frames: the same backtrace once named. The
    /// reads taken before the name came keep this value, and a profile that spans them shows
    /// their sleeps under the name (one sample, not an unnamed one beside the named).
    later: std::sync::OnceLock<Arc<Named>>,
}

impl Named {
    /// This backtrace as named by now: itself, or its later name.
    fn current(&self) -> &Self {
        self.later.get().map_or(self, |n| n.as_ref())
    }
}

/// What one read added: per backtrace, the sleeps that ended since the read before.
#[derive(Debug, Default)]
pub struct Delta {
    /// CLOCK_MONOTONIC of the read before (0 for the first: since the probe attached).
    pub from_ns: u64,
    /// CLOCK_MONOTONIC of the read.
    pub taken_ns: u64,
    pub samples: Vec<Part>,
    /// With `--chains`: each chain's time that ended since the read before.
    pub chains: Vec<super::chains::ChainPart>,
}

/// A backtrace's sleeps of one thread (`None`: not told) in a read: count and nanoseconds.
pub type Part = (Arc<Named>, Option<Arc<pprof::Thread>>, u64, u64);

/// The value HTTP handlers read: immutable once published.
#[derive(Debug, Default)]
pub struct Published {
    pub live: Live,
    /// The last reads' deltas, oldest first: those of the last [`MAX_SECONDS`] (see
    /// [`window_reads`]).
    pub window: Vec<Arc<Delta>>,
    /// CLOCK_MONOTONIC and CLOCK_REALTIME of the latest read.
    pub taken_ns: u64,
    pub wall_ns: u64,
    /// The kernel's build id (the profiles' kernel mapping; empty: not known).
    pub kernel_build_id: Arc<str>,
    /// The profiles' sample labels (`--profile-labels`).
    pub labels: pprof::Labels,
    /// Whether profiles carry the wait chains' time (`--chains`).
    pub chains: bool,
    /// /metrics of this read, rendered by its first scrape of each flavor.
    pub rendered: super::rendered::Rendered,
}

impl Published {
    /// Where the window reaches back to: it holds every read taken after this
    /// (CLOCK_MONOTONIC).
    #[must_use]
    pub fn window_from_ns(&self) -> u64 {
        self.window.first().map_or(self.taken_ns, |d| d.from_ns)
    }

    /// The profile of the sleeps that the reads taken after `after_ns` (CLOCK_MONOTONIC) saw
    /// end, up to the latest read, gzipped pprof.
    #[must_use]
    pub fn profile(&self, after_ns: u64) -> Vec<u8> {
        type Key = (*const Named, Option<*const pprof::Thread>);
        let mut merged: HashMap<Key, (&Named, Option<&pprof::Thread>, u64, u64)> = HashMap::new();
        for delta in self.window.iter().filter(|d| d.taken_ns > after_ns) {
            for (named, thread, count, ns) in &delta.samples {
                let named = named.current();
                let thread = thread.as_deref();
                let e = merged
                    .entry((std::ptr::from_ref(named), thread.map(std::ptr::from_ref)))
                    .or_insert((named, thread, 0, 0));
                e.2 += count;
                e.3 += ns;
            }
        }
        let mut samples: Vec<pprof::Sample<'_>> = merged
            .into_values()
            .map(|(named, thread, count, total_ns)| pprof::Sample {
                // Innermost first: the kernel's, the user frames outward, the reason.
                frames: named
                    .kernel
                    .iter()
                    .map(|f| pprof::Frame::kernel(f))
                    .chain(named.user.iter().map(pprof::Frame::user))
                    .chain([pprof::Frame::latprof(&named.reason)])
                    .collect(),
                reason: &named.reason,
                state: named.state,
                thread,
                count,
                total_ns,
            })
            .collect();
        samples.sort_by(|a, b| {
            let (fa, fb) = (
                a.frames.iter().map(|f| f.name),
                b.frames.iter().map(|f| f.name),
            );
            b.total_ns
                .cmp(&a.total_ns)
                .then_with(|| fa.cmp(fb))
                .then_with(|| a.thread.cmp(&b.thread))
        });
        // From the first read it holds (or the time asked for) to the latest, in wall time.
        let from = self
            .window
            .iter()
            .find(|d| d.taken_ns > after_ns)
            .map_or(
                after_ns,
                |d| if d.from_ns == 0 { after_ns } else { d.from_ns },
            );
        let span = self.taken_ns.saturating_sub(from);
        let chained = self.chains.then(|| {
            super::chains::chained(
                self.window
                    .iter()
                    .map(|d| (d.taken_ns, d.chains.as_slice())),
                after_ns,
            )
        });
        pprof::encode(
            &samples,
            self.wall_ns.saturating_sub(span),
            span,
            &pprof::Shape {
                kernel_build_id: &self.kernel_build_id,
                labels: self.labels,
                chained: chained.as_deref(),
            },
        )
    }
}

/// Builds [`Published`] values from successive snapshots.
pub struct Accumulator {
    reasons: Reasons,
    depth: usize,
    max_series: usize,
    named: HashMap<u64, Arc<Named>>,
    /// Stack ids whose user backtrace had no name yet when last named (shown as
    /// [`UNNAMED`]): each read names them again until the name comes.
    unnamed: HashSet<u64>,
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
    /// The reads `window` keeps.
    window_len: usize,
    collections: u64,
    mode: &'static str,
    /// The cgroup series (`cgroup_series`).
    cgroups: super::cgroup_series::CgroupSeries,
    /// The profiles' sample labels.
    labels: pprof::Labels,
    /// Each read's sleeps told by thread (the profiles' thread labels).
    threads: super::threads::Threads,
    /// With `--chains`: each read's chained time.
    chains: Option<super::chains::ChainReads>,
}

impl Accumulator {
    #[must_use]
    pub fn new(reasons: Reasons, depth: usize, max_series: usize, mode: &'static str) -> Self {
        Self {
            reasons,
            depth,
            max_series: max_series.max(2),
            named: HashMap::new(),
            unnamed: HashSet::new(),
            totals: HashMap::new(),
            hist: HashMap::new(),
            slots: Vec::new(),
            slot_of: HashMap::new(),
            folded: HashSet::new(),
            window: VecDeque::new(),
            window_len: window_reads(std::time::Duration::from_secs(1)),
            collections: 0,
            mode,
            cgroups: super::cgroup_series::CgroupSeries::default(),
            labels: pprof::Labels::default(),
            threads: super::threads::Threads::default(),
            chains: None,
        }
    }

    /// Reads every `interval`: the window keeps enough of them for the longest profile.
    #[must_use]
    pub fn with_interval(mut self, interval: std::time::Duration) -> Self {
        self.window_len = window_reads(interval);
        self.cgroups.set_interval(interval);
        self
    }

    /// The profiles' sample labels (`--profile-labels`).
    #[must_use]
    pub fn with_labels(mut self, labels: pprof::Labels) -> Self {
        self.labels = labels;
        self
    }

    /// Profiles with the wait chains' time, `levels` deep (`--chains`, `--chain-depth`).
    #[must_use]
    pub fn with_chains(mut self, levels: usize) -> Self {
        self.chains = Some(super::chains::ChainReads::new(levels));
        self
    }

    /// At most `n` cgroup series (at least 2: one and "other").
    #[must_use]
    pub fn with_max_cgroups(mut self, n: usize) -> Self {
        self.cgroups.set_max(n);
        self
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

    /// Backtrace `stack` named (cached). One whose user backtrace has no name yet ends in
    /// [`UNNAMED`] and is named again by each read until the name comes; it keeps its series.
    fn named(&mut self, stack: u64, snap: &Snapshot, syms: &Kallsyms) -> Arc<Named> {
        // With --user-stacks the user frames go on outward from the kernel's (pprof's order:
        // innermost first).
        let unnamed = snap
            .user_parts
            .get(&stack)
            .is_some_and(|u| !snap.user_stacks.contains_key(u));
        let old = self.named.get(&stack);
        // Named once and for all, or not named yet again: as it was.
        if let Some(n) = old
            && (unnamed || !self.unnamed.contains(&stack))
        {
            return Arc::clone(n);
        }
        let old_slot = old.map(|n| n.slot);
        let old_named = old.filter(|_| !unnamed).map(Arc::clone);
        // Named as every view names it; what goes out is what a scraper may see.
        let cause = crate::model::name(stack, snap, syms, &self.reasons, self.depth);
        let reason = pprof::public_reason(&cause.reason).to_owned();
        let state = crate::model::state_of(stack, snap);
        // A series keeps its stacks for the whole run (a counter never moves).
        let slot = match old_slot {
            Some(slot) => slot,
            None => self.slot(&reason, state),
        };
        let user = if unnamed {
            vec![crate::ustacks::UserFrame::marker(UNNAMED)]
        } else {
            cause.user
        };
        let named = Arc::new(Named {
            kernel: cause
                .backtrace
                .lines()
                .into_iter()
                .map(|f| pprof::public_frame(f).to_owned())
                .collect(),
            user,
            reason,
            state,
            slot,
            later: std::sync::OnceLock::new(),
        });
        if let Some(old) = old_named {
            // Named at last: the reads that showed it unnamed show it named from now on.
            let _ = old.later.set(Arc::clone(&named));
        }
        if unnamed {
            self.unnamed.insert(stack);
        } else {
            self.unnamed.remove(&stack);
        }
        self.named.insert(stack, Arc::clone(&named));
        named
    }

    /// What each backtrace added since the read before, told by thread as far as the
    /// tasks' own records and the exited tasks' log go (the rest untold).
    fn parts(&mut self, snap: &Snapshot, syms: &Kallsyms) -> Vec<Part> {
        let mut out = Vec::new();
        let mut records: Vec<_> = snap.global_records().into_iter().collect();
        records.sort_unstable_by_key(|(stack, _)| *stack);
        let threads = self.threads.read(snap, self.labels);
        for (stack, rec) in records {
            let named = self.named(stack, snap, syms);
            let total = self.totals.entry(stack).or_default();
            let (dc, dn) = (
                rec.count.saturating_sub(total.0),
                rec.total_ns.saturating_sub(total.1),
            );
            *total = (total.0.max(rec.count), total.1.max(rec.total_ns));
            if dc == 0 {
                continue;
            }
            let parts = threads.get(&stack).map_or(&[][..], Vec::as_slice);
            let (told, rest) = crate::model::split(dc, dn, parts);
            for (thread, c, n) in told {
                out.push((Arc::clone(&named), Some(Arc::clone(thread)), c, n));
            }
            if rest.0 > 0 || rest.1 > 0 {
                out.push((named, None, rest.0, rest.1));
            }
        }
        out
    }

    /// Takes in one read of the kernel's tables and returns what to publish.
    pub fn update(
        &mut self,
        snap: &Snapshot,
        syms: &Kallsyms,
        kernel: &KernelFacts,
        config: &ProbeConfig,
    ) -> Published {
        let delta = Delta {
            from_ns: self.window.back().map_or(0, |d| d.taken_ns),
            taken_ns: snap.taken_ns,
            samples: self.parts(snap, syms),
            chains: match self.chains.as_mut() {
                Some(c) => c.read(
                    snap,
                    syms,
                    &self.reasons,
                    self.depth,
                    self.labels,
                    &mut self.threads,
                ),
                None => Vec::new(),
            },
        };
        for (stack, h) in &snap.histograms {
            // Only backtraces the records named: the histograms are read after the records, so
            // a backtrace first seen between the two reads waits for the next read.
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
        // Every stack in `totals` and `hist` was named above; a lookup still never panics.
        let series_of = |stack: &u64| self.named.get(stack).map(|n| n.slot);
        for (stack, (count, ns)) in &self.totals {
            if let Some(s) = series_of(stack).and_then(|i| series.get_mut(i)) {
                s.count += count;
                s.total_ns += ns;
            }
        }
        for (stack, h) in &self.hist {
            if let Some(s) = series_of(stack).and_then(|i| series.get_mut(i)) {
                for (a, n) in s.buckets.iter_mut().zip(h) {
                    *a += n;
                }
            }
        }
        while self.window.len() >= self.window_len {
            self.window.pop_front();
        }
        self.window.push_back(Arc::new(delta));
        self.collections += 1;
        let cgroups = self.cgroups.read(snap);
        Published {
            live: Live {
                series,
                folded: self.folded.len() as u64,
                cgroups,
                cgroups_folded: self.cgroups.folded(),
                container_ids: self.cgroups.container_ids().clone(),
                counters: snap.counters.clone(),
                hidden: snap.hidden.clone(),
                programs: snap.programs.clone(),
                cpus: cpu_ticks(kernel, None, snap),
                collections: self.collections,
                tables: super::tables::of(snap, config),
                mode: self.mode,
            },
            window: self.window.iter().cloned().collect(),
            taken_ns: snap.taken_ns,
            wall_ns: snap.wall_ns,
            kernel_build_id: kernel.build_id.as_deref().unwrap_or("").into(),
            labels: self.labels,
            chains: self.chains.is_some(),
            rendered: super::rendered::Rendered::default(),
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
    /// `snap` of cause 1 at `t` whose exited tasks' sleeps are in cgroups: (id, count), each
    /// sleep 1 us.
    fn snap_in_cgroups(cgroups: &[(u64, u64)], t: u64) -> Snapshot {
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
    }

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
        let text = render_live(&p.live, None, Flavor::Prometheus);
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
        let om = render_live(&p.live, None, Flavor::OpenMetrics);
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
        let last = decode(p.profile(1_500_000_000));
        let mut counts: Vec<i64> = last.sample.iter().map(|s| s.value[0]).collect();
        counts.sort_unstable();
        assert_eq!(counts, [3, 4]);
        let all = decode(p.profile(0));
        let mut counts: Vec<i64> = all.sample.iter().map(|s| s.value[0]).collect();
        counts.sort_unstable();
        assert_eq!(counts, [4, 13]);
    }

    /// Parca's pull (9 s every 10 s) and Alloy's (14 s every 15 s), each continuing from its
    /// previous one: over 130 s of reads every second, each with a known number of new
    /// sleeps, the pulled profiles add up to every sleep once, and each says what it spans.
    #[test]
    fn continued_pulls_hold_every_sleep_once() {
        use crate::serve::pulls::Pulls;
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        let pulls = Pulls::default();
        let (mut total, mut pulled) = (0u64, [0i64; 2]);
        let mut spans = [0i64; 2];
        for t in 1..=130u64 {
            // t new sleeps at second t: every read differs.
            total += t;
            let p = update(&mut acc, &snap(&[(1, total)], t));
            for (i, (who, every, seconds)) in [("parca", 10, 9), ("alloy", 15, 14)]
                .into_iter()
                .enumerate()
            {
                // The first pull before any sleep of interest: at the first read.
                if t % every != 0 && t != 1 {
                    continue;
                }
                let now = t * 1_000_000_000 + 300_000_000;
                let span = pulls.next("uid 0", who, seconds, now, p.window_from_ns(), p.taken_ns);
                let mut raw = Vec::new();
                flate2::read::GzDecoder::new(p.profile(span.after_ns).as_slice())
                    .read_to_end(&mut raw)
                    .unwrap();
                let profile = pprof::Profile::decode(raw.as_slice()).unwrap();
                pulled[i] += profile.sample.iter().map(|s| s.value[0]).sum::<i64>();
                if span.continued {
                    spans[i] += profile.duration_nanos;
                }
            }
        }
        // Up to the last pull of each (at 130 s Parca's, at 120 s Alloy's).
        let upto = |last: u64| i64::try_from((1..=last).sum::<u64>()).unwrap();
        assert_eq!(pulled, [upto(130), upto(120)]);
        assert_eq!(spans, [129_000_000_000, 119_000_000_000]);
        assert_eq!(total, 130 * 131 / 2);
    }

    #[test]
    fn the_window_is_bounded() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        let mut p = Published::default();
        let reads = window_reads(std::time::Duration::from_secs(1));
        assert_eq!(reads, 300);
        for t in 1..=(reads as u64 + 50) {
            p = update(&mut acc, &snap(&[(1, t)], t));
        }
        assert_eq!(p.window.len(), reads);
    }

    /// The window covers 300 seconds whatever the interval: 3000 reads at 100 ms, 5 at 60 s.
    #[test]
    fn the_window_covers_the_longest_profile() {
        use std::time::Duration;
        assert_eq!(window_reads(Duration::from_millis(100)), 3000);
        assert_eq!(window_reads(Duration::from_millis(700)), 429);
        assert_eq!(window_reads(Duration::from_secs(60)), 5);
        // Reads every 100 ms for 400 s: a profile of 300 s holds the last 300 s, all of them.
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal")
            .with_interval(Duration::from_millis(100));
        let mut p = Published::default();
        for i in 1..=4000u64 {
            let mut s = snap(&[(1, i)], 0);
            s.taken_ns = i * 100_000_000;
            p = update(&mut acc, &s);
        }
        assert_eq!(p.window.len(), 3000);
        let profile = p.profile(100 * 1_000_000_000);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(profile.as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let decoded = pprof::Profile::decode(raw.as_slice()).unwrap();
        // One sleep a read, 3000 reads in the last 300 s (a window of 300 reads held 300).
        assert_eq!(decoded.sample[0].value[0], 3000);
    }

    /// Cgroup series: the largest new cgroups admitted while there is room, the rest under
    /// "other", counted; a cgroup's counter never goes down when a read misses some of it.
    #[test]
    fn cgroups_fold_into_other_and_never_go_down() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal").with_max_cgroups(3);
        // Three cgroups for two places: the two largest get theirs, the third is "other".
        let p = update(
            &mut acc,
            &snap_in_cgroups(&[(10, 5), (11, 50), (12, 20)], 1),
        );
        assert_eq!(
            p.live.cgroups,
            vec![
                ("cgroup 11".to_owned(), 50, 50_000),
                ("cgroup 12".to_owned(), 20, 20_000),
                ("other".to_owned(), 5, 5_000),
            ]
        );
        assert_eq!(p.live.cgroups_folded, 1);
        let p = update(
            &mut acc,
            &snap_in_cgroups(&[(10, 6), (11, 40), (12, 21), (13, 2)], 2),
        );
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
        let text = render_live(&p.live, None, Flavor::OpenMetrics);
        assert!(
            text.contains("latprof_cgroup_sleeps_total{cgroup=\"other\"} 8"),
            "{text}"
        );
    }
    /// Two cgroups of one name share a series, a cgroup named "other" does not pass for the
    /// folded ones, and one whose path was unknown takes its name once found: no label twice.
    /// A container's series carries its full id (what other tools join on), beside the short
    /// one in its name; another cgroup's has none.
    #[test]
    fn a_container_series_carries_its_full_id() {
        use crate::cgroups::CgroupPath;
        const ID: &str = "4c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        let mut s = snap_in_cgroups(&[(20, 50), (21, 40)], 1);
        for (id, path) in [
            (20, format!("/system.slice/docker-{ID}.scope")),
            (21, "/system.slice/nginx.service".to_owned()),
        ] {
            s.cgroup_paths.insert(
                id,
                CgroupPath {
                    path: Some(path),
                    removed: false,
                },
            );
        }
        let p = update(&mut acc, &s);
        let text = render_live(&p.live, None, Flavor::Prometheus);
        assert!(
            text.contains(&format!(
                "latprof_cgroup_sleeps_total{{cgroup=\"docker:{}\",container_id=\"{ID}\"}} 50",
                &ID[..12]
            )),
            "{text}"
        );
        assert!(
            text.contains("latprof_cgroup_sleeps_total{cgroup=\"nginx.service\"} 40"),
            "{text}"
        );
    }

    /// R10: a removed cgroup kept its series for the whole run: short-lived scopes pushed
    /// every later cgroup into "other" until a restart. Removed and quiet for the grace
    /// period, a series goes and its place is free; "other" never goes back.
    #[test]
    fn removed_cgroups_free_their_series() {
        use crate::cgroups::CgroupPath;
        let grace_reads = 2;
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal")
            .with_max_cgroups(3)
            .with_interval(super::super::retire::GRACE / grace_reads);
        let with = |cgroups: &[(u64, u64)], removed: &[u64], t: u64| {
            let mut s = snap_in_cgroups(cgroups, t);
            s.cgroup_paths = cgroups
                .iter()
                .map(|&(id, _)| {
                    let path = Some(format!("/user.slice/run-{id}.scope"));
                    let removed = removed.contains(&id);
                    (id, CgroupPath { path, removed })
                })
                .collect();
            s
        };
        let labels =
            |p: &Published| -> Vec<String> { p.live.cgroups.iter().map(|c| c.0.clone()).collect() };
        // Two series and "other": 22 is folded.
        let p = update(&mut acc, &with(&[(20, 50), (21, 40), (22, 30)], &[], 1));
        assert_eq!(labels(&p), ["run-20.scope", "run-21.scope", "other"]);
        // 20 and 22 removed: kept while the grace period runs.
        let mut t = 1;
        for _ in 0..grace_reads {
            t += 1;
            let p = update(
                &mut acc,
                &with(&[(20, 50), (21, 41), (22, 30)], &[20, 22], t),
            );
            assert_eq!(
                labels(&p),
                ["run-20.scope", "run-21.scope", "other"],
                "read {t}"
            );
        }
        // Past it: 20's series is gone, 22's count stays in "other", and a new cgroup takes
        // the free place.
        t += 1;
        let p = update(
            &mut acc,
            &with(&[(20, 50), (21, 42), (22, 30), (23, 5)], &[20, 22], t),
        );
        assert_eq!(
            p.live.cgroups,
            vec![
                ("run-21.scope".to_owned(), 42, 42_000),
                ("run-23.scope".to_owned(), 5, 5_000),
                ("other".to_owned(), 30, 30_000),
            ]
        );
        // The retired rows, still in the kernel's table, are not taken in again.
        t += 1;
        let p = update(
            &mut acc,
            &with(&[(20, 51), (21, 42), (22, 30), (23, 6)], &[20, 22], t),
        );
        assert_eq!(labels(&p), ["run-21.scope", "run-23.scope", "other"]);
        // 21 removed, and as its grace period ends a new cgroup of its name comes (a timer's
        // unit run again): the series stays, its counter never goes back.
        for _ in 0..grace_reads {
            t += 1;
            update(
                &mut acc,
                &with(&[(21, 42), (22, 30), (23, 6)], &[21, 22], t),
            );
        }
        t += 1;
        let mut s = with(&[(21, 42), (22, 30), (23, 6), (24, 3)], &[21, 22], t);
        if let Some(p) = s.cgroup_paths.get_mut(&24) {
            p.path = Some("/user.slice/run-21.scope".to_owned());
        }
        let p = update(&mut acc, &s);
        assert_eq!(p.live.cgroups[0], ("run-21.scope".to_owned(), 45, 45_000));
    }

    #[test]
    fn cgroup_labels_are_never_repeated() {
        use crate::cgroups::CgroupPath;
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal").with_max_cgroups(4);
        let with = |cgroups: &[(u64, u64)], paths: &[(u64, &str)], t: u64| {
            let mut s = snap_in_cgroups(cgroups, t);
            s.cgroup_paths = paths
                .iter()
                .map(|&(id, path)| {
                    (
                        id,
                        CgroupPath {
                            path: Some(path.to_owned()),
                            removed: false,
                        },
                    )
                })
                .collect();
            s
        };
        let labels =
            |p: &Published| -> Vec<String> { p.live.cgroups.iter().map(|c| c.0.clone()).collect() };
        // /a/inner and /b/inner: one series; /other: labelled by its path; 40 unknown yet.
        let p = update(
            &mut acc,
            &with(
                &[(20, 50), (21, 40), (22, 30), (40, 20)],
                &[(20, "/a/inner"), (21, "/b/inner"), (22, "/other")],
                1,
            ),
        );
        assert_eq!(
            p.live.cgroups,
            vec![
                ("inner".to_owned(), 90, 90_000),
                ("/other".to_owned(), 30, 30_000),
                ("cgroup 40".to_owned(), 20, 20_000),
            ]
        );
        assert_eq!(p.live.cgroups_folded, 0);
        // 40's path found: its name replaces "cgroup 40"; a new cgroup of a known name joins
        // its series even with no room left; one of a new name is folded.
        let p = update(
            &mut acc,
            &with(
                &[(20, 50), (21, 40), (22, 30), (40, 20), (23, 5), (24, 7)],
                &[
                    (20, "/a/inner"),
                    (21, "/b/inner"),
                    (22, "/other"),
                    (40, "/c/late.service"),
                    (23, "/c/inner"),
                    (24, "/d/new"),
                ],
                2,
            ),
        );
        assert_eq!(labels(&p), ["inner", "/other", "late.service", "other"]);
        assert_eq!(p.live.cgroups[0].1, 95);
        assert_eq!(p.live.cgroups[3].1, 7);
        assert_eq!(p.live.cgroups_folded, 1);
        let text = render_live(&p.live, None, Flavor::Prometheus);
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("latprof_cgroup_sleeps_total{"))
            .map(|l| l.rsplit_once(' ').unwrap().0)
            .collect();
        let distinct: HashSet<&str> = series.iter().copied().collect();
        assert_eq!(series.len(), distinct.len(), "{text}");
    }

    /// A backtrace no rule knows whose first frame has no name: neither /metrics nor the
    /// profile shows its address.
    #[test]
    fn no_kernel_address_goes_out() {
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        let mut s = snap(&[(1, 3), (5, 2)], 1);
        // Below _stext: kallsyms names nothing there.
        s.stacks
            .insert(5, vec![0xffff_ffff_8000_1234, 0xffff_ffff_8130_0010]);
        let p = update(&mut acc, &s);
        assert!(
            p.live.series.iter().any(|x| x.reason == "[unknown]"),
            "{:?}",
            p.live.series
        );
        for flavor in [Flavor::Prometheus, Flavor::OpenMetrics] {
            let text = render_live(&p.live, None, flavor);
            assert!(!text.contains("0x") && !text.contains("ffffffff"), "{text}");
        }
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(p.profile(0).as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let profile = pprof::Profile::decode(raw.as_slice()).unwrap();
        assert!(profile.string_table.iter().any(|t| t == "[unknown]"));
        for t in &profile.string_table {
            assert!(!t.contains("0x") && !t.contains("ffffffff"), "{t}");
        }
    }

    /// `--user-stacks`: a user backtrace the naming deadline left unnamed (a 200 MB perf map,
    /// a busy CPU) is shown as `[unnamed]`, never a panic, and named by the read its name
    /// comes with; its counts stay in their series.
    #[test]
    fn a_user_backtrace_named_late_is_unnamed_until_then() {
        use crate::ustacks::UserFrame;
        let frame = |name: &str| UserFrame {
            name: name.to_owned(),
            module: "/usr/bin/app".to_owned(),
            build_id: String::new(),
            offset: 0x1000,
            named: true,
            start_line: 0,
        };
        let decode = |gz: Vec<u8>| {
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(gz.as_slice())
                .read_to_end(&mut raw)
                .unwrap();
            pprof::Profile::decode(raw.as_slice()).unwrap()
        };
        // The frames of each sample, innermost first.
        let traces = |p: &pprof::Profile| -> Vec<(Vec<String>, i64)> {
            let name = |id: u64| {
                let f = p.function.iter().find(|f| f.id == id).unwrap();
                p.string_table[usize::try_from(f.name).unwrap()].clone()
            };
            let frames = |loc: u64| -> Vec<String> {
                let l = p.location.iter().find(|l| l.id == loc).unwrap();
                l.line.iter().map(|line| name(line.function_id)).collect()
            };
            p.sample
                .iter()
                .map(|s| {
                    (
                        s.location_id.iter().flat_map(|&l| frames(l)).collect(),
                        s.value[0],
                    )
                })
                .collect()
        };
        let mut acc = Accumulator::new(Reasons::builtin(), 12, 300, "normal");
        let mut s = snap(&[(1, 5)], 1);
        s.user_parts = [(1, 100)].into();
        let p = update(&mut acc, &s);
        let text = render_live(&p.live, None, Flavor::Prometheus);
        assert!(
            text.contains(
                "latprof_sleeps_total{reason=\"Application requested delay\",state=\"S\"} 5\n"
            ),
            "{text}"
        );
        let first = traces(&decode(p.profile(0)));
        assert_eq!(first.len(), 1, "{first:?}");
        // The reason is the root frame; the unnamed user frames under it.
        assert_eq!(
            first[0].0.iter().rev().nth(1).map(String::as_str),
            Some(UNNAMED),
            "{first:?}"
        );
        assert_eq!(first[0].1, 5);
        // Still unnamed at the next read: no panic, the counts go on.
        let p = update(&mut acc, &{
            let mut s = snap(&[(1, 7)], 2);
            s.user_parts = [(1, 100)].into();
            s
        });
        assert_eq!(p.live.series[0].count, 7);
        // The name comes: the sleeps are shown with it, in the same series.
        let mut s = snap(&[(1, 10)], 3);
        s.user_parts = [(1, 100)].into();
        s.user_stacks = [(100, vec![frame("wait_for_request"), frame("main")])].into();
        let p = update(&mut acc, &s);
        assert_eq!(p.live.series.len(), 1, "{:?}", p.live.series);
        assert_eq!(p.live.series[0].count, 10);
        let last = traces(&decode(p.profile(2_500_000_000)));
        assert_eq!(last.len(), 1, "{last:?}");
        assert!(
            last[0].0.ends_with(&[
                "wait_for_request".to_owned(),
                "main".to_owned(),
                "Application requested delay".to_owned()
            ]),
            "{last:?}"
        );
        assert_eq!(last[0].1, 3);
        assert!(!last[0].0.iter().any(|f| f == UNNAMED), "{last:?}");
        // A profile over all three reads shows every sleep under the name, the unnamed reads'
        // too: one sample of 10.
        let all = traces(&decode(p.profile(0)));
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].0, last[0].0);
        assert_eq!(all[0].1, 10);
    }

    /// The three views name causes alike: on one snapshot, `stats`' JSON, `top`'s rows (by
    /// reason) and `serve`'s series give each reason the same count.
    #[test]
    fn stats_top_and_serve_name_causes_alike() {
        use std::collections::BTreeMap;

        use crate::{
            export::{Scope, json},
            model::{self, Group, SortKey, ViewContext},
        };
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let reasons = Reasons::builtin();
        let mut snap = snap(&[(1, 10), (2, 3), (3, 2), (4, 1)], 1);
        // A pseudo backtrace too: sleeps whose backtrace was not stored.
        snap.global.push((
            latprof_common::NO_STACK,
            GlobalRecord {
                count: 4,
                total_ns: 4_000,
                max_ns: 1_000,
            },
        ));
        let add = |m: &mut BTreeMap<String, u64>, reason: &str, n: u64| {
            *m.entry(reason.to_owned()).or_default() += n;
        };
        let doc: serde_json::Value = serde_json::from_str(&json::render(&Scope {
            cur: &snap,
            base: None,
            pid: None,
            traced: None,
            syms: &syms,
            reasons: &reasons,
            depth: 12,
            info: None,
            kernel: None,
            chain_depth: 4,
            labels: crate::export::pprof::Labels::default(),
            spikes: &[],
            reader_sleeps: None,
        }))
        .expect("stats' JSON");
        let mut stats = BTreeMap::new();
        for c in doc["causes"].as_array().expect("causes") {
            let reason = c["reason"].as_str().expect("a reason");
            add(&mut stats, reason, c["count"].as_u64().expect("a count"));
        }
        let ctx = ViewContext {
            syms: &syms,
            reasons: &reasons,
            depth: 12,
            group: Group::Reason,
            sort: SortKey::Total,
        };
        let mut top = BTreeMap::new();
        for row in model::rows(&snap.global, &snap, &ctx) {
            add(&mut top, &row.reason, row.count);
        }
        let mut serve = BTreeMap::new();
        let mut acc = Accumulator::new(reasons.clone(), 12, 100, "normal");
        for series in update(&mut acc, &snap).live.series {
            add(&mut serve, &series.reason, series.count);
        }
        assert_eq!(stats.len(), 5, "{stats:?}");
        assert_eq!(stats, top);
        assert_eq!(stats, serve);
    }
}

//! Wait chains (`--chains`): a cause's wait split by what its wakers were doing meanwhile,
//! level by level. The kernel keeps one level per wakeup (`Chain`); a waker's sleep is
//! expanded from that waker cause's own rows (in the waker's process), its parts scaled to the
//! time it stood behind: each level below the first is an average over the waker cause's
//! sleeps, not the exact sleep that overlapped (docs/guide/chains.md).
//!
//! The tree of a wait grows with the wakers of each level: processes that pass work around
//! (each waking each other, at several sites) make it exponential in the depth (24 processes
//! at 5 sites took `stats --chains` past 4 GiB at depth 4). So each part expands at most the
//! `MAX_EXPANDED` largest of its wakers' sleeps, one wait's tree holds at most
//! `MAX_PARTS_PER_WAIT` parts and one `Chains` (one view, export or read) `MAX_PARTS` in all;
//! a sleep past these keeps its time but not its split (`Chains::cut` counts them).

use std::{
    cell::Cell,
    collections::{BTreeMap, HashMap},
};

use latprof_common::{CHAIN_SLEPT, CHAIN_UNCOUNTED, ChainKey, WAKER_OTHER, WAKER_TASK};

use super::{Cause, backtrace_of, user_frames, user_names};
use crate::{
    collect::{Chain, Snapshot, Waker},
    symbols::{Backtrace, Kallsyms},
    ustacks::UserFrame,
};

/// What one part of a wait was.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// The waker slept, at a counted cause (its kernel and user frames).
    Slept {
        backtrace: Backtrace,
        user: Vec<String>,
    },
    /// The waker slept, a sleep latprof did not count (interruptible, over the cutoff).
    SleptUncounted,
    /// The waker waited for a CPU right after its sleep.
    WaitingForCpu,
    /// The waker ran (or waited for a CPU later, preempted).
    Running,
    /// Not woken by a task: a `WAKER_*` kind (timer, interrupt, not seen, table full).
    WokenBy(u32),
    /// Woken by a task whose chain link was not kept (the chain table was full).
    LinkLost,
}

/// One part of a wait, and, for a waker's sleep, its own parts below it.
#[derive(Clone, Debug, PartialEq)]
pub struct Behind {
    /// The waking process and its name (`None` for the parts that have no task).
    pub waker: Option<(u32, String)>,
    pub part: Part,
    /// The part of the top wait's time, in ns.
    pub time_ns: u64,
    /// Sleeps of this level's rows (of the waker cause's own rows below the first level).
    pub count: u64,
    /// `Slept` parts: what that sleep's wakers were doing, down to the depth.
    pub below: Vec<Behind>,
}

impl Behind {
    /// Every part with time of its own, in order: the parts above it (outermost first), the
    /// part, and its own time: what is not split further below it. Below a waker's sleep, the
    /// parts no task woke (a timer, an interrupt) are that sleep's own: it is the leaf.
    #[must_use]
    pub fn leaves(parts: &[Self]) -> Vec<(Vec<&Self>, &Self, u64)> {
        let mut out = Vec::new();
        for p in parts {
            walk(p, &mut Vec::new(), &mut out);
        }
        out
    }
}

type Leaf<'a> = (Vec<&'a Behind>, &'a Behind, u64);

fn walk<'a>(p: &'a Behind, path: &mut Vec<&'a Behind>, out: &mut Vec<Leaf<'a>>) {
    let split = || {
        p.below
            .iter()
            .filter(|b| !matches!(b.part, Part::WokenBy(_)))
    };
    let below: u64 = split().map(|b| b.time_ns).sum();
    if below < p.time_ns {
        out.push((path.clone(), p, p.time_ns - below));
    }
    path.push(p);
    for b in split() {
        walk(b, path, out);
    }
    path.pop();
}

/// One process's cause that tasks, timers or interrupts woke ([`Chains::sleepers`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sleeper {
    pub tgid: u32,
    pub backtrace: Backtrace,
    /// Its user frames' names, innermost first.
    pub user: Vec<String>,
    /// The record ids named so.
    pub ids: Vec<u64>,
}

/// The most of a part's wakers' sleeps split further, the largest first.
pub const MAX_EXPANDED: usize = 8;
/// The most parts of one wait's tree (`Chains::of_ids`).
pub const MAX_PARTS_PER_WAIT: usize = 512;
/// The most parts one `Chains` makes in all its trees.
pub const MAX_PARTS: usize = 16_384;
/// The most bytes the parts of one `Chains` may hold (each part a copy of its waker's frame
/// names): a recording whose names are long (any user may hand `dump` a file) would otherwise
/// make `MAX_PARTS` copies of its longest backtrace.
pub const MAX_PART_BYTES: u64 = 64 << 20;

/// The chain and waker rows of an interval (`cur` less `base`), and how to name causes.
pub struct Chains<'a> {
    snap: &'a Snapshot,
    syms: &'a Kallsyms,
    depth: usize,
    /// Levels expanded (`--chain-depth`).
    levels: usize,
    /// The chain table's rows of the interval.
    rows: Vec<Chain>,
    wakers: Vec<Waker>,
    /// Below the first level, where given: the rows since the collection began (see
    /// [`Chains::deeper_levels_since_start`]).
    deep: Option<(Vec<Chain>, Vec<Waker>)>,
    /// Each record id's (kernel, user) frames, named once.
    named: std::cell::RefCell<HashMap<u64, (Backtrace, Vec<String>)>>,
    /// Parts left to make, in all and in the wait being split.
    left: Cell<usize>,
    left_in_wait: Cell<usize>,
    /// Bytes the parts may still hold (`MAX_PART_BYTES`).
    bytes_left: Cell<u64>,
    /// Sleeps not split for the bounds above (not for the depth).
    cut: Cell<u64>,
}

impl<'a> Chains<'a> {
    #[must_use]
    pub fn new(
        cur: &'a Snapshot,
        base: Option<&Snapshot>,
        syms: &'a Kallsyms,
        depth: usize,
        levels: usize,
    ) -> Self {
        Self {
            snap: cur,
            syms,
            depth,
            levels,
            rows: chains_since(cur, base),
            wakers: super::wakers_since(cur, base, |_| true),
            deep: None,
            named: std::cell::RefCell::default(),
            left: Cell::new(MAX_PARTS),
            left_in_wait: Cell::new(0),
            bytes_left: Cell::new(MAX_PART_BYTES),
            cut: Cell::new(0),
        }
    }

    /// Sleeps of wakers whose parts were not split for the bounds on a tree's size
    /// (`MAX_EXPANDED`, `MAX_PARTS_PER_WAIT`, `MAX_PARTS`), so far.
    #[must_use]
    pub fn cut(&self) -> u64 {
        self.cut.get()
    }

    /// Splits the levels below the first by every row since the collection began, not only
    /// the interval's: for a short interval (one of serve's reads), a waker cause's rows of the
    /// interval are a few sleeps, often not the ones the first level's wait overlapped (they
    /// ended in the read before); the whole run's average is the steadier estimate.
    #[must_use]
    pub fn deeper_levels_since_start(mut self) -> Self {
        self.deep = Some((
            chains_since(self.snap, None),
            super::wakers_since(self.snap, None, |_| true),
        ));
        self
    }

    /// Whether the interval holds any chain row (`--chains` was on).
    #[must_use]
    pub fn any(&self) -> bool {
        !self.rows.is_empty()
    }

    fn named(&self, id: u64) -> (Backtrace, Vec<String>) {
        self.named
            .borrow_mut()
            .entry(id)
            .or_insert_with(|| {
                let user: Vec<UserFrame> = user_frames(self.snap, id, self.depth);
                (
                    backtrace_of(id, self.snap, self.syms, self.depth),
                    user_names(&user),
                )
            })
            .clone()
    }

    /// The parts of the waits of `cause` (of the process `sleeper`, or all), down to the
    /// depth, the largest first.
    #[must_use]
    pub fn of_cause(&self, cause: &Cause, sleeper: Option<u32>) -> Vec<Behind> {
        let key = (cause.backtrace.clone(), user_names(&cause.user));
        let mut ids: Vec<u64> = self
            .wakers
            .iter()
            .map(|w| w.key.cause)
            .filter(|&id| self.named(id) == key)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        self.of_ids(&ids, sleeper)
    }

    /// Each process's causes in the interval that a waker row holds (`--pid`'s process only,
    /// where given): the cause's frames, its process and its record ids, in order.
    #[must_use]
    pub fn sleepers(&self, pid: Option<u32>) -> Vec<Sleeper> {
        let mut by: BTreeMap<(u32, Backtrace, Vec<String>), Vec<u64>> = BTreeMap::new();
        for w in &self.wakers {
            if pid.is_some_and(|p| p != w.key.sleeper_tgid) {
                continue;
            }
            let (backtrace, user) = self.named(w.key.cause);
            let ids = by.entry((w.key.sleeper_tgid, backtrace, user)).or_default();
            if !ids.contains(&w.key.cause) {
                ids.push(w.key.cause);
            }
        }
        by.into_iter()
            .map(|((tgid, backtrace, user), ids)| Sleeper {
                tgid,
                backtrace,
                user,
                ids,
            })
            .collect()
    }

    /// The parts of the waits of the record ids `ids` (of the process `sleeper`, or all),
    /// down to the depth, the largest first.
    #[must_use]
    pub fn of_ids(&self, ids: &[u64], sleeper: Option<u32>) -> Vec<Behind> {
        let total: u64 = self
            .wakers
            .iter()
            .filter(|w| {
                ids.contains(&w.key.cause) && sleeper.is_none_or(|t| t == w.key.sleeper_tgid)
            })
            .map(|w| w.total_ns)
            .sum();
        let mut path = Vec::new();
        self.left_in_wait.set(MAX_PARTS_PER_WAIT);
        self.expand(ids, sleeper, total, 1, &mut path)
    }

    /// The parts of `time` ns of the waits of the record ids `ids` of process `sleeper`
    /// (all: `None`), scaled from their own time, at level `level`.
    fn expand(
        &self,
        ids: &[u64],
        sleeper: Option<u32>,
        time: u64,
        level: usize,
        path: &mut Vec<(Vec<u64>, Option<u32>)>,
    ) -> Vec<Behind> {
        let (own, sums) = self.sums(ids, sleeper, level);
        if own == 0 || time == 0 {
            return Vec::new();
        }
        let scale = |ns: u64| -> u64 {
            u64::try_from(u128::from(ns) * u128::from(time) / u128::from(own)).unwrap_or(u64::MAX)
        };
        let mut out: Vec<(Behind, Vec<u64>)> = sums
            .into_iter()
            .filter(|(_, sum)| sum.ns > 0)
            .map(|((tgid, part), sum)| {
                let Sum {
                    comm,
                    ns,
                    count,
                    ids: waker_ids,
                } = sum;
                let part = Behind {
                    waker: tgid.map(|t| (t, comm)),
                    part,
                    time_ns: scale(ns),
                    count,
                    below: Vec::new(),
                };
                (part, waker_ids)
            })
            .collect();
        out.sort_by(|(a, _), (b, _)| b.time_ns.cmp(&a.time_ns).then_with(|| a.part.cmp(&b.part)));
        self.spend(&out);
        path.push((ids.to_vec(), sleeper));
        let mut expanded = 0;
        for (b, waker_ids) in &mut out {
            let tgid = b.waker.as_ref().map(|w| w.0);
            if !matches!(b.part, Part::Slept { .. })
                || level >= self.levels
                || path.iter().any(|(p, s)| p == waker_ids && *s == tgid)
            {
                continue;
            }
            if expanded >= MAX_EXPANDED
                || self.left.get() == 0
                || self.left_in_wait.get() == 0
                || self.bytes_left.get() == 0
            {
                self.cut.set(self.cut.get() + b.count);
                continue;
            }
            expanded += 1;
            b.below = self.expand(waker_ids, tgid, b.time_ns, level + 1, path);
        }
        path.pop();
        out.into_iter().map(|(b, _)| b).collect()
    }

    /// Counts the parts made against the bounds, and the bytes they hold.
    fn spend(&self, parts: &[(Behind, Vec<u64>)]) {
        let n = parts.len();
        self.left.set(self.left.get().saturating_sub(n));
        self.left_in_wait
            .set(self.left_in_wait.get().saturating_sub(n));
        let held = |s: &str| (s.len() + size_of::<String>()) as u64;
        let bytes: u64 = parts
            .iter()
            .map(|(b, ids)| {
                let names = match &b.part {
                    Part::Slept { backtrace, user } => {
                        backtrace.lines().into_iter().map(held).sum::<u64>()
                            + user.iter().map(|u| held(u)).sum::<u64>()
                    }
                    _ => 0,
                };
                let comm = b.waker.as_ref().map_or(0, |(_, c)| held(c));
                size_of::<Behind>() as u64 + names + comm + (ids.len() * 8) as u64
            })
            .sum();
        self.bytes_left
            .set(self.bytes_left.get().saturating_sub(bytes));
    }
}

/// One part of a level being summed: the waker's name, the part's time and sleeps, and the
/// record ids of the waker's sleeps (`Part::Slept`: the level below).
#[derive(Default)]
struct Sum {
    comm: String,
    ns: u64,
    count: u64,
    ids: Vec<u64>,
}

/// A level's parts by waker process and part.
type Sums = BTreeMap<(Option<u32>, Part), Sum>;

impl Chains<'_> {
    /// The waits of the record ids `ids` of process `sleeper` (all: `None`) at `level`: their
    /// own time, and its parts, unscaled.
    fn sums(&self, ids: &[u64], sleeper: Option<u32>, level: usize) -> (u64, Sums) {
        let (rows, wakers) = match &self.deep {
            Some((rows, wakers)) if level > 1 => (rows, wakers),
            _ => (&self.rows, &self.wakers),
        };
        let ours =
            |cause: u64, tgid: u32| ids.contains(&cause) && sleeper.is_none_or(|t| t == tgid);
        let mut sums = Sums::new();
        let mut add =
            |tgid: Option<u32>, comm: &str, part: Part, ns: u64, n: u64, id: Option<u64>| {
                let e = sums.entry((tgid, part)).or_default();
                if e.comm.is_empty() {
                    comm.clone_into(&mut e.comm);
                }
                e.ns += ns;
                e.count += n;
                if let Some(id) = id.filter(|id| !e.ids.contains(id)) {
                    e.ids.push(id);
                }
            };
        // The sleeps no task woke; a task's have their links below. The waker table's
        // overflow (`WAKER_OTHER`) holds both kinds: its task-woken sleeps have links too.
        let (mut own, mut by_task, mut by_task_n, mut other, mut other_n) = (0, 0, 0, 0, 0);
        for w in wakers
            .iter()
            .filter(|w| ours(w.key.cause, w.key.sleeper_tgid))
        {
            own += w.total_ns;
            match w.key.kind {
                WAKER_TASK => {
                    by_task += w.total_ns;
                    by_task_n += w.count;
                }
                WAKER_OTHER => {
                    other += w.total_ns;
                    other_n += w.count;
                }
                kind => add(None, "", Part::WokenBy(kind), w.total_ns, w.count, None),
            }
        }
        let (mut linked, mut linked_n) = (0u64, 0u64);
        for c in rows
            .iter()
            .filter(|c| ours(c.key.cause, c.key.sleeper_tgid))
        {
            linked += c.total_ns;
            linked_n += c.count;
            let waker = Some(c.key.waker_tgid);
            match c.key.link {
                CHAIN_SLEPT => {
                    let (backtrace, user) = self.named(c.key.waker_cause);
                    let part = Part::Slept { backtrace, user };
                    add(
                        waker,
                        &c.comm,
                        part,
                        c.behind_ns,
                        c.count,
                        Some(c.key.waker_cause),
                    );
                }
                CHAIN_UNCOUNTED => {
                    add(
                        waker,
                        &c.comm,
                        Part::SleptUncounted,
                        c.behind_ns,
                        c.count,
                        None,
                    );
                }
                _ => {}
            }
            add(
                waker,
                &c.comm,
                Part::WaitingForCpu,
                c.runq_ns,
                c.count,
                None,
            );
            let ran = c.total_ns.saturating_sub(c.behind_ns + c.runq_ns);
            add(waker, &c.comm, Part::Running, ran, c.count, None);
        }
        // Links beyond the known task wakers' sleeps are of sleeps in the overflow; sleeps of
        // task wakers without links lost theirs (the chain table was full).
        let extra = linked.saturating_sub(by_task);
        if other > extra {
            let n = other_n.saturating_sub(linked_n.saturating_sub(by_task_n));
            add(None, "", Part::WokenBy(WAKER_OTHER), other - extra, n, None);
        }
        if by_task > linked {
            let n = by_task_n.saturating_sub(linked_n);
            add(None, "", Part::LinkLost, by_task - linked, n, None);
        }
        (own, sums)
    }
}

/// The chain rows of `cur` less `base`'s, empty ones dropped.
#[must_use]
pub fn chains_since(cur: &Snapshot, base: Option<&Snapshot>) -> Vec<Chain> {
    let before: HashMap<ChainKey, &Chain> = base
        .map(|b| b.chains.iter().map(|c| (c.key, c)).collect())
        .unwrap_or_default();
    cur.chains
        .iter()
        .filter_map(|c| {
            let b = before.get(&c.key);
            let count = c.count.saturating_sub(b.map_or(0, |b| b.count));
            (count > 0).then(|| Chain {
                count,
                total_ns: c.total_ns.saturating_sub(b.map_or(0, |b| b.total_ns)),
                behind_ns: c.behind_ns.saturating_sub(b.map_or(0, |b| b.behind_ns)),
                runq_ns: c.runq_ns.saturating_sub(b.map_or(0, |b| b.runq_ns)),
                ..c.clone()
            })
        })
        .collect()
}

/// A part's label as text views and folded lines show it: the waker first where there is one.
#[must_use]
pub fn part_label(b: &Behind, reason: impl Fn(&Backtrace) -> String) -> String {
    let who = b
        .waker
        .as_ref()
        .map(|(tgid, comm)| format!("{comm} [{tgid}]"));
    let what = match &b.part {
        Part::Slept { backtrace, user } => match user.first() {
            Some(site) => format!("{} ({site})", reason(backtrace)),
            None => reason(backtrace),
        },
        Part::SleptUncounted => "slept (not counted: over the cutoff)".to_owned(),
        Part::WaitingForCpu => "waiting for a CPU".to_owned(),
        Part::Running => "running".to_owned(),
        Part::WokenBy(kind) => format!(
            "woken by {}",
            super::WakerId {
                kind: *kind,
                tgid: 0,
                tid: 0
            }
            .label("")
        ),
        Part::LinkLost => "woken by a task: link not kept (chain table full)".to_owned(),
    };
    match who {
        Some(who) => format!("{who}: {what}"),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use latprof_common::{CHAIN_RAN, WAKER_TIMER, WakerKey};

    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81200000 T hrtimer_nanosleep
ffffffff81300000 T pipe_read
ffffffff81500000 T futex_wait
ffffffff81600000 T zzz_end
";

    fn waker(cause: u64, sleeper: u32, kind: u32, total_ns: u64, count: u64) -> Waker {
        Waker {
            key: WakerKey {
                cause,
                sleeper_tgid: sleeper,
                kind,
                waker_tgid: u32::from(kind == WAKER_TASK),
                ..WakerKey::default()
            },
            count,
            total_ns,
            max_ns: 0,
            comm: String::new(),
        }
    }

    fn chain(
        cause: u64,
        sleeper: u32,
        waker: u32,
        link: u32,
        waker_cause: u64,
        (count, total, behind, runq): (u64, u64, u64, u64),
        comm: &str,
    ) -> Chain {
        Chain {
            key: ChainKey {
                cause,
                waker_cause,
                sleeper_tgid: sleeper,
                waker_tgid: waker,
                link,
                pad: 0,
            },
            count,
            total_ns: total,
            behind_ns: behind,
            runq_ns: runq,
            comm: comm.to_owned(),
        }
    }

    /// A (pid 10, futex: id 5) behind B (pid 20, pipe: id 6) behind C (pid 30, nanosleep:
    /// id 7), which a timer ends; B's pipe waits are half behind C's sleep.
    fn snapshot() -> Snapshot {
        let mut snap = Snapshot::default();
        snap.stacks.insert(5, vec![0xffff_ffff_8150_0010]);
        snap.stacks.insert(6, vec![0xffff_ffff_8130_0010]);
        snap.stacks.insert(7, vec![0xffff_ffff_8120_0010]);
        snap.wakers = vec![
            waker(5, 10, WAKER_TASK, 1_000, 10),
            waker(6, 20, WAKER_TASK, 2_000, 10),
            waker(7, 30, WAKER_TIMER, 900, 10),
        ];
        snap.chains = vec![
            chain(5, 10, 20, CHAIN_SLEPT, 6, (10, 1_000, 800, 100), "b"),
            chain(6, 20, 30, CHAIN_SLEPT, 7, (8, 1_600, 1_000, 0), "c"),
            chain(6, 20, 30, CHAIN_RAN, 0, (2, 400, 0, 0), "c"),
        ];
        snap
    }

    #[test]
    fn levels_are_joined_and_scaled_to_the_time_above() {
        let snap = snapshot();
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let chains = Chains::new(&snap, None, &syms, 12, 4);
        let parts = chains.of_ids(&[5], Some(10));
        // A's 1000 ns: 800 behind B's pipe wait, 100 B waiting for a CPU, 100 B running.
        let times: Vec<(Part, u64)> = parts.iter().map(|p| (p.part.clone(), p.time_ns)).collect();
        assert_eq!(times.iter().map(|t| t.1).sum::<u64>(), 1_000);
        assert_eq!(times[0].1, 800);
        assert!(matches!(times[0].0, Part::Slept { .. }));
        assert!(times.contains(&(Part::WaitingForCpu, 100)));
        assert!(times.contains(&(Part::Running, 100)));
        // B's pipe waits (2000 ns) are 1000 behind C: half of the 800 A waited behind them.
        let pipe = &parts[0];
        assert_eq!(pipe.waker, Some((20, "b".to_owned())));
        let below: Vec<(Part, u64)> = pipe
            .below
            .iter()
            .map(|p| (p.part.clone(), p.time_ns))
            .collect();
        assert_eq!(below.iter().map(|t| t.1).sum::<u64>(), 800);
        assert_eq!(below[0].1, 400);
        assert!(below.contains(&(Part::Running, 400)));
        // C's nanosleep: the timer woke it, all of it.
        let nap = &pipe.below[0];
        assert_eq!(nap.below.len(), 1);
        assert_eq!(nap.below[0].part, Part::WokenBy(WAKER_TIMER));
        assert_eq!(nap.below[0].time_ns, 400);
        // The leaves: C's nanosleep (the timer's part is its own), C running, B waiting for a
        // CPU, B running.
        let leaves = Behind::leaves(&parts);
        let own: u64 = leaves.iter().map(|l| l.2).sum();
        assert_eq!(own, 1_000);
        let (path, leaf, ns) = &leaves[0];
        assert_eq!((path.len(), *ns), (1, 400));
        assert!(matches!(leaf.part, Part::Slept { .. }));
    }

    #[test]
    fn the_depth_stops_the_join() {
        let snap = snapshot();
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let parts = Chains::new(&snap, None, &syms, 12, 1).of_ids(&[5], Some(10));
        assert!(parts.iter().all(|p| p.below.is_empty()));
        let parts = Chains::new(&snap, None, &syms, 12, 2).of_ids(&[5], Some(10));
        assert_eq!(parts[0].below[0].below.len(), 0);
    }

    fn depth(b: &[Behind]) -> usize {
        b.iter().map(|p| 1 + depth(&p.below)).max().unwrap_or(0)
    }

    fn parts(b: &[Behind]) -> usize {
        b.iter().map(|p| 1 + parts(&p.below)).sum()
    }

    /// R11: 24 processes each woken by each other's sleeps (a token passed around) made a
    /// tree of 24^depth parts: at depth 4, a million; at 16, never done.
    #[test]
    fn a_mesh_of_wakers_stays_bounded_at_any_depth() {
        let n = 24u32;
        let snap = mesh(n);
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        for levels in [4, 16] {
            let chains = Chains::new(&snap, None, &syms, 12, levels);
            let tree = chains.of_ids(&[1_000], Some(100));
            // One level of every waker's three parts past the bound, at most.
            let made = parts(&tree);
            assert!(
                made <= MAX_PARTS_PER_WAIT + 3 * n as usize,
                "depth {levels}: {made} parts"
            );
            assert!(depth(&tree) > 2, "still split below the first level");
            assert!(chains.cut() > 0, "the sleeps not split are counted");
            // The first level's time is the wait's, whatever was cut below.
            let top: u64 = tree.iter().map(|b| b.time_ns).sum();
            assert_eq!(top, 1_000_000);
            // Every sleeper's tree in one Chains: bounded in all.
            let all: usize = (0..n)
                .map(|i| parts(&chains.of_ids(&[1_000 + u64::from(i)], Some(100 + i))))
                .sum();
            assert!(all <= MAX_PARTS + MAX_PARTS_PER_WAIT, "{all} parts");
        }
    }

    /// The bytes the parts hold are bounded too: with 64 KiB to hold, every sleeper's tree of
    /// the mesh splits no further once they are spent (a level's parts past it, at most).
    #[test]
    fn the_parts_bytes_are_bounded() {
        let n = 24u32;
        let snap = mesh(n);
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let trees = |chains: &Chains<'_>| -> usize {
            (0..n)
                .map(|i| parts(&chains.of_ids(&[1_000 + u64::from(i)], Some(100 + i))))
                .sum()
        };
        let whole = Chains::new(&snap, None, &syms, 12, 16);
        let unbounded = trees(&whole);
        let small = Chains::new(&snap, None, &syms, 12, 16);
        small.bytes_left.set(64 << 10);
        let bounded = trees(&small);
        assert_eq!(small.bytes_left.get(), 0);
        assert!(small.cut() > 0, "the sleeps left whole are counted");
        assert!(
            bounded * 4 < unbounded,
            "{bounded} parts with 64 KiB, {unbounded} without"
        );
    }

    /// `n` processes that each wake all the others, at one cause each.
    fn mesh(n: u32) -> Snapshot {
        let mut snap = Snapshot::default();
        for i in 0..n {
            let id = 1_000 + u64::from(i);
            snap.stacks.insert(id, vec![0xffff_ffff_8130_0010]);
            snap.wakers
                .push(waker(id, 100 + i, WAKER_TASK, 1_000_000, 100));
            for j in (0..n).filter(|&j| j != i) {
                snap.chains.push(chain(
                    id,
                    100 + i,
                    100 + j,
                    CHAIN_SLEPT,
                    1_000 + u64::from(j),
                    (4, 40_000, 30_000, 1_000),
                    "p",
                ));
            }
        }
        snap
    }

    #[test]
    fn a_cycle_is_not_followed() {
        let mut snap = snapshot();
        // B's pipe waits behind A's futex waits, which are behind B's pipe waits.
        snap.chains
            .push(chain(6, 20, 10, CHAIN_SLEPT, 5, (1, 10, 10, 0), "a"));
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let parts = Chains::new(&snap, None, &syms, 12, 16).of_ids(&[5], Some(10));
        assert!(depth(&parts) <= 3, "{parts:#?}");
    }
}

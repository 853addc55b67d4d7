//! Wakers: who ended the sleeps of a cause (task, interrupt, timer), as lines and per row.

use std::collections::HashMap;

use latprof_common::{
    GlobalRecord, WAKER_HARDIRQ, WAKER_NMI, WAKER_OTHER, WAKER_SOFTIRQ, WAKER_TASK, WAKER_TIMER,
    WakerKey, waker_kind_name,
};

use super::{Row, backtrace_of};
use crate::{
    collect::{Snapshot, Waker},
    symbols::{Backtrace, Kallsyms},
};

/// Who ended sleeps, as views name it: a task (kind `WAKER_TASK`, with its ids) or a kind of
/// interrupt, or none seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WakerId {
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
}

impl WakerId {
    #[must_use]
    pub fn of(key: &WakerKey) -> Self {
        Self {
            kind: key.kind,
            tgid: key.waker_tgid,
            tid: key.waker_tid,
        }
    }

    /// The kind as exports write it.
    #[must_use]
    pub fn kind_name(self) -> &'static str {
        waker_kind_name(self.kind)
    }

    /// `comm [tgid/tid]` for a task (`comm [tgid]` for a process's main thread), the kind of
    /// interrupt otherwise.
    #[must_use]
    pub fn label(self, comm: &str) -> String {
        match self.kind {
            WAKER_TASK if self.tid == self.tgid => format!("{comm} [{}]", self.tgid),
            WAKER_TASK => format!("{comm} [{}/{}]", self.tgid, self.tid),
            WAKER_TIMER => "interrupt: timer".to_owned(),
            WAKER_HARDIRQ => "interrupt: hardirq".to_owned(),
            WAKER_SOFTIRQ => "interrupt: softirq".to_owned(),
            WAKER_NMI => "interrupt: NMI".to_owned(),
            WAKER_OTHER => "other wakers (table full)".to_owned(),
            _ => "waker not seen".to_owned(),
        }
    }
}

/// One waker's share of a set of sleeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WakerLine {
    pub id: WakerId,
    pub comm: String,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// By the waker's backtrace (`--waker-stacks`; empty without): raw stack id, count,
    /// total.
    pub stacks: Vec<(u64, GlobalRecord)>,
}

impl WakerLine {
    #[must_use]
    pub fn label(&self) -> String {
        self.id.label(&self.comm)
    }
}

/// The waker table's entries since `base` that `keep` keeps, empty ones dropped.
#[must_use]
pub fn wakers_since(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    keep: impl Fn(&WakerKey) -> bool,
) -> Vec<Waker> {
    let before: HashMap<WakerKey, &Waker> = base
        .map(|b| {
            b.wakers
                .iter()
                .filter(|w| keep(&w.key))
                .map(|w| (w.key, w))
                .collect()
        })
        .unwrap_or_default();
    cur.wakers
        .iter()
        .filter(|w| keep(&w.key))
        .filter_map(|w| {
            let b = before.get(&w.key);
            let count = w.count.saturating_sub(b.map_or(0, |b| b.count));
            (count > 0).then(|| Waker {
                count,
                total_ns: w.total_ns.saturating_sub(b.map_or(0, |b| b.total_ns)),
                ..w.clone()
            })
        })
        .collect()
}

/// Wakers grouped by who woke (over causes, sleepers and waker backtraces), the most sleep
/// time ended first.
#[must_use]
pub fn waker_lines<'a>(wakers: impl IntoIterator<Item = &'a Waker>) -> Vec<WakerLine> {
    let mut by_id: HashMap<WakerId, WakerLine> = HashMap::new();
    for w in wakers {
        let id = WakerId::of(&w.key);
        let line = by_id.entry(id).or_insert_with(|| WakerLine {
            id,
            comm: w.comm.clone(),
            count: 0,
            total_ns: 0,
            max_ns: 0,
            stacks: Vec::new(),
        });
        if line.comm.is_empty() {
            line.comm.clone_from(&w.comm);
        }
        line.count += w.count;
        line.total_ns += w.total_ns;
        line.max_ns = line.max_ns.max(w.max_ns);
        if w.key.waker_stack != 0 {
            match line
                .stacks
                .iter_mut()
                .find(|(s, _)| *s == w.key.waker_stack)
            {
                Some((_, r)) => r.add(w.count, w.total_ns, w.max_ns),
                None => line.stacks.push((
                    w.key.waker_stack,
                    GlobalRecord {
                        count: w.count,
                        total_ns: w.total_ns,
                        max_ns: w.max_ns,
                    },
                )),
            }
        }
    }
    let mut out: Vec<WakerLine> = by_id.into_values().collect();
    for line in &mut out {
        line.stacks
            .sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
    }
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| b.count.cmp(&a.count))
            .then_with(|| a.id.cmp(&b.id))
    });
    out
}

/// The wakers of a row's sleeps (of one process with `sleeper`), since `base`.
#[must_use]
pub fn row_wakers(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    row: &Row,
    sleeper: Option<u32>,
) -> Vec<WakerLine> {
    let wakers = wakers_since(cur, base, |k| {
        row.stacks.contains(&k.cause) && sleeper.is_none_or(|t| t == k.sleeper_tgid)
    });
    waker_lines(&wakers)
}

/// The wakers of each cause (named as [`causes`] names them), of one process with
/// `sleeper`, since `base`.
#[must_use]
pub fn cause_wakers(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    sleeper: Option<u32>,
    syms: &Kallsyms,
    depth: usize,
) -> HashMap<Backtrace, Vec<WakerLine>> {
    let wakers = wakers_since(cur, base, |k| sleeper.is_none_or(|t| t == k.sleeper_tgid));
    let mut by_cause: HashMap<Backtrace, Vec<Waker>> = HashMap::new();
    for w in wakers {
        by_cause
            .entry(backtrace_of(w.key.cause, cur, syms, depth))
            .or_default()
            .push(w);
    }
    by_cause
        .into_iter()
        .map(|(b, ws)| (b, waker_lines(&ws)))
        .collect()
}

/// A waker backtrace's frames, innermost first (the wakeup function first).
#[must_use]
pub fn waker_frames(snap: &Snapshot, stack: u64, syms: &Kallsyms, depth: usize) -> Vec<String> {
    match snap.stacks.get(&stack) {
        Some(raw) if stack != latprof_common::NO_STACK => syms.waker_frames(raw, depth),
        _ => vec![Backtrace::UNAVAILABLE.to_owned()],
    }
}

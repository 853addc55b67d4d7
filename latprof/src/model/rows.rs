//! Rows: the causes of a selection since a base snapshot, grouped and sorted, with each row's
//! traces, processes and histogram.

use std::collections::{HashMap, HashSet};

use latprof_common::GlobalRecord;

use super::{name, user_names, user_site};
use crate::{
    collect::Snapshot,
    reasons::Reasons,
    symbols::{Backtrace, Kallsyms},
};

/// Every global cause's record since `base` (the whole run without one).
#[must_use]
pub fn global_since(cur: &Snapshot, base: Option<&Snapshot>) -> Vec<(u64, GlobalRecord)> {
    since(
        cur.global_records(),
        base.map(Snapshot::global_records).as_ref(),
    )
}

/// One live process's records (its threads summed) since `base`.
#[must_use]
pub fn process_since(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    tgid: u32,
) -> Vec<(u64, GlobalRecord)> {
    selection_since(cur, base, tgid, None)
}

/// One process's (or with `tid`, one thread's) records since `base`, threads summed.
fn selection_since(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    tgid: u32,
    tid: Option<u32>,
) -> Vec<(u64, GlobalRecord)> {
    let mut merged: HashMap<u64, GlobalRecord> = HashMap::new();
    for task in cur
        .tasks
        .iter()
        .filter(|t| t.tgid == tgid && tid.is_none_or(|tid| t.tid == tid))
    {
        for (stack, r) in task_since(cur, base, task.tid) {
            merged
                .entry(stack)
                .or_default()
                .add(r.count, r.total_ns, r.max_ns);
        }
    }
    let mut out: Vec<_> = merged.into_iter().collect();
    out.sort_by_key(|(stack, _)| *stack);
    out
}

/// How causes are grouped into rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Group {
    /// One row per human reason.
    #[default]
    Reason,
    /// One row per backtrace.
    Backtrace,
}

/// Which column rows are sorted by (largest first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Total,
    Max,
    Count,
    Average,
}

impl SortKey {
    #[must_use]
    pub fn next(self) -> Self {
        match self {
            Self::Total => Self::Max,
            Self::Max => Self::Count,
            Self::Count => Self::Average,
            Self::Average => Self::Total,
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Total => "total",
            Self::Max => "max",
            Self::Count => "count",
            Self::Average => "average",
        }
    }

    pub(super) fn key(self, count: u64, total_ns: u64, max_ns: u64) -> u64 {
        match self {
            Self::Total => total_ns,
            Self::Max => max_ns,
            Self::Count => count,
            Self::Average => total_ns.checked_div(count).unwrap_or(0),
        }
    }
}

/// One distinct backtrace of a row: the kernel's frames and the sleeper's user frames under
/// them (`--user-stacks`), both innermost first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Trace {
    pub kernel: Backtrace,
    /// Empty without user frames; a last `[truncated]` marks a backtrace cut short.
    pub user: Vec<String>,
}

/// One row of a causes table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// What the row shows: the reason (and the user frame it waits in, where there are user
    /// frames), or the backtrace (kernel, then user frames).
    pub label: String,
    pub reason: String,
    /// The distinct backtraces in this row.
    pub backtraces: Vec<Trace>,
    /// The kernel stack ids in this row.
    pub stacks: Vec<u64>,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

impl Row {
    #[must_use]
    pub fn average_ns(&self) -> u64 {
        self.total_ns.checked_div(self.count).unwrap_or(0)
    }
}

/// What views are computed with.
pub struct ViewContext<'a> {
    pub syms: &'a Kallsyms,
    pub reasons: &'a Reasons,
    pub depth: usize,
    pub group: Group,
    pub sort: SortKey,
}

pub(super) fn minus(cur: GlobalRecord, base: Option<&GlobalRecord>) -> GlobalRecord {
    match base {
        Some(b) => GlobalRecord {
            count: cur.count.saturating_sub(b.count),
            total_ns: cur.total_ns.saturating_sub(b.total_ns),
            // A maximum cannot be subtracted: it stays the maximum since latprof started.
            max_ns: cur.max_ns,
        },
        None => cur,
    }
}

/// Records of `cur` less those of `base` (the moment of the last reset), empty ones dropped.
#[must_use]
#[expect(
    clippy::implicit_hasher,
    reason = "every record map in latprof uses the standard hasher"
)]
pub fn since(
    cur: HashMap<u64, GlobalRecord>,
    base: Option<&HashMap<u64, GlobalRecord>>,
) -> Vec<(u64, GlobalRecord)> {
    let mut out: Vec<_> = cur
        .into_iter()
        .map(|(stack, rec)| (stack, minus(rec, base.and_then(|b| b.get(&stack)))))
        .filter(|(_, rec)| rec.count > 0)
        .collect();
    out.sort_by_key(|(stack, _)| *stack);
    out
}

/// The records of one live task (by tid) as a map.
#[must_use]
pub fn task_records(snap: &Snapshot, tid: u32) -> HashMap<u64, GlobalRecord> {
    let mut out = HashMap::new();
    if let Some(task) = snap.tasks.iter().find(|t| t.tid == tid) {
        task.add_records_to(&mut out);
    }
    out
}

/// One live task's records since the baseline.
pub(super) fn task_since(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    tid: u32,
) -> Vec<(u64, GlobalRecord)> {
    let base_records = base.map(|b| task_records(b, tid));
    since(task_records(cur, tid), base_records.as_ref())
}

/// Rows from records: named, grouped, sorted.
#[must_use]
pub fn rows(records: &[(u64, GlobalRecord)], snap: &Snapshot, ctx: &ViewContext<'_>) -> Vec<Row> {
    // Each row's distinct backtraces, also as a set: a row of thousands of backtraces (a
    // recording may hold them, all of one reason) compared each new one with every one before.
    let mut by_label: HashMap<String, (Row, HashSet<Trace>)> = HashMap::new();
    for (stack, rec) in records {
        let cause = name(*stack, snap, ctx.syms, ctx.reasons, ctx.depth);
        let reason = cause.reason;
        // Causes that differ only in their user frames are rows of their own: by the frame
        // they wait in beside the reason, or by the whole user backtrace after the kernel's
        // (innermost first, as folded stacks read from the right).
        let label = match ctx.group {
            Group::Reason => match user_site(snap, *stack, ctx.depth) {
                Some(site) => format!("{reason} in {site}"),
                None => reason.clone(),
            },
            Group::Backtrace if cause.user.is_empty() => cause.backtrace.join(" "),
            Group::Backtrace => {
                format!(
                    "{} | {}",
                    cause.backtrace.join(" "),
                    user_names(&cause.user).join(" ")
                )
            }
        };
        let (row, traces) = by_label.entry(label.clone()).or_insert_with(|| {
            let row = Row {
                label,
                reason,
                ..Row::default()
            };
            (row, HashSet::new())
        });
        let trace = Trace {
            kernel: cause.backtrace,
            user: user_names(&cause.user),
        };
        if traces.insert(trace.clone()) {
            row.backtraces.push(trace);
        }
        row.stacks.push(*stack);
        row.count += rec.count;
        row.total_ns += rec.total_ns;
        row.max_ns = row.max_ns.max(rec.max_ns);
    }
    let mut out: Vec<Row> = by_label.into_values().map(|(row, _)| row).collect();
    out.sort_by(|a, b| {
        ctx.sort
            .key(b.count, b.total_ns, b.max_ns)
            .cmp(&ctx.sort.key(a.count, a.total_ns, a.max_ns))
            .then_with(|| a.label.cmp(&b.label))
    });
    out
}

/// The causes of one process (all its threads) or, with `tid`, of one thread.
#[must_use]
pub fn selection_rows(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    ctx: &ViewContext<'_>,
    tgid: u32,
    tid: Option<u32>,
) -> Vec<Row> {
    rows(&selection_since(cur, base, tgid, tid), cur, ctx)
}

/// The latency histogram of a row (all CPUs, since the baseline).
#[must_use]
pub fn row_histogram(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    row: &Row,
) -> latprof_common::Histogram {
    let mut out = [0u32; latprof_common::HIST_BUCKETS];
    for stack in &row.stacks {
        if let Some(h) = cur.histograms.get(stack) {
            let b = base.and_then(|b| b.histograms.get(stack));
            for (i, n) in h.iter().enumerate() {
                out[i] = out[i].saturating_add(n.saturating_sub(b.map_or(0, |b| b[i])));
            }
        }
    }
    out
}

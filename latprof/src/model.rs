//! Snapshot -> what a view shows: causes named by their frames, merged and sorted.
use std::collections::{HashMap, HashSet};

use latprof_common::{
    GlobalRecord, RUNQ_STACK, WAKER_HARDIRQ, WAKER_NMI, WAKER_OTHER, WAKER_SOFTIRQ, WAKER_TASK,
    WAKER_TIMER, WakerKey, waker_kind_name,
};

use crate::{
    collect::{Snapshot, Spike, Waker},
    reasons::Reasons,
    symbols::{Backtrace, Kallsyms},
};

/// One cause as a user sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub backtrace: Backtrace,
    /// With `--user-stacks`: the sleeper's user frames, innermost first (empty: none).
    pub user: Vec<String>,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// Names each stack id's cause and merges ids whose cause frames are the same (two raw stacks
/// that differ only in the dropped frames are one cause). Sorted by total, largest first.
#[must_use]
pub fn causes(
    records: impl IntoIterator<Item = (u64, GlobalRecord)>,
    snap: &Snapshot,
    syms: &Kallsyms,
    depth: usize,
) -> Vec<Cause> {
    let mut merged: HashMap<(Backtrace, Vec<String>), GlobalRecord> = HashMap::new();
    for (stack, rec) in records {
        let backtrace = Backtrace::of(
            stack,
            snap.stacks.get(&stack).map(Vec::as_slice),
            syms,
            depth,
        );
        merged
            .entry((backtrace, user_frames(snap, stack, depth)))
            .or_default()
            .add(rec.count, rec.total_ns, rec.max_ns);
    }
    let mut out: Vec<Cause> = merged
        .into_iter()
        .map(|((backtrace, user), r)| Cause {
            backtrace,
            user,
            count: r.count,
            total_ns: r.total_ns,
            max_ns: r.max_ns,
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.backtrace.cmp(&b.backtrace))
            .then_with(|| a.user.cmp(&b.user))
    });
    out
}

/// The user frames of record id `stack` (`--user-stacks`), at most `depth`; empty without.
/// A backtrace not named yet shows its addresses' count only as unnamed.
#[must_use]
pub fn user_frames(snap: &Snapshot, stack: u64, depth: usize) -> Vec<String> {
    let Some(user) = snap.user_parts.get(&stack) else {
        return Vec::new();
    };
    snap.user_stacks.get(user).map_or_else(
        || vec!["[user frames not named yet]".to_owned()],
        |frames| frames.iter().take(depth).map(|f| f.name.clone()).collect(),
    )
}

/// The user frame a row is titled by (`--user-stacks`): the innermost one outside the C
/// runtime (libc, the dynamic loader, the vDSO), where the program itself waits (`read` says
/// little; `wait_for_request` says which wait); the innermost frame where all are in the
/// runtime; none without user frames. Only among the `depth` frames the detail shows.
#[must_use]
pub fn user_site(snap: &Snapshot, stack: u64, depth: usize) -> Option<String> {
    site_of(snap.user_stacks.get(snap.user_parts.get(&stack)?)?, depth)
}

/// `user_site` of named user frames.
#[must_use]
pub fn site_of(frames: &[crate::ustacks::UserFrame], depth: usize) -> Option<String> {
    let mut shown = frames.iter().take(depth).filter(|f| !f.is_truncated());
    let innermost = shown.clone().next();
    shown
        .find(|f| !in_runtime(&f.module))
        .or(innermost)
        .map(|f| f.name.clone())
}

/// Whether a user frame's file is the C runtime's, which every program waits through.
fn in_runtime(module: &str) -> bool {
    const RUNTIME: [&str; 6] = [
        "libc.",
        "libc-",
        "libpthread",
        "ld-linux",
        "ld-musl",
        "ld64.",
    ];
    let file = module.rsplit('/').next().unwrap_or(module);
    file == "[vdso]" || RUNTIME.iter().any(|p| file.starts_with(p))
}

/// A spike's reason, from the backtraces a snapshot (or a recording) holds.
#[must_use]
pub fn spike_reason(
    spike: &Spike,
    snap: &Snapshot,
    syms: &Kallsyms,
    reasons: &Reasons,
    depth: usize,
) -> String {
    let raw = snap.stacks.get(&spike.stack_id).map(Vec::as_slice);
    let reason = reasons.reason(&Backtrace::of(spike.stack_id, raw, syms, depth));
    // With --user-stacks: where in the program (as rows are titled).
    match user_site(snap, spike.stack_id, depth) {
        Some(site) => format!("{reason} in {site}"),
        None => reason,
    }
}

/// The global table: sleep causes and run-queue latency.
#[must_use]
pub fn global_causes(snap: &Snapshot, syms: &Kallsyms, depth: usize) -> Vec<Cause> {
    causes(snap.global_records(), snap, syms, depth)
}

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

/// The causes of one live process: its threads' records summed (/proc/PID/latency).
#[must_use]
pub fn process_causes(snap: &Snapshot, tgid: u32, syms: &Kallsyms, depth: usize) -> Vec<Cause> {
    let records = snap
        .tasks
        .iter()
        .filter(|t| t.tgid == tgid)
        .flat_map(|t| t.records.iter())
        .map(|r| {
            (
                r.stack_id,
                GlobalRecord {
                    count: r.count,
                    total_ns: r.total_ns,
                    max_ns: r.max_ns,
                },
            )
        })
        .collect::<Vec<_>>();
    causes(records, snap, syms, depth)
}

// ---- views for top (and replay): Snapshot x baseline -> rows ----

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

    fn key(self, count: u64, total_ns: u64, max_ns: u64) -> u64 {
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

fn minus(cur: GlobalRecord, base: Option<&GlobalRecord>) -> GlobalRecord {
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
fn task_since(cur: &Snapshot, base: Option<&Snapshot>, tid: u32) -> Vec<(u64, GlobalRecord)> {
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
        let cause = causes([(*stack, *rec)], snap, ctx.syms, ctx.depth);
        let Some(cause) = cause.into_iter().next() else {
            continue;
        };
        let reason = ctx.reasons.reason(&cause.backtrace);
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
                format!("{} | {}", cause.backtrace.join(" "), cause.user.join(" "))
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
            user: cause.user,
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

/// One line of the processes pane: a process, or one of its threads when expanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcLine {
    pub tgid: u32,
    /// Set for a thread line.
    pub tid: Option<u32>,
    pub comm: String,
    pub threads: usize,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The reason with the largest total.
    pub top: String,
    /// The name of the cgroup its threads slept most in (empty where unknown).
    pub cgroup: String,
}

/// A process's threads: (tid, command, records since the baseline).
type Threads = Vec<(u32, String, Vec<(u64, GlobalRecord)>)>;

/// Processes (threads folded in, `expanded` ones followed by their threads) matching `filter`
/// (a pid, or part of a command name), sorted like the causes.
#[must_use]
pub fn processes(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    ctx: &ViewContext<'_>,
    filter: &str,
    expanded: &std::collections::BTreeSet<u32>,
    cgroup: Option<u64>,
) -> Vec<ProcLine> {
    let filter = filter.trim().to_lowercase();
    // A number is a pid (or a thread's id), never part of a name: `top --pid 1` showed every
    // kernel thread with a 1 in its name (ksoftirqd/1, migration/1, ...).
    let by_id = !filter.is_empty() && filter.bytes().all(|b| b.is_ascii_digit());
    let mut by_tgid: std::collections::BTreeMap<u32, Threads> = std::collections::BTreeMap::new();
    let mut cgroup_of: HashMap<u32, u64> = HashMap::new();
    for task in &cur.tasks {
        let main = task.main_cgroup();
        if cgroup.is_some_and(|id| id != main) {
            continue;
        }
        let records = task_since(cur, base, task.tid);
        if records.is_empty() {
            continue;
        }
        if task.tid == task.tgid || !cgroup_of.contains_key(&task.tgid) {
            cgroup_of.insert(task.tgid, main);
        }
        by_tgid
            .entry(task.tgid)
            .or_default()
            .push((task.tid, task.comm.clone(), records));
    }
    let cgroup_name = |tgid: u32| -> String {
        match cgroup_of.get(&tgid) {
            Some(&id) if id != 0 => cgroup_name(cur, id),
            _ => String::new(),
        }
    };
    let line =
        |tgid: u32, tid: Option<u32>, comm: &str, threads: usize, recs: &[(u64, GlobalRecord)]| {
            let rows = rows(
                recs,
                cur,
                &ViewContext {
                    group: Group::Reason,
                    sort: SortKey::Total,
                    ..*ctx
                },
            );
            ProcLine {
                tgid,
                tid,
                comm: comm.to_owned(),
                threads,
                count: rows.iter().map(|r| r.count).sum(),
                total_ns: rows.iter().map(|r| r.total_ns).sum(),
                max_ns: rows.iter().map(|r| r.max_ns).max().unwrap_or(0),
                top: rows.first().map(|r| r.reason.clone()).unwrap_or_default(),
                cgroup: cgroup_name(tgid),
            }
        };
    let mut procs = Vec::new();
    for (tgid, threads) in &by_tgid {
        // The process is named after its main thread when that one is known.
        let comm = threads
            .iter()
            .find(|(tid, _, _)| tid == tgid)
            .unwrap_or(&threads[0])
            .1
            .clone();
        let matches = filter.is_empty()
            || tgid.to_string() == filter
            || threads.iter().any(|(tid, c, _)| {
                tid.to_string() == filter || (!by_id && c.to_lowercase().contains(&filter))
            });
        if !matches {
            continue;
        }
        let all: Vec<(u64, GlobalRecord)> = threads.iter().flat_map(|t| t.2.clone()).collect();
        let mut merged: HashMap<u64, GlobalRecord> = HashMap::new();
        for (stack, r) in all {
            merged
                .entry(stack)
                .or_default()
                .add(r.count, r.total_ns, r.max_ns);
        }
        let merged: Vec<_> = merged.into_iter().collect();
        let mut lines = vec![line(*tgid, None, &comm, threads.len(), &merged)];
        if expanded.contains(tgid) {
            for (tid, c, recs) in threads {
                lines.push(line(*tgid, Some(*tid), c, 1, recs));
            }
        }
        procs.push(lines);
    }
    procs.sort_by(|a, b| {
        ctx.sort
            .key(b[0].count, b[0].total_ns, b[0].max_ns)
            .cmp(&ctx.sort.key(a[0].count, a[0].total_ns, a[0].max_ns))
            .then_with(|| a[0].tgid.cmp(&b[0].tgid))
    });
    procs.into_iter().flatten().collect()
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

/// Which live processes contribute to a row: (tgid, comm, count, total, max), largest first.
#[must_use]
pub fn row_processes(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    row: &Row,
) -> Vec<(u32, String, GlobalRecord)> {
    let mut by_tgid: std::collections::BTreeMap<u32, (String, GlobalRecord)> =
        std::collections::BTreeMap::new();
    for task in &cur.tasks {
        for (stack, r) in task_since(cur, base, task.tid) {
            if row.stacks.contains(&stack) {
                let e = by_tgid
                    .entry(task.tgid)
                    .or_insert_with(|| (task.comm.clone(), GlobalRecord::default()));
                if task.tid == task.tgid {
                    e.0.clone_from(&task.comm);
                }
                e.1.add(r.count, r.total_ns, r.max_ns);
            }
        }
    }
    let mut out: Vec<_> = by_tgid
        .into_iter()
        .map(|(tgid, (comm, r))| (tgid, comm, r))
        .collect();
    out.sort_by(|a, b| b.2.total_ns.cmp(&a.2.total_ns).then_with(|| a.0.cmp(&b.0)));
    out
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

#[cfg(test)]
mod tests {
    use latprof_common::{LatencyRecord, NO_STACK};

    use super::*;
    use crate::{collect::TaskSnapshot, probe::Mode};

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81100000 T trace_stub
ffffffff81200000 T hrtimer_nanosleep
ffffffff81300000 T pipe_read
ffffffff81400000 T __sched_text_start
ffffffff81400010 T schedule
ffffffff81401000 T __sched_text_end
";

    fn rec(stack_id: u64, count: u64, total_ns: u64, max_ns: u64) -> LatencyRecord {
        LatencyRecord {
            stack_id,
            count,
            total_ns,
            max_ns,
            cgroup: 0,
        }
    }

    fn task(tid: u32, tgid: u32, kthread: bool, records: Vec<LatencyRecord>) -> TaskSnapshot {
        TaskSnapshot {
            tid,
            tgid,
            comm: "t".into(),
            kthread,
            records,
            task_only: 0,
        }
    }

    fn snapshot(mode: Mode) -> Snapshot {
        let mut snap = Snapshot {
            mode,
            skip_kthreads: true,
            ..Snapshot::default()
        };
        // Stacks 1 and 2 differ only in the tracing frame above the scheduler: one cause.
        snap.stacks.insert(
            1,
            vec![
                0xffff_ffff_8110_0000,
                0xffff_ffff_8140_0020,
                0xffff_ffff_8120_0010,
            ],
        );
        snap.stacks
            .insert(2, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8120_0010]);
        snap.stacks
            .insert(3, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8130_0010]);
        snap.global = vec![(
            1,
            GlobalRecord {
                count: 2,
                total_ns: 4_000,
                max_ns: 3_000,
            },
        )];
        snap.tasks = vec![
            task(
                10,
                10,
                false,
                vec![rec(2, 1, 5_000, 5_000), rec(3, 4, 400, 100)],
            ),
            task(11, 10, false, vec![rec(3, 1, 100, 100)]),
            task(2, 2, true, vec![rec(3, 100, 100_000, 1_000)]),
        ];
        snap
    }

    #[test]
    fn lazy_global_is_merged_plus_live_user_tasks() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let causes = global_causes(&snapshot(Mode::Lazy), &syms, 12);
        assert_eq!(
            causes,
            vec![
                Cause {
                    user: Vec::new(),
                    backtrace: Backtrace::Frames(vec!["hrtimer_nanosleep".into()]),
                    count: 3,
                    total_ns: 9_000,
                    max_ns: 5_000
                },
                Cause {
                    user: Vec::new(),
                    backtrace: Backtrace::Frames(vec!["pipe_read".into()]),
                    count: 5,
                    total_ns: 500,
                    max_ns: 100
                },
            ]
        );
    }

    #[test]
    fn normal_global_is_the_kernel_table() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let causes = global_causes(&snapshot(Mode::Normal), &syms, 12);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].count, 2);
    }

    /// A record accounted while its task had no memory map (an exiting task after exit_mm) is
    /// the task's own: in its process's causes, not in lazy mode's live global view.
    #[test]
    fn task_only_records_stay_out_of_the_global_view() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut snap = snapshot(Mode::Lazy);
        // Thread 11's second record: the same stack as a global one, accounted without mm.
        snap.tasks[1].records.push(rec(3, 7, 700, 100));
        snap.tasks[1].task_only = 0b10;
        let pipe = |causes: &[Cause]| {
            causes
                .iter()
                .find(|c| c.backtrace.lines() == ["pipe_read"])
                .map(|c| c.count)
        };
        assert_eq!(pipe(&global_causes(&snap, &syms, 12)), Some(5));
        assert_eq!(pipe(&process_causes(&snap, 10, &syms, 12)), Some(12));
    }

    #[test]
    fn kernel_threads_count_when_asked_for() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut snap = snapshot(Mode::Lazy);
        snap.skip_kthreads = false;
        let causes = global_causes(&snap, &syms, 12);
        assert_eq!(causes[0].backtrace.lines(), ["pipe_read"]);
        assert_eq!(causes[0].count, 105);
    }

    #[test]
    fn process_causes_sum_threads() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let causes = process_causes(&snapshot(Mode::Lazy), 10, &syms, 12);
        assert_eq!(causes[0].backtrace.lines(), ["hrtimer_nanosleep"]);
        assert_eq!(causes[1].count, 5);
        assert_eq!(process_causes(&snapshot(Mode::Lazy), 99, &syms, 12), []);
    }

    fn user_frame(name: &str, module: &str) -> crate::ustacks::UserFrame {
        crate::ustacks::UserFrame {
            name: name.into(),
            module: module.into(),
            build_id: String::new(),
            offset: 0x1000,
            named: true,
        }
    }

    /// Stack ids 10 and 11: one kernel backtrace (pipe_read), two user backtraces (the
    /// server's two waits on a pipe, through libc's read); 12: the same kernel backtrace
    /// without user frames; 13: every frame in libc, then cut short.
    fn user_snapshot() -> (Snapshot, Vec<(u64, GlobalRecord)>) {
        let mut snap = Snapshot::default();
        for id in [10, 11, 12, 13] {
            snap.stacks
                .insert(id, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8130_0010]);
        }
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        snap.user_parts = [(10, 100), (11, 101), (13, 103)].into();
        snap.user_stacks = [
            (
                100,
                vec![
                    user_frame("__GI___libc_read", libc),
                    user_frame("wait_for_request", "/tmp/server"),
                    user_frame("serve_requests", "/tmp/server"),
                    user_frame("main", "/tmp/server"),
                ],
            ),
            (
                101,
                vec![
                    user_frame("__GI___libc_read", libc),
                    user_frame("read_config", "/tmp/server"),
                    user_frame("main", "/tmp/server"),
                ],
            ),
            (
                103,
                vec![
                    user_frame("__lll_lock_wait", libc),
                    user_frame("__pthread_mutex_lock", libc),
                    crate::ustacks::UserFrame::truncated(),
                ],
            ),
        ]
        .into();
        let rec = |n| GlobalRecord {
            count: n,
            total_ns: n * 1000,
            max_ns: 1000,
        };
        let records = vec![(10, rec(4)), (11, rec(3)), (12, rec(2)), (13, rec(1))];
        (snap, records)
    }

    /// Causes that differ only in their user frames are rows of their own, titled by the
    /// frame outside libc they wait in; rows without user frames keep the bare reason.
    #[test]
    fn user_frames_tell_rows_apart() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let reasons = Reasons::builtin();
        let (snap, records) = user_snapshot();
        let ctx = |group| ViewContext {
            syms: &syms,
            reasons: &reasons,
            depth: 12,
            group,
            sort: SortKey::Total,
        };
        let by_reason = rows(&records, &snap, &ctx(Group::Reason));
        let labels: Vec<&str> = by_reason.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "Waiting for a pipe in wait_for_request",
                "Waiting for a pipe in read_config",
                "Waiting for a pipe",
                // All in libc: its innermost frame; the truncation mark is no frame.
                "Waiting for a pipe in __lll_lock_wait",
            ]
        );
        assert!(by_reason.iter().all(|r| r.reason == "Waiting for a pipe"));
        assert_eq!(
            by_reason[0].backtraces,
            [Trace {
                kernel: Backtrace::Frames(vec!["pipe_read".into()]),
                user: vec![
                    "__GI___libc_read".into(),
                    "wait_for_request".into(),
                    "serve_requests".into(),
                    "main".into()
                ],
            }]
        );
        assert_eq!(by_reason[2].backtraces[0].user, Vec::<String>::new());
        assert_eq!(
            by_reason[3].backtraces[0].user,
            ["__lll_lock_wait", "__pthread_mutex_lock", "[truncated]"]
        );
        let by_backtrace = rows(&records, &snap, &ctx(Group::Backtrace));
        let labels: Vec<&str> = by_backtrace.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "pipe_read | __GI___libc_read wait_for_request serve_requests main",
                "pipe_read | __GI___libc_read read_config main",
                "pipe_read",
                "pipe_read | __lll_lock_wait __pthread_mutex_lock [truncated]",
            ]
        );
        // The site is among the frames shown: at depth 1, only libc's read.
        let shallow = ViewContext {
            depth: 1,
            ..ctx(Group::Reason)
        };
        assert_eq!(
            rows(&records[..1], &snap, &shallow)[0].label,
            "Waiting for a pipe in __GI___libc_read"
        );
    }

    #[test]
    fn missing_stacks_stay_visible() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut snap = snapshot(Mode::Normal);
        snap.global = vec![(
            NO_STACK,
            GlobalRecord {
                count: 1,
                total_ns: 7,
                max_ns: 7,
            },
        )];
        assert_eq!(
            global_causes(&snap, &syms, 12)[0].backtrace,
            Backtrace::Unavailable
        );
    }
}

/// A cgroup's name as people know it, from the snapshot's paths (`cgroup ID` if unknown).
#[must_use]
pub fn cgroup_name(snap: &Snapshot, id: u64) -> String {
    snap.cgroup_paths
        .get(&id)
        .and_then(|p| p.path.as_deref())
        .map_or_else(|| format!("cgroup {id}"), crate::cgroups::readable_name)
}

/// The latency histogram of a row in one cgroup (live snapshots keep them per cgroup;
/// recordings only summed, and then this is empty).
#[must_use]
pub fn row_histogram_in(
    cur: &Snapshot,
    base: Option<&Snapshot>,
    row: &Row,
    cgroup: u64,
) -> latprof_common::Histogram {
    let mut out = [0u32; latprof_common::HIST_BUCKETS];
    for stack in &row.stacks {
        let key = latprof_common::CgroupCause {
            cgroup,
            stack_id: *stack,
        };
        if let Some(h) = cur.cgroup_histograms.get(&key) {
            let b = base.and_then(|b| b.cgroup_histograms.get(&key));
            for (i, n) in h.iter().enumerate() {
                out[i] = out[i].saturating_add(n.saturating_sub(b.map_or(0, |b| b[i])));
            }
        }
    }
    out
}

/// One cgroup's sleeps over an interval, its causes by stack id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRow {
    pub id: u64,
    /// How people know it (`nginx.service`, `docker:0123456789ab`, `cgroup 1234` if never
    /// seen in the file system).
    pub name: String,
    pub path: Option<String>,
    /// Gone from the file system since latprof saw it.
    pub removed: bool,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub records: Vec<(u64, GlobalRecord)>,
}

/// Each cgroup's records in `cur` less `base`'s, the cgroups with the most latency first;
/// `runq` keeps the run-queue waits.
#[must_use]
pub fn cgroups_since(cur: &Snapshot, base: Option<&Snapshot>, runq: bool) -> Vec<CgroupRow> {
    let before = base.map(Snapshot::cgroup_records);
    let mut rows: std::collections::BTreeMap<u64, CgroupRow> = std::collections::BTreeMap::new();
    for (key, rec) in cur.cgroup_records() {
        if !runq && key.stack_id == RUNQ_STACK {
            continue;
        }
        let rec = minus(rec, before.as_ref().and_then(|b| b.get(&key)));
        if rec.count == 0 {
            continue;
        }
        let row = rows.entry(key.cgroup).or_insert_with(|| {
            let place = cur.cgroup_paths.get(&key.cgroup);
            CgroupRow {
                id: key.cgroup,
                name: cgroup_name(cur, key.cgroup),
                path: place.and_then(|p| p.path.clone()),
                removed: place.is_some_and(|p| p.removed),
                count: 0,
                total_ns: 0,
                max_ns: 0,
                records: Vec::new(),
            }
        });
        row.count += rec.count;
        row.total_ns += rec.total_ns;
        row.max_ns = row.max_ns.max(rec.max_ns);
        row.records.push((key.stack_id, rec));
    }
    let mut out: Vec<CgroupRow> = rows.into_values().collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.id.cmp(&b.id)));
    out
}

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
        let backtrace = Backtrace::of(
            w.key.cause,
            cur.stacks.get(&w.key.cause).map(Vec::as_slice),
            syms,
            depth,
        );
        by_cause.entry(backtrace).or_default().push(w);
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

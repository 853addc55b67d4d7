//! Processes: each process's sleeps since a base snapshot, and the processes behind a row.

use std::collections::HashMap;

use latprof_common::GlobalRecord;

use super::{Group, Row, SortKey, ViewContext, cgroup_name, rows, rows::task_since};
use crate::collect::Snapshot;

type Threads = Vec<(u32, String, Vec<(u64, GlobalRecord)>)>;

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

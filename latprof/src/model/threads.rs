//! A window's sleeps told by process and thread (pprof's `pid` and `thread_name` labels): the
//! live tasks' own records since the base, and the exited tasks' sums (`collect::exits`) less
//! what the base saw of those tasks while they lived. The tables give each cause's sum; the
//! parts found here are split out of it ([`split`]), and what no part explains (a task whose
//! exit its log missed, a sleep that ended while the tables were read) goes out untold.

use std::collections::{BTreeMap, HashMap};

use latprof_common::GlobalRecord;

use crate::collect::{ExitKey, Snapshot, TaskSnapshot};

/// Whose sleeps a part is: a thread name in a process, in a cgroup.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThreadKey {
    pub tgid: u32,
    pub name: String,
    pub cgroup: u64,
}

/// What `threads` compares a snapshot with: the base's live tasks and exited tasks' sums.
#[derive(Clone, Debug, Default)]
pub struct ThreadBase {
    tasks: HashMap<u32, TaskSnapshot>,
    exited: std::sync::Arc<BTreeMap<ExitKey, GlobalRecord>>,
}

impl ThreadBase {
    /// What of `snap` a later window is compared with (its tasks kept to the global view).
    #[must_use]
    pub fn of(snap: &Snapshot) -> Self {
        Self {
            tasks: global_tasks(snap).map(|t| (t.tid, t.clone())).collect(),
            exited: std::sync::Arc::clone(&snap.exited),
        }
    }
}

/// The tasks whose records the global view takes.
fn global_tasks(snap: &Snapshot) -> impl Iterator<Item = &TaskSnapshot> {
    snap.tasks
        .iter()
        .filter(move |t| !(t.records.is_empty() || t.kthread && snap.skip_kthreads))
}

/// Signed sums while parts are added and taken away.
#[derive(Default)]
struct Acc {
    count: i128,
    total_ns: i128,
}

/// By record id, the sleeps of the window from `base` (`None`: since the collection began) to
/// `cur` that are told by thread, each cause's parts in key order.
#[must_use]
pub fn threads(
    cur: &Snapshot,
    base: Option<&ThreadBase>,
) -> HashMap<u64, Vec<(ThreadKey, GlobalRecord)>> {
    let empty = ThreadBase::default();
    let base = base.unwrap_or(&empty);
    let mut acc: BTreeMap<(u64, ThreadKey), Acc> = BTreeMap::new();
    let mut add = |stack: u64, key: ThreadKey, count: u64, ns: u64, sign: i128| {
        let a = acc.entry((stack, key)).or_default();
        a.count += sign * i128::from(count);
        a.total_ns += sign * i128::from(ns);
    };
    let key = |tgid: u32, name: &str, cgroup: u64| ThreadKey {
        tgid,
        name: name.to_owned(),
        cgroup,
    };
    // A task whose records did not change adds nothing: most tasks, most reads.
    let unchanged: std::collections::HashSet<u32> = global_tasks(cur)
        .filter(|t| {
            base.tasks.get(&t.tid).is_some_and(|b| {
                b.records == t.records && b.task_only == t.task_only && b.comm == t.comm
            })
        })
        .map(|t| t.tid)
        .collect();
    // What a task lived with at the base was the base's, whether it lives on (in `cur`) or
    // exited since (its whole sum then in the exited tasks', if its exit was logged).
    let tasks = [
        (global_tasks(cur).collect::<Vec<_>>(), 1),
        (base.tasks.values().collect(), -1),
    ];
    for (list, sign) in tasks {
        for t in list.into_iter().filter(|t| !unchanged.contains(&t.tid)) {
            for rec in t.global_records() {
                let k = key(t.tgid, &t.comm, rec.cgroup);
                add(rec.stack_id, k, rec.count, rec.total_ns, sign);
            }
        }
    }
    // The exited sums where the two ends differ (most keys are the same at both: a dead
    // process's sums never change).
    let (now, then) = (&cur.exited, &base.exited);
    let changed = now
        .iter()
        .filter(|(k, rec)| then.get(k) != Some(rec))
        .map(|(k, rec)| (k, rec, 1))
        .chain(
            then.iter()
                .filter(|(k, rec)| now.get(k) != Some(rec))
                .map(|(k, rec)| (k, rec, -1)),
        );
    for (k, rec, sign) in changed.filter(|(k, _, _)| k.tgid != ExitKey::UNTOLD) {
        let key = key(k.tgid, &k.thread_name(), k.cgroup);
        add(k.stack_id, key, rec.count, rec.total_ns, sign);
    }
    let mut out: HashMap<u64, Vec<(ThreadKey, GlobalRecord)>> = HashMap::new();
    for ((stack, key), a) in acc {
        // A part less than nothing (a task renamed, an exit the log missed) tells nothing.
        if a.count <= 0 {
            continue;
        }
        let rec = GlobalRecord {
            count: u64::try_from(a.count).unwrap_or(u64::MAX),
            total_ns: u64::try_from(a.total_ns.max(0)).unwrap_or(u64::MAX),
            max_ns: 0,
        };
        out.entry(stack).or_default().push((key, rec));
    }
    out
}

/// The parts told (each with its count and nanoseconds) and the rest untold.
pub type Split<'a, K> = (Vec<(&'a K, u64, u64)>, (u64, u64));

/// Splits a cause's sleeps in the window (`count`, `total_ns`) into its parts told by thread,
/// in order, and what is left untold: the parts never add up to more than the cause.
#[must_use]
pub fn split<K>(count: u64, total_ns: u64, parts: &[(K, GlobalRecord)]) -> Split<'_, K> {
    let (mut count, mut total_ns) = (count, total_ns);
    let mut told = Vec::new();
    for (key, rec) in parts {
        if count == 0 {
            break;
        }
        let c = rec.count.min(count);
        let n = if c == count {
            total_ns
        } else {
            rec.total_ns.min(total_ns)
        };
        told.push((key, c, n));
        count -= c;
        total_ns -= n;
    }
    (told, (count, total_ns))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use latprof_common::{GlobalRecord, LatencyRecord};

    use super::*;
    use crate::collect::{ExitKey, Snapshot, TaskSnapshot};

    fn rec(stack_id: u64, count: u64) -> LatencyRecord {
        LatencyRecord {
            stack_id,
            count,
            total_ns: count * 10,
            max_ns: 10,
            cgroup: 5,
        }
    }

    fn task(tid: u32, comm: &str, records: Vec<LatencyRecord>) -> TaskSnapshot {
        TaskSnapshot {
            tid,
            tgid: 100,
            comm: comm.to_owned(),
            kthread: false,
            records,
            task_only: 0,
        }
    }

    fn exited(name: &str, stack_id: u64, count: u64) -> (ExitKey, GlobalRecord) {
        let mut comm = [0; 16];
        comm[..name.len()].copy_from_slice(name.as_bytes());
        (
            ExitKey {
                tgid: 100,
                comm,
                cgroup: 5,
                stack_id,
            },
            GlobalRecord {
                count,
                total_ns: count * 10,
                max_ns: 10,
            },
        )
    }

    fn snap(tasks: Vec<TaskSnapshot>, gone: &[(&str, u64, u64)]) -> Snapshot {
        let exited: BTreeMap<ExitKey, GlobalRecord> =
            gone.iter().map(|&(n, s, c)| exited(n, s, c)).collect();
        Snapshot {
            tasks,
            exited: std::sync::Arc::new(exited),
            ..Snapshot::default()
        }
    }

    fn told(parts: &HashMap<u64, Vec<(ThreadKey, GlobalRecord)>>) -> Vec<(u64, String, u64)> {
        let mut out: Vec<_> = parts
            .iter()
            .flat_map(|(stack, v)| v.iter().map(|(k, r)| (*stack, k.name.clone(), r.count)))
            .collect();
        out.sort();
        out
    }

    /// A live task tells what it added since the base; one that exited since, what it added
    /// after the base up to its exit; one gone before the base, nothing; one whose exit the
    /// log missed, nothing (not less than nothing).
    #[test]
    fn each_task_tells_what_it_added_in_the_window() {
        let base = snap(
            vec![
                task(1, "live", vec![rec(7, 3)]),
                task(2, "leaver", vec![rec(7, 4), rec(8, 1)]),
                task(3, "missed", vec![rec(9, 2)]),
                task(4, "still", vec![rec(7, 1)]),
            ],
            &[("old", 7, 6)],
        );
        let cur = snap(
            vec![
                task(1, "live", vec![rec(7, 5)]),
                task(4, "still", vec![rec(7, 1)]),
            ],
            &[("old", 7, 6), ("leaver", 7, 9), ("leaver", 8, 1)],
        );
        let parts = threads(&cur, Some(&ThreadBase::of(&base)));
        assert_eq!(
            told(&parts),
            [(7, "leaver".to_owned(), 5), (7, "live".to_owned(), 2)]
        );
        // Since the collection began: everything, the exited tasks' whole sums.
        assert_eq!(
            told(&threads(&cur, None)),
            [
                (7, "leaver".to_owned(), 9),
                (7, "live".to_owned(), 5),
                (7, "old".to_owned(), 6),
                (7, "still".to_owned(), 1),
                (8, "leaver".to_owned(), 1),
            ]
        );
    }

    /// The parts never exceed the cause: a cause of 6 sleeps with parts of 4 and 5 tells 4
    /// and 2; one of 12, 4 and 5 and leaves 3 untold.
    #[test]
    fn parts_are_cut_to_the_cause() {
        let key = |name: &str| ThreadKey {
            tgid: 1,
            name: name.to_owned(),
            cgroup: 0,
        };
        let r = |count: u64| GlobalRecord {
            count,
            total_ns: count * 100,
            max_ns: 0,
        };
        let parts = [(key("a"), r(4)), (key("b"), r(5))];
        let (told, rest) = split(6, 600, &parts);
        let told: Vec<_> = told
            .iter()
            .map(|(k, c, n)| (k.name.as_str(), *c, *n))
            .collect();
        assert_eq!(told, [("a", 4, 400), ("b", 2, 200)]);
        assert_eq!(rest, (0, 0));
        let (told, rest) = split(12, 1250, &parts);
        assert_eq!(told.len(), 2);
        assert_eq!(rest, (3, 350));
    }
}

//! Snapshot -> what a view shows: causes named by their frames, merged and sorted.
use std::collections::HashMap;

use latprof_common::{GlobalRecord, NO_STACK, RUNQ_STACK};

use crate::{
    collect::{Snapshot, add},
    symbols::Kallsyms,
};

/// Frame text used for sleeps whose backtrace the kernel could not store.
pub const UNAVAILABLE: &str = "[stack unavailable]";
/// Frame text of run-queue latency (from wakeup to running).
pub const WAITING_FOR_CPU: &str = "[waiting for CPU]";

/// One cause as a user sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// Cause frames, innermost first.
    pub frames: Vec<String>,
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
    let mut merged: HashMap<Vec<String>, GlobalRecord> = HashMap::new();
    for (stack, rec) in records {
        let frames = if stack == NO_STACK {
            vec![UNAVAILABLE.to_owned()]
        } else if stack == RUNQ_STACK {
            vec![WAITING_FOR_CPU.to_owned()]
        } else {
            let raw = snap.stacks.get(&stack).map_or(&[][..], Vec::as_slice);
            let frames = syms.cause_frames(raw, depth);
            if frames.is_empty() {
                vec![UNAVAILABLE.to_owned()]
            } else {
                frames
            }
        };
        add(
            merged.entry(frames).or_default(),
            rec.count,
            rec.total_ns,
            rec.max_ns,
        );
    }
    let mut out: Vec<Cause> = merged
        .into_iter()
        .map(|(frames, r)| Cause {
            frames,
            count: r.count,
            total_ns: r.total_ns,
            max_ns: r.max_ns,
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    out
}

/// The global table: sleep causes and run-queue latency.
#[must_use]
pub fn global_causes(snap: &Snapshot, syms: &Kallsyms, depth: usize) -> Vec<Cause> {
    causes(snap.global_records(), snap, syms, depth)
}

/// What /proc/latency_stats shows: sleep causes only (latencytop has no run-queue row).
#[must_use]
pub fn latencytop_causes(snap: &Snapshot, syms: &Kallsyms, depth: usize) -> Vec<Cause> {
    let records = snap
        .global_records()
        .into_iter()
        .filter(|(stack, _)| *stack != RUNQ_STACK);
    causes(records, snap, syms, depth)
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

#[cfg(test)]
mod tests {
    use latprof_common::LatencyRecord;

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
        }
    }

    fn task(tid: u32, tgid: u32, kthread: bool, records: Vec<LatencyRecord>) -> TaskSnapshot {
        TaskSnapshot {
            tid,
            tgid,
            comm: "t".into(),
            kthread,
            records,
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
                    frames: vec!["hrtimer_nanosleep".into()],
                    count: 3,
                    total_ns: 9_000,
                    max_ns: 5_000
                },
                Cause {
                    frames: vec!["pipe_read".into()],
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

    #[test]
    fn kernel_threads_count_when_asked_for() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut snap = snapshot(Mode::Lazy);
        snap.skip_kthreads = false;
        let causes = global_causes(&snap, &syms, 12);
        assert_eq!(causes[0].frames, ["pipe_read"]);
        assert_eq!(causes[0].count, 105);
    }

    #[test]
    fn process_causes_sum_threads() {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let causes = process_causes(&snapshot(Mode::Lazy), 10, &syms, 12);
        assert_eq!(causes[0].frames, ["hrtimer_nanosleep"]);
        assert_eq!(causes[1].count, 5);
        assert!(process_causes(&snapshot(Mode::Lazy), 99, &syms, 12).is_empty());
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
        assert_eq!(global_causes(&snap, &syms, 12)[0].frames, [UNAVAILABLE]);
    }
}

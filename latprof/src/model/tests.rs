//! The model's tests: causes, rows, processes and the header from made-up snapshots.
use latprof_common::{GlobalRecord, LatencyRecord, NO_STACK};

use super::*;
use crate::{
    collect::{Snapshot, TaskSnapshot},
    probe::Mode,
    reasons::Reasons,
    symbols::{Backtrace, Kallsyms},
};

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
        start_line: 0,
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

/// A recording's reader charges `store::reader::CAUSE_BYTES` for each cause a view of it will
/// hold (it knows nothing of the views): exactly what one takes, as when it took the size of
/// the type (a larger number refuses recordings the views would hold; a smaller one lets
/// through what they would not).
#[test]
fn a_cause_is_what_the_recordings_reader_charges_for_it() {
    assert_eq!(
        size_of::<super::Cause>() as u64,
        crate::store::reader::CAUSE_BYTES,
        "model::Cause's size changed: CAUSE_BYTES must follow"
    );
}

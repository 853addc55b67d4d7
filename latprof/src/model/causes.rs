//! Causes: stack ids named by their frames (and user frames), merged where their frames are
//! the same; a spike's reason.

use std::collections::HashMap;

use latprof_common::{GlobalRecord, RESERVED_STACKS, RUNQ_STACK};

use crate::{
    collect::{Snapshot, Spike},
    reasons::Reasons,
    symbols::{Backtrace, Kallsyms},
    ustacks::UserFrame,
};

/// One cause as a user sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub backtrace: Backtrace,
    /// With `--user-stacks`: the sleeper's user frames, innermost first (empty: none); each
    /// with the file it is in (a cause is told apart by their names: see `user_names`).
    pub user: Vec<UserFrame>,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// One record id as every view names it (`top`'s rows, `stats`' and `dump`'s exports,
/// `serve`'s series and profile): its kernel frames, its user frames, its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub backtrace: Backtrace,
    /// With `--user-stacks`: the sleeper's user frames, innermost first (empty: none).
    pub user: Vec<UserFrame>,
    pub reason: String,
}

/// Record id `stack` named (see [`Named`]).
#[must_use]
pub fn name(
    stack: u64,
    snap: &Snapshot,
    syms: &Kallsyms,
    reasons: &Reasons,
    depth: usize,
) -> Named {
    let (backtrace, user) = frames_of(stack, snap, syms, depth);
    Named {
        reason: reasons.reason(&backtrace),
        backtrace,
        user,
    }
}

/// The kernel and user frames of record id `stack`: what tells one cause from another.
fn frames_of(
    stack: u64,
    snap: &Snapshot,
    syms: &Kallsyms,
    depth: usize,
) -> (Backtrace, Vec<UserFrame>) {
    (
        backtrace_of(stack, snap, syms, depth),
        user_frames(snap, stack, depth),
    )
}

/// The kernel backtrace of record id `stack`, from the frames `snap` holds (a pseudo
/// backtrace for the reserved ids, unavailable where none was stored).
#[must_use]
pub fn backtrace_of(stack: u64, snap: &Snapshot, syms: &Kallsyms, depth: usize) -> Backtrace {
    Backtrace::of(
        stack,
        snap.stacks.get(&stack).map(Vec::as_slice),
        syms,
        depth,
    )
}

/// The kind of sleep record id `stack` holds: "R" waits for the CPU, "D" uninterruptible
/// sleeps, "S" interruptible ones, "SD" both (the pseudo backtraces: none stored, wakeup
/// hidden).
#[must_use]
pub fn state_of(stack: u64, snap: &Snapshot) -> &'static str {
    if stack == RUNQ_STACK {
        "R"
    } else if snap.uninterruptible.contains(&stack) {
        "D"
    } else if stack >= RESERVED_STACKS {
        "SD"
    } else {
        "S"
    }
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
    // By the frames' names: two calls on one source line (two return addresses) are one.
    let mut merged: HashMap<(Backtrace, Vec<String>), (Vec<UserFrame>, GlobalRecord)> =
        HashMap::new();
    for (stack, rec) in records {
        let (backtrace, user) = frames_of(stack, snap, syms, depth);
        merged
            .entry((backtrace, user_names(&user)))
            .or_insert_with(|| (user, GlobalRecord::default()))
            .1
            .add(rec.count, rec.total_ns, rec.max_ns);
    }
    let mut out: Vec<Cause> = merged
        .into_iter()
        .map(|((backtrace, _), (user, r))| Cause {
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
            .then_with(|| user_names(&a.user).cmp(&user_names(&b.user)))
    });
    out
}

/// The user frames of record id `stack` (`--user-stacks`), at most `depth`; empty without.
/// A backtrace not named yet is one frame, `NOT_NAMED_YET`.
#[must_use]
pub fn user_frames(snap: &Snapshot, stack: u64, depth: usize) -> Vec<UserFrame> {
    let Some(user) = snap.user_parts.get(&stack) else {
        return Vec::new();
    };
    snap.user_stacks.get(user).map_or_else(
        || vec![UserFrame::marker(NOT_NAMED_YET)],
        |frames| frames.iter().take(depth).cloned().collect(),
    )
}

/// The frame that stands for user frames not named yet.
pub const NOT_NAMED_YET: &str = "[user frames not named yet]";

/// The names of user frames, as every text view shows them.
#[must_use]
pub fn user_names(frames: &[UserFrame]) -> Vec<String> {
    frames.iter().map(|f| f.name.clone()).collect()
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
    let reason = reasons.reason(&backtrace_of(spike.stack_id, snap, syms, depth));
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

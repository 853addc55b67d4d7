//! Wait chains (`--chains`) in the exports: JSON's `behind` tree per cause, and folded lines
//! `sleeper frames;--;waker cause frames;--;...` for flame graphs of where the time went, and
//! the same chains as pprof samples (`chained_off_cpu`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Scope, folded, pprof};
use crate::{
    model::{self, Behind, Cause, Chains, Part},
    reasons::Reasons,
    symbols::Backtrace,
};

/// One part of a cause's wait (JSON's `behind`).
#[derive(Serialize)]
pub struct BehindJson {
    /// `slept` (the waker slept, at `reason`/`frames`), `slept_uncounted` (an interruptible
    /// sleep over the cutoff), `waiting_for_cpu` (the waker waited for a CPU right after its
    /// sleep), `running` (the waker ran), `woken_by` (no task woke it: `woken_by` says what),
    /// `link_lost` (the chain table was full).
    pub kind: &'static str,
    /// The waking process (absent where no task woke it).
    pub waker: Option<BehindWakerJson>,
    /// `woken_by`: `timer`, `hardirq`, `softirq`, `nmi`, `unseen` or `other`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub woken_by: Option<&'static str>,
    /// `slept`: the waker's sleep's reason and frames (innermost first), user frames too with
    /// `--user-stacks`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub user_frames: Vec<String>,
    /// The rows' sleeps (at the first level, the cause's sleeps it covers).
    pub count: u64,
    /// The part of the cause's wait time, and of its whole (0 to 1).
    pub time_ns: u64,
    pub share: f64,
    /// `slept`: that sleep's own parts, scaled to `time_ns`, down to `--chain-depth`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<BehindJson>,
}

#[derive(Serialize)]
pub struct BehindWakerJson {
    pub pid: u32,
    pub comm: String,
}

/// The chains of `scope`'s interval, or `None` where it holds none.
#[must_use]
pub fn of_scope<'a>(scope: &Scope<'a>) -> Option<Chains<'a>> {
    let chains = Chains::new(
        scope.cur,
        scope.base,
        scope.syms,
        scope.depth,
        scope.chain_depth,
    );
    chains.any().then_some(chains)
}

/// `cause`'s `behind` tree (of process `sleeper`, or all).
#[must_use]
pub fn json(
    scope: &Scope<'_>,
    chains: &Chains<'_>,
    cause: &Cause,
    sleeper: Option<u32>,
) -> Vec<BehindJson> {
    let parts = chains.of_cause(cause, sleeper);
    parts
        .iter()
        .map(|b| behind_json(scope, b, cause.total_ns))
        .collect()
}

fn behind_json(scope: &Scope<'_>, b: &Behind, whole: u64) -> BehindJson {
    let (kind, woken_by) = match &b.part {
        Part::Slept { .. } => ("slept", None),
        Part::SleptUncounted => ("slept_uncounted", None),
        Part::WaitingForCpu => ("waiting_for_cpu", None),
        Part::Running => ("running", None),
        Part::WokenBy(k) => ("woken_by", Some(latprof_common::waker_kind_name(*k))),
        Part::LinkLost => ("link_lost", None),
    };
    let (reason, frames, user_frames) = match &b.part {
        Part::Slept { backtrace, user } => (
            Some(scope.reasons.reason(backtrace)),
            backtrace.lines().into_iter().map(str::to_owned).collect(),
            user.clone(),
        ),
        _ => (None, Vec::new(), Vec::new()),
    };
    #[expect(clippy::cast_precision_loss, reason = "a share for people")]
    let share = if whole == 0 {
        0.0
    } else {
        b.time_ns as f64 / whole as f64
    };
    BehindJson {
        kind,
        waker: b.waker.as_ref().map(|(pid, comm)| BehindWakerJson {
            pid: *pid,
            comm: comm.clone(),
        }),
        woken_by,
        reason,
        frames,
        user_frames,
        count: b.count,
        time_ns: b.time_ns,
        share,
        behind: b
            .below
            .iter()
            .map(|x| behind_json(scope, x, whole))
            .collect(),
    }
}

/// Folded chains: per cause (of `--pid`'s process, or all) and part with time of its own,
/// `sleeper frames;--;waker cause frames;--;its waker's cause frames value`, frames outermost
/// first, the value the part's time in microseconds. A part that is no waker's sleep ends
/// its line as one frame: `[comm pid: running]`, `[woken by interrupt: timer]`.
#[must_use]
pub fn render_folded(scope: &Scope<'_>) -> String {
    let Some(chains) = of_scope(scope) else {
        return String::new();
    };
    let names =
        |bt: &Backtrace, user: &[String]| folded::frames(bt, user.iter().map(String::as_str));
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for cause in scope.causes(false) {
        let sleeper = folded::frames(&cause.backtrace, cause.user.iter().map(|f| f.name.as_str()));
        for (path, leaf, own) in Behind::leaves(&chains.of_cause(&cause, scope.pid)) {
            let mut line = sleeper.clone();
            for b in path.into_iter().chain([leaf]) {
                line.push("--".to_owned());
                match &b.part {
                    Part::Slept { backtrace, user } => line.extend(names(backtrace, user)),
                    _ => line.push(format!("[{}]", label(scope.reasons, b).replace(';', ":"))),
                }
            }
            *lines.entry(line.join(";")).or_default() += own;
        }
    }
    folded::text(lines)
}

/// A part that is no waker's sleep, as one frame names it.
fn label(reasons: &Reasons, b: &Behind) -> String {
    model::part_label(b, |bt| reasons.reason(bt))
}

/// A frame of a wait chain as a profile places it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChainFrame {
    Kernel(String),
    /// A user frame, by name (a chain keeps its causes' names only: its mapping is
    /// `[anon]`).
    User(String),
    /// The sleeper's reason (the root), `--` between levels, a part that is no sleep.
    Latprof(String),
}

impl ChainFrame {
    #[must_use]
    pub fn pprof(&self) -> pprof::Frame<'_> {
        match self {
            Self::Kernel(name) => pprof::Frame::kernel(name),
            Self::User(name) => pprof::Frame {
                name,
                place: pprof::Place::Anonymous,
                start_line: 0,
            },
            Self::Latprof(name) => pprof::Frame::latprof(name),
        }
    }
}

/// One chain with time of its own, as a profile's sample ([`samples`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainSample {
    /// Innermost first: the leaf's frames (or its part, `[syncer [12]: running]`), `--`,
    /// the sleep above it, ..., `--`, the sleeper's cause, and its reason at the root.
    pub frames: Vec<ChainFrame>,
    /// The sleeper's process.
    pub tgid: u32,
    pub ns: u64,
}

/// Every chain with time of its own, per process and cause (`--pid`'s process only, where
/// given): the profiles' `chained_off_cpu` samples. A cause's samples add up to its time in
/// the wakers' rows, as the folded chains do.
#[must_use]
pub fn samples(chains: &Chains<'_>, reasons: &Reasons, pid: Option<u32>) -> Vec<ChainSample> {
    let push_cause = |frames: &mut Vec<ChainFrame>, bt: &Backtrace, user: &[String]| {
        frames.extend(
            bt.lines()
                .into_iter()
                .map(|f| ChainFrame::Kernel(f.to_owned())),
        );
        frames.extend(user.iter().cloned().map(ChainFrame::User));
    };
    let mut out = Vec::new();
    for s in chains.sleepers(pid) {
        for (path, leaf, own) in Behind::leaves(&chains.of_ids(&s.ids, Some(s.tgid))) {
            let mut frames = Vec::new();
            for b in path.into_iter().chain([leaf]).rev() {
                match &b.part {
                    Part::Slept { backtrace, user } => push_cause(&mut frames, backtrace, user),
                    _ => frames.push(ChainFrame::Latprof(format!("[{}]", label(reasons, b)))),
                }
                frames.push(ChainFrame::Latprof("--".to_owned()));
            }
            push_cause(&mut frames, &s.backtrace, &s.user);
            frames.push(ChainFrame::Latprof(reasons.reason(&s.backtrace)));
            out.push(ChainSample {
                frames,
                tgid: s.tgid,
                ns: own,
            });
        }
    }
    out
}

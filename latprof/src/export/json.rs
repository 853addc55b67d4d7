//! One JSON document per export; the schema is documented in docs/json-schema.md and its
//! version is the `schema` field.
use std::collections::{BTreeMap, HashMap};

use latprof_common::{Counter, GlobalRecord};
use serde::Serialize;

use super::Scope;
use crate::{collect::Snapshot, model, store::RecordingInfo, symbols::Backtrace, time};

pub const SCHEMA: &str = "latprof-export/1";

#[derive(Serialize)]
pub struct Document<'a> {
    pub schema: &'static str,
    pub mode: &'static str,
    /// Facts of the recording the numbers come from (absent for a live `stats`).
    pub recording: Option<&'a RecordingInfo>,
    pub pid: Option<u32>,
    /// Start of the interval (absent: since latprof attached).
    pub from: Option<Moment>,
    pub to: Moment,
    pub causes: Vec<CauseJson>,
    pub processes: Vec<ProcessJson>,
    /// Each cgroup v2's sleeps and causes, the most latency first (empty where cgroups are
    /// not tracked).
    pub cgroups: Vec<CgroupJson>,
    /// Who ended whose sleeps: one entry per sleeping process, cause and waker (and waker
    /// backtrace), the most sleep time first; exited processes' too (empty with wakers off).
    pub wakers: Vec<SleeperWakerJson>,
    /// Each process's sleeps whose wakeup or waking the kernel hid, exited processes' too
    /// (pid 0: past the processes latprof keeps apart), by pid.
    pub hidden: Vec<HiddenJson>,
    /// Pipeline counters over the interval.
    pub counters: BTreeMap<&'static str, u64>,
    /// The kernel's tick facts (absent: a recording made before latprof recorded them).
    pub kernel: Option<&'a crate::probe::KernelFacts>,
    /// Tick accounting per CPU over the interval.
    pub cpus: Vec<super::counters::CpuTicks>,
    /// Spike events of the interval (dump of a recording), oldest first.
    pub spikes: Vec<SpikeJson>,
    /// Times the spike reader went to sleep by `to` (a recording's; absent when live).
    pub reader_sleeps: Option<u64>,
    /// With `--chains`: wakers' sleeps left whole, not split into what they were behind, for
    /// the bounds on a chain tree's size (`model/chains.rs`: a mesh of wakers would grow it
    /// as its width to the depth). Absent without chains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_sleeps_not_split: Option<u64>,
}

#[derive(Serialize)]
pub struct SpikeJson {
    /// RFC 3339, UTC, when it ended.
    pub time: String,
    pub monotonic_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// `S`, `D` or `R` (waiting for a CPU).
    pub kind: &'static str,
    pub duration_ns: u64,
    pub cpu: u32,
    pub reason: String,
    /// Who ended it (null for run-queue waits, and where no waking was seen).
    pub waker: Option<SpikeWakerJson>,
}

#[derive(Serialize)]
pub struct SpikeWakerJson {
    /// As a `Waker`'s kind: `task`, `timer`, `hardirq`, `softirq`, `nmi`.
    pub kind: &'static str,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
}

#[derive(Serialize)]
pub struct Moment {
    /// RFC 3339, UTC.
    pub time: String,
    pub wall_ns: u64,
    pub monotonic_ns: u64,
}

impl Moment {
    fn of(s: &Snapshot) -> Self {
        Self {
            time: time::rfc3339_utc(s.wall_ns),
            wall_ns: s.wall_ns,
            monotonic_ns: s.taken_ns,
        }
    }
}

#[derive(Serialize)]
pub struct CauseJson {
    pub reason: String,
    /// `sleep`, `runqueue` (waiting for a CPU after the wakeup) or `unavailable` (no backtrace).
    pub kind: &'static str,
    /// Innermost first, as /proc/latency_stats prints them.
    pub frames: Vec<String>,
    /// With `--user-stacks`: the sleeper's user frames, innermost first (absent without).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub user_frames: Vec<String>,
    /// Where each user frame's code is, in `user_frames`' order: the file's path as the process
    /// saw it, `[jit]` (code a JIT generated, named by its perf map), `[anon]` (other code in no
    /// file), or "" (a mark such as `[truncated]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub user_modules: Vec<String>,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub average_ns: u64,
    /// Who ended these sleeps, the most sleep time ended first (empty for run-queue waits,
    /// with wakers off, and in the cgroups' causes).
    pub wakers: Vec<WakerJson>,
    /// With `--chains`: what the wakers were doing while these sleeps lasted, the largest
    /// part first, each waker's sleep with its own parts below it (absent without).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<super::chains::BehindJson>,
}

#[derive(Serialize)]
pub struct WakerJson {
    /// `task`, `timer`, `hardirq`, `softirq`, `nmi`, `unseen` (no waking seen) or `other`
    /// (the waker table was full).
    pub kind: &'static str,
    /// The waking task (kind `task` only).
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// With `--waker-stacks`: the waker's backtraces (innermost first, the wakeup function
    /// first), each with the sleeps it ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backtraces: Vec<WakerBacktraceJson>,
}

#[derive(Serialize)]
pub struct SleeperWakerJson {
    /// The sleeping process.
    pub sleeper_pid: u32,
    /// The sleeps' cause: its reason and frames, as in `causes`.
    pub reason: String,
    pub frames: Vec<String>,
    #[serde(flatten)]
    pub waker: WakerJson,
}

#[derive(Serialize)]
pub struct WakerBacktraceJson {
    pub frames: Vec<String>,
    pub count: u64,
    pub total_ns: u64,
}

#[derive(Serialize)]
pub struct CgroupJson {
    /// The cgroup v2 id (its directory's inode number).
    pub id: u64,
    pub name: String,
    /// Below the cgroup2 mount; absent if latprof never saw it in the file system.
    pub path: Option<String>,
    /// The full id of the container it is (64 hex digits), where its path names one.
    pub container_id: Option<String>,
    pub removed: bool,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub causes: Vec<CauseJson>,
}

#[derive(Serialize)]
pub struct ProcessJson {
    pub pid: u32,
    pub comm: String,
    pub threads: Vec<u32>,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub causes: Vec<CauseJson>,
}

/// A process's sleeps over the interval whose wakeup or waking the kernel hid, each one
/// checked against the hidden switches.
#[derive(Serialize)]
pub struct HiddenJson {
    pub pid: u32,
    /// Lost: neither counted nor recovered (a sleep recovered instead is counted, without
    /// its backtrace under "[wakeup hidden from tracing]").
    pub lost: u64,
    /// Counted with waker "unseen" (`--wakers`), where the kernel hid switches.
    pub waker_unseen: u64,
    /// Counted with waker "unseen": a task's first traced sleep, whose waking may have come
    /// before latprof made the task's entry.
    pub waker_first_sleep: u64,
    /// Not counted: shorter than 1 us, as latencytop leaves them out (the document's
    /// `skipped_zero`, by process).
    pub under_1us: u64,
}

fn wakers_json(scope: &Scope<'_>, lines: &[model::WakerLine]) -> Vec<WakerJson> {
    lines
        .iter()
        .map(|w| {
            let task = w.id.kind == latprof_common::WAKER_TASK;
            WakerJson {
                kind: w.id.kind_name(),
                pid: task.then_some(w.id.tgid),
                tid: task.then_some(w.id.tid),
                comm: task.then(|| w.comm.clone()),
                count: w.count,
                total_ns: w.total_ns,
                max_ns: w.max_ns,
                backtraces: w
                    .stacks
                    .iter()
                    .map(|(stack, r)| WakerBacktraceJson {
                        frames: model::waker_frames(scope.cur, *stack, scope.syms, scope.depth),
                        count: r.count,
                        total_ns: r.total_ns,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The flat list of (sleeper, cause, waker) in scope.
fn sleeper_wakers(scope: &Scope<'_>) -> Vec<SleeperWakerJson> {
    let wakers = model::wakers_since(scope.cur, scope.base, |k| {
        scope.pid.is_none_or(|p| p == k.sleeper_tgid)
    });
    let mut groups: BTreeMap<(u32, u64), Vec<crate::collect::Waker>> = BTreeMap::new();
    for w in wakers {
        groups
            .entry((w.key.sleeper_tgid, w.key.cause))
            .or_default()
            .push(w);
    }
    let mut out = Vec::new();
    for ((sleeper_pid, cause), ws) in groups {
        let backtrace = model::backtrace_of(cause, scope.cur, scope.syms, scope.depth);
        let reason = scope.reasons.reason(&backtrace);
        let frames: Vec<String> = backtrace.lines().into_iter().map(str::to_owned).collect();
        for waker in wakers_json(scope, &model::waker_lines(&ws)) {
            out.push(SleeperWakerJson {
                sleeper_pid,
                reason: reason.clone(),
                frames: frames.clone(),
                waker,
            });
        }
    }
    out.sort_by(|a, b| {
        b.waker
            .total_ns
            .cmp(&a.waker.total_ns)
            .then(a.sleeper_pid.cmp(&b.sleeper_pid))
    });
    out
}

/// The causes of `records`, each with its wakers among `wakers` (by cause).
fn causes_json(
    scope: &Scope<'_>,
    records: Vec<(u64, GlobalRecord)>,
    wakers: &HashMap<Backtrace, Vec<model::WakerLine>>,
    chains: Option<(&model::Chains<'_>, Option<u32>)>,
) -> Vec<CauseJson> {
    model::causes(records, scope.cur, scope.syms, scope.depth)
        .into_iter()
        .map(|c| {
            let kind = match c.backtrace {
                Backtrace::WaitingForCpu => "runqueue",
                Backtrace::Unavailable => "unavailable",
                Backtrace::WakeupHidden => "recovered",
                Backtrace::Frames(_) => "sleep",
            };
            CauseJson {
                reason: scope.reasons.reason(&c.backtrace),
                kind,
                average_ns: c.total_ns.checked_div(c.count).unwrap_or(0),
                frames: c.backtrace.lines().into_iter().map(str::to_owned).collect(),
                user_frames: crate::model::user_names(&c.user),
                user_modules: c.user.iter().map(|f| f.module.clone()).collect(),
                wakers: wakers
                    .get(&c.backtrace)
                    .map(|lines| wakers_json(scope, lines))
                    .unwrap_or_default(),
                behind: chains
                    .map(|(chains, sleeper)| super::chains::json(scope, chains, &c, sleeper))
                    .unwrap_or_default(),
                count: c.count,
                total_ns: c.total_ns,
                max_ns: c.max_ns,
            }
        })
        .collect()
}

/// Each process's hidden wakeups and sleeps under 1 us over the interval (only `--pid`'s
/// with any).
fn hidden(scope: &Scope<'_>) -> Vec<HiddenJson> {
    scope
        .cur
        .hidden
        .by_pid
        .iter()
        .filter(|&(&pid, _)| scope.pid.is_none_or(|p| p == pid))
        .map(|(&pid, &n)| {
            let n = n.since(
                scope
                    .base
                    .map_or_else(Default::default, |b| b.hidden.of(pid)),
            );
            HiddenJson {
                pid,
                lost: n.lost,
                waker_unseen: n.waker_unseen,
                waker_first_sleep: n.waker_raced,
                under_1us: n.short,
            }
        })
        .filter(|h| h.lost + h.waker_unseen + h.waker_first_sleep + h.under_1us > 0)
        .collect()
}

/// The pipeline counters over the interval, and the verdicts on the sleeps the kernel hid.
fn counters(scope: &Scope<'_>) -> BTreeMap<&'static str, u64> {
    Counter::ALL
        .iter()
        .map(|&c| {
            let base = scope.base.map_or(0, |b| b.counters.get(c));
            (c.name(), scope.cur.counters.get(c).saturating_sub(base))
        })
        .chain(scope.cur.hidden.counters(scope.base.map(|b| &b.hidden)))
        .collect()
}

#[must_use]
pub fn document<'a>(scope: &Scope<'a>) -> Document<'a> {
    let chains = super::chains::of_scope(scope);
    let mut tgids: BTreeMap<u32, (String, Vec<u32>)> = BTreeMap::new();
    for t in &scope.cur.tasks {
        if scope.pid.is_some_and(|p| p != t.tgid) || (t.kthread && scope.cur.skip_kthreads) {
            continue;
        }
        let e = tgids
            .entry(t.tgid)
            .or_insert_with(|| (t.comm.clone(), Vec::new()));
        if t.tid == t.tgid {
            e.0.clone_from(&t.comm);
        }
        e.1.push(t.tid);
    }
    let mut processes: Vec<ProcessJson> = tgids
        .into_iter()
        .filter_map(|(pid, (comm, threads))| {
            let records = model::process_since(scope.cur, scope.base, pid);
            if records.is_empty() {
                return None;
            }
            let wakers =
                model::cause_wakers(scope.cur, scope.base, Some(pid), scope.syms, scope.depth);
            let causes = causes_json(
                scope,
                records,
                &wakers,
                chains.as_ref().map(|c| (c, Some(pid))),
            );
            Some(ProcessJson {
                pid,
                comm,
                threads,
                count: causes.iter().map(|c| c.count).sum(),
                total_ns: causes.iter().map(|c| c.total_ns).sum(),
                max_ns: causes.iter().map(|c| c.max_ns).max().unwrap_or(0),
                causes,
            })
        })
        .collect();
    processes.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.pid.cmp(&b.pid)));
    let causes = causes_json(
        scope,
        scope.records(),
        &model::cause_wakers(scope.cur, scope.base, scope.pid, scope.syms, scope.depth),
        chains.as_ref().map(|c| (c, scope.pid)),
    );
    Document {
        schema: SCHEMA,
        mode: scope.cur.mode.as_str(),
        recording: scope.info,
        pid: scope.pid.or(scope.traced),
        from: scope.base.map(Moment::of),
        to: Moment::of(scope.cur),
        causes,
        chain_sleeps_not_split: chains.as_ref().map(model::Chains::cut),
        processes,
        cgroups: model::cgroups_since(scope.cur, scope.base, true)
            .into_iter()
            .map(|row| CgroupJson {
                id: row.id,
                causes: causes_json(scope, row.records, &HashMap::new(), None),
                name: row.name,
                container_id: row.path.as_deref().and_then(crate::cgroups::container_id),
                path: row.path,
                removed: row.removed,
                count: row.count,
                total_ns: row.total_ns,
                max_ns: row.max_ns,
            })
            .collect(),
        wakers: sleeper_wakers(scope),
        hidden: hidden(scope),
        counters: counters(scope),
        kernel: scope.kernel,
        cpus: scope.kernel.map_or_else(Vec::new, |k| {
            super::counters::cpu_ticks(k, scope.base, scope.cur)
        }),
        reader_sleeps: scope.reader_sleeps,
        spikes: scope
            .spikes
            .iter()
            .filter(|s| scope.pid.is_none_or(|p| p == s.tgid))
            .map(|s| {
                let wall = time::wall_of(s.end_ns, (scope.cur.wall_ns, scope.cur.taken_ns));
                SpikeJson {
                    time: time::rfc3339_utc(wall),
                    monotonic_ns: s.end_ns,
                    pid: s.tgid,
                    tid: s.tid,
                    comm: s.comm.clone(),
                    kind: s.kind_letter(),
                    duration_ns: s.duration_ns,
                    cpu: s.cpu,
                    waker: (s.waker_kind != latprof_common::WAKER_UNSEEN).then(|| {
                        let task = s.waker_kind == latprof_common::WAKER_TASK;
                        SpikeWakerJson {
                            kind: latprof_common::waker_kind_name(s.waker_kind),
                            pid: task.then_some(s.waker_tgid),
                            tid: task.then_some(s.waker_tid),
                            comm: task.then(|| s.waker_comm.clone()),
                        }
                    }),
                    reason: model::spike_reason(
                        s,
                        scope.cur,
                        scope.syms,
                        scope.reasons,
                        scope.depth,
                    ),
                }
            })
            .collect(),
    }
}

#[must_use]
pub fn render(scope: &Scope<'_>) -> String {
    let mut out = serde_json::to_string_pretty(&document(scope)).unwrap_or_default();
    out.push('\n');
    out
}

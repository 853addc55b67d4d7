//! The pprof profiles of `stats` and `dump` (`--format pprof`): one sample per kernel
//! backtrace, user frames, state and thread of the records in scope, the reason as the root
//! frame (and by cgroup, the cgroup's name above it), each frame under the mapping of its
//! file.
use std::collections::HashMap;

use latprof_common::GlobalRecord;

use super::{
    Scope,
    chains::{self, ChainFrame, ChainSample},
    pprof,
};
use crate::{model, symbols::Backtrace, ustacks::UserFrame};

/// One sample before encoding: what it is named by, and its numbers.
struct Owned {
    kernel: Backtrace,
    user: Vec<UserFrame>,
    reason: String,
    state: &'static str,
    /// By cgroup: the cgroup's name (the outermost frame).
    cgroup: Option<String>,
    /// Whose sleeps, as the labels show it (`None`: not told).
    thread: Option<pprof::Thread>,
    count: u64,
    total_ns: u64,
}

/// Each cause's sleeps in scope told by thread (none where no label shows a thread).
fn thread_parts(scope: &Scope<'_>) -> HashMap<u64, Vec<(model::ThreadKey, GlobalRecord)>> {
    if !scope.labels.threads() {
        return HashMap::new();
    }
    let base = scope.base.map(model::ThreadBase::of);
    let mut parts = model::threads(scope.cur, base.as_ref());
    if let Some(pid) = scope.pid {
        for v in parts.values_mut() {
            v.retain(|(k, _)| k.tgid == pid);
        }
    }
    parts
}

/// A thread as `labels` show it: its process, name and the full id of the container its
/// cgroup is (in `snap`'s paths); `None` where no label shows a thread (serve's too).
#[must_use]
pub fn thread_of(
    snap: &crate::collect::Snapshot,
    labels: pprof::Labels,
    key: &model::ThreadKey,
) -> Option<pprof::Thread> {
    labels.mask(pprof::Thread {
        pid: key.tgid,
        name: key.name.clone(),
        container: model::container_id(snap, key.cgroup),
    })
}

/// Adds `records` to `out`, split by thread (`parts`, those of `cgroup` only where given),
/// merged where every view names them alike and the state and thread are the same (an
/// uninterruptible sleep and an interruptible one of one backtrace are two samples).
fn add(
    scope: &Scope<'_>,
    records: impl IntoIterator<Item = (u64, GlobalRecord)>,
    parts: &HashMap<u64, Vec<(model::ThreadKey, GlobalRecord)>>,
    cgroup: Option<(u64, &str)>,
    out: &mut Vec<Owned>,
) {
    type Key = (Backtrace, Vec<String>, &'static str, Option<pprof::Thread>);
    let mut at: HashMap<Key, usize> = HashMap::new();
    for (stack, rec) in records {
        let named = model::name(stack, scope.cur, scope.syms, scope.reasons, scope.depth);
        let state = model::state_of(stack, scope.cur);
        let mine: Vec<(model::ThreadKey, GlobalRecord)> = parts
            .get(&stack)
            .into_iter()
            .flatten()
            .filter(|(k, _)| cgroup.is_none_or(|(id, _)| k.cgroup == id))
            .cloned()
            .collect();
        let (told, (rest_count, rest_ns)) = model::split(rec.count, rec.total_ns, &mine);
        let pieces = told
            .into_iter()
            .map(|(k, c, n)| (thread_of(scope.cur, scope.labels, k), c, n))
            .chain([(None, rest_count, rest_ns)])
            .filter(|&(_, c, n)| c > 0 || n > 0);
        for (thread, count, total_ns) in pieces {
            let key = (
                named.backtrace.clone(),
                model::user_names(&named.user),
                state,
                thread.clone(),
            );
            let i = *at.entry(key).or_insert_with(|| {
                out.push(Owned {
                    kernel: named.backtrace.clone(),
                    user: named.user.clone(),
                    reason: named.reason.clone(),
                    state,
                    cgroup: cgroup.map(|(_, name)| name.to_owned()),
                    thread,
                    count: 0,
                    total_ns: 0,
                });
                out.len() - 1
            });
            out[i].count += count;
            out[i].total_ns += total_ns;
        }
    }
}

/// The profile of `owned` over the scope's interval, and of `chains` (a third sample type).
fn encode(scope: &Scope<'_>, owned: &[Owned], chains: Option<&[ChainSample]>) -> Vec<u8> {
    let samples: Vec<pprof::Sample<'_>> = owned
        .iter()
        .map(|o| pprof::Sample {
            // Innermost first: the kernel's, the user frames outward, the reason, the cgroup.
            frames: o
                .kernel
                .lines()
                .into_iter()
                .map(pprof::Frame::kernel)
                .chain(o.user.iter().map(pprof::Frame::user))
                .chain([pprof::Frame::latprof(&o.reason)])
                .chain(o.cgroup.as_deref().map(pprof::Frame::latprof))
                .collect(),
            reason: &o.reason,
            state: o.state,
            thread: o.thread.as_ref(),
            count: o.count,
            total_ns: o.total_ns,
        })
        .collect();
    // Between two snapshots the profile covers their interval; a single one, everything
    // since the collection began (its length unknown here).
    let (start, duration) = scope.base.map_or((scope.cur.wall_ns, 0), |b| {
        (b.wall_ns, scope.cur.wall_ns.saturating_sub(b.wall_ns))
    });
    let threads: Vec<Option<pprof::Thread>> = chains
        .unwrap_or_default()
        .iter()
        .map(|c| {
            scope.labels.mask(pprof::Thread {
                pid: c.tgid,
                ..pprof::Thread::default()
            })
        })
        .collect();
    let chained: Option<Vec<pprof::Chained<'_>>> = chains.map(|chains| {
        chains
            .iter()
            .zip(&threads)
            .map(|(c, thread)| pprof::Chained {
                frames: c.frames.iter().map(ChainFrame::pprof).collect(),
                thread: thread.as_ref(),
                ns: c.ns,
            })
            .collect()
    });
    let shape = pprof::Shape {
        kernel_build_id: scope
            .kernel
            .and_then(|k| k.build_id.as_deref())
            .unwrap_or(""),
        labels: scope.labels,
        chained: chained.as_deref(),
    };
    pprof::encode(&samples, start, duration, &shape)
}

/// The records in scope as a profile.
#[must_use]
pub fn by_cause(scope: &Scope<'_>) -> Vec<u8> {
    let mut owned = Vec::new();
    add(
        scope,
        scope.records(),
        &thread_parts(scope),
        None,
        &mut owned,
    );
    // With chains in the interval, their time too (the sleepers' pids as the labels ask).
    let chains = chains::of_scope(scope).map(|c| chains::samples(&c, scope.reasons, scope.pid));
    encode(scope, &owned, chains.as_deref())
}

/// Each cgroup's records as a profile, the cgroup's name the outermost frame.
#[must_use]
pub fn by_cgroup(scope: &Scope<'_>) -> Vec<u8> {
    let mut owned = Vec::new();
    let parts = thread_parts(scope);
    for row in model::cgroups_since(scope.cur, scope.base, true) {
        add(
            scope,
            row.records,
            &parts,
            Some((row.id, &row.name)),
            &mut owned,
        );
    }
    encode(scope, &owned, None)
}

//! The pprof profiles of `stats` and `dump` (`--format pprof`): one sample per kernel
//! backtrace, user frames and state of the records in scope, the reason as the root frame (and
//! by cgroup, the cgroup's name above it), each frame under the mapping of its file.
use std::collections::HashMap;

use latprof_common::GlobalRecord;

use super::{Scope, pprof};
use crate::{model, symbols::Backtrace, ustacks::UserFrame};

/// One sample before encoding: what it is named by, and its numbers.
struct Owned {
    kernel: Backtrace,
    user: Vec<UserFrame>,
    reason: String,
    state: &'static str,
    /// By cgroup: the cgroup's name (the outermost frame).
    cgroup: Option<String>,
    count: u64,
    total_ns: u64,
}

/// Adds `records` to `out`, merged where every view names them alike (and the state is the
/// same: an uninterruptible sleep and an interruptible one of one backtrace are two samples).
fn add(
    scope: &Scope<'_>,
    records: impl IntoIterator<Item = (u64, GlobalRecord)>,
    cgroup: Option<&str>,
    out: &mut Vec<Owned>,
) {
    let mut at: HashMap<(Backtrace, Vec<String>, &'static str), usize> = HashMap::new();
    for (stack, rec) in records {
        let named = model::name(stack, scope.cur, scope.syms, scope.reasons, scope.depth);
        let state = model::state_of(stack, scope.cur);
        let key = (
            named.backtrace.clone(),
            model::user_names(&named.user),
            state,
        );
        let i = *at.entry(key).or_insert_with(|| {
            out.push(Owned {
                kernel: named.backtrace,
                user: named.user,
                reason: named.reason,
                state,
                cgroup: cgroup.map(str::to_owned),
                count: 0,
                total_ns: 0,
            });
            out.len() - 1
        });
        out[i].count += rec.count;
        out[i].total_ns += rec.total_ns;
    }
}

/// The profile of `owned` over the scope's interval.
fn encode(scope: &Scope<'_>, owned: &[Owned]) -> Vec<u8> {
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
            count: o.count,
            total_ns: o.total_ns,
        })
        .collect();
    // Between two snapshots the profile covers their interval; a single one, everything
    // since the collection began (its length unknown here).
    let (start, duration) = scope.base.map_or((scope.cur.wall_ns, 0), |b| {
        (b.wall_ns, scope.cur.wall_ns.saturating_sub(b.wall_ns))
    });
    let shape = pprof::Shape {
        kernel_build_id: scope
            .kernel
            .and_then(|k| k.build_id.as_deref())
            .unwrap_or(""),
        labels: scope.labels,
    };
    pprof::encode(&samples, start, duration, &shape)
}

/// The records in scope as a profile.
#[must_use]
pub fn by_cause(scope: &Scope<'_>) -> Vec<u8> {
    let mut owned = Vec::new();
    add(scope, scope.records(), None, &mut owned);
    encode(scope, &owned)
}

/// Each cgroup's records as a profile, the cgroup's name the outermost frame.
#[must_use]
pub fn by_cgroup(scope: &Scope<'_>) -> Vec<u8> {
    let mut owned = Vec::new();
    for row in model::cgroups_since(scope.cur, scope.base, true) {
        add(scope, row.records, Some(&row.name), &mut owned);
    }
    encode(scope, &owned)
}

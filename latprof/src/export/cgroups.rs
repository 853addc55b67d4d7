//! `stats --by cgroup`: each cgroup's sleeps and the causes within it, in every format.
use std::fmt::Write as _;

use super::{Format, Scope, openmetrics};
use crate::model::{self, CgroupRow};

/// The export as bytes (pprof is binary).
#[must_use]
pub fn render(format: Format, scope: &Scope<'_>) -> Vec<u8> {
    match format {
        Format::Text => text(scope).into_bytes(),
        // The JSON document carries the cgroups whatever the grouping.
        Format::Json => super::json::render(scope).into_bytes(),
        Format::Folded => folded(scope).into_bytes(),
        Format::Openmetrics => metrics(scope).into_bytes(),
        Format::Pprof => profile(scope),
    }
}

/// A pprof profile whose samples have the cgroup's name as their outermost frame.
fn profile(scope: &Scope<'_>) -> Vec<u8> {
    let mut owned: Vec<(String, Vec<String>, String, u64, u64)> = Vec::new();
    for row in rows(scope, true) {
        for c in model::causes(row.records, scope.cur, scope.syms, scope.depth) {
            let mut frames: Vec<String> =
                c.backtrace.lines().into_iter().map(str::to_owned).collect();
            frames.push(row.name.clone());
            owned.push((
                row.name.clone(),
                frames,
                scope.reasons.reason(&c.backtrace),
                c.count,
                c.total_ns,
            ));
        }
    }
    let samples: Vec<super::pprof::Sample<'_>> = owned
        .iter()
        .map(
            |(_, frames, reason, count, total_ns)| super::pprof::Sample {
                frames: frames.iter().map(String::as_str).collect(),
                reason,
                count: *count,
                total_ns: *total_ns,
            },
        )
        .collect();
    let (start, duration) = scope.base.map_or((scope.cur.wall_ns, 0), |b| {
        (b.wall_ns, scope.cur.wall_ns.saturating_sub(b.wall_ns))
    });
    super::pprof::encode(&samples, start, duration)
}

/// The cgroups in scope: `--pid` narrows nothing here (a process's cgroups are its own).
fn rows(scope: &Scope<'_>, runq: bool) -> Vec<CgroupRow> {
    model::cgroups_since(scope.cur, scope.base, runq)
}

/// `cgroup NAME (PATH): N sleeps, T us in all, M us at most`, then the cgroup's causes as
/// /proc/latency_stats lines, indented.
fn text(scope: &Scope<'_>) -> String {
    let mut out = String::new();
    let all = rows(scope, false);
    if all.is_empty() {
        out.push_str("no sleeps attributed to a cgroup (cgroup v2 not mounted, or none counted)\n");
    }
    for row in all {
        let place = match (&row.path, row.removed) {
            (Some(p), false) => p.clone(),
            (Some(p), true) => format!("{p}, removed"),
            (None, _) => "path unknown".to_owned(),
        };
        let _ = writeln!(
            out,
            "cgroup {} ({place}): {} sleeps, {} us in all, {} us at most",
            row.name,
            row.count,
            row.total_ns / 1000,
            row.max_ns / 1000
        );
        let causes = model::causes(row.records, scope.cur, scope.syms, scope.depth);
        for line in super::text::latency_stats(&causes).lines().skip(1) {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

/// Folded stacks with the cgroup's name as the root frame.
fn folded(scope: &Scope<'_>) -> String {
    let mut out = String::new();
    for row in rows(scope, true) {
        let root = row.name.replace(';', ":");
        let causes = model::causes(row.records, scope.cur, scope.syms, scope.depth);
        for line in super::folded::render(&causes).lines() {
            let _ = writeln!(out, "{root};{line}");
        }
    }
    out
}

/// OpenMetrics: count, time and maximum per cgroup and reason.
fn metrics(scope: &Scope<'_>) -> String {
    let mut series: Vec<(String, u64, u64, u64)> = Vec::new();
    for row in rows(scope, true) {
        let mut by_reason: std::collections::BTreeMap<String, (u64, u64, u64)> =
            std::collections::BTreeMap::new();
        for c in model::causes(row.records, scope.cur, scope.syms, scope.depth) {
            let e = by_reason
                .entry(scope.reasons.reason(&c.backtrace))
                .or_default();
            e.0 += c.count;
            e.1 += c.total_ns;
            e.2 = e.2.max(c.max_ns);
        }
        for (reason, (n, total, max)) in by_reason {
            let labels = format!(
                "cgroup=\"{}\",cgroup_id=\"{}\",reason=\"{}\"",
                openmetrics::label(&row.name),
                row.id,
                openmetrics::label(&reason)
            );
            series.push((labels, n, total, max));
        }
    }
    let mut out = String::new();
    openmetrics::family(
        &mut out,
        "latprof_cgroup_latency_events",
        "counter",
        None,
        "Sleeps (and run-queue waits) counted, by cgroup and reason.",
    );
    for (l, n, _, _) in &series {
        let _ = writeln!(out, "latprof_cgroup_latency_events_total{{{l}}} {n}");
    }
    openmetrics::family(
        &mut out,
        "latprof_cgroup_latency_seconds",
        "counter",
        Some("seconds"),
        "Time spent in those sleeps and waits, by cgroup and reason.",
    );
    for (l, _, total, _) in &series {
        let _ = writeln!(
            out,
            "latprof_cgroup_latency_seconds_total{{{l}}} {}",
            openmetrics::seconds(*total)
        );
    }
    openmetrics::family(
        &mut out,
        "latprof_cgroup_latency_max_seconds",
        "gauge",
        Some("seconds"),
        "Longest single sleep or wait, by cgroup and reason.",
    );
    for (l, _, _, max) in &series {
        let _ = writeln!(
            out,
            "latprof_cgroup_latency_max_seconds{{{l}}} {}",
            openmetrics::seconds(*max)
        );
    }
    out.push_str("# EOF\n");
    out
}

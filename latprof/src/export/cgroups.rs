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
        Format::Pprof => super::profiles::by_cgroup(scope),
    }
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

#[cfg(test)]
mod tests {
    use latprof_common::{CgroupCause, GlobalRecord, LatencyRecord};

    use super::*;
    use crate::{
        cgroups::CgroupPath,
        collect::{Snapshot, TaskSnapshot},
        reasons::Reasons,
        symbols::Kallsyms,
    };

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81200000 T hrtimer_nanosleep
ffffffff81300000 T pipe_read
ffffffff81400000 T __sched_text_start
ffffffff81400010 T schedule
ffffffff81401000 T __sched_text_end
";

    fn rec(count: u64, total_ns: u64, max_ns: u64) -> GlobalRecord {
        GlobalRecord {
            count,
            total_ns,
            max_ns,
        }
    }

    /// Three cgroups: a service (exited tasks' records plus a live task's), a removed one
    /// whose name needs escaping, and one never seen in the file system.
    fn snapshot() -> Snapshot {
        let mut snap = Snapshot {
            skip_kthreads: true,
            ..Snapshot::default()
        };
        snap.stacks
            .insert(1, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8120_0010]);
        snap.stacks
            .insert(3, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8130_0010]);
        let key = |cgroup, stack_id| CgroupCause { cgroup, stack_id };
        snap.cgroups = vec![
            (key(100, 1), rec(2, 4_000_000, 3_000_000)),
            (key(200, 3), rec(5, 500_000, 200_000)),
            (key(300, 3), rec(1, 2_000, 2_000)),
        ];
        snap.tasks = vec![TaskSnapshot {
            tid: 10,
            tgid: 10,
            comm: "t".into(),
            kthread: false,
            records: vec![LatencyRecord {
                stack_id: 1,
                count: 1,
                total_ns: 1_000_000,
                max_ns: 1_000_000,
                cgroup: 100,
            }],
            task_only: 0,
        }];
        snap.cgroup_paths = [
            (
                100,
                CgroupPath {
                    path: Some("/system.slice/nginx.service".into()),
                    removed: false,
                },
            ),
            (
                200,
                CgroupPath {
                    path: Some("/odd\"dir\\x;y".into()),
                    removed: true,
                },
            ),
            (
                300,
                CgroupPath {
                    path: None,
                    removed: true,
                },
            ),
        ]
        .into();
        snap
    }

    fn render_all(format: Format) -> String {
        String::from_utf8(rendered(format)).unwrap()
    }

    fn rendered(format: Format) -> Vec<u8> {
        let snap = snapshot();
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let reasons = Reasons::builtin();
        let scope = Scope {
            cur: &snap,
            base: None,
            pid: None,
            traced: None,
            syms: &syms,
            reasons: &reasons,
            depth: 12,
            info: None,
            kernel: None,
            chain_depth: 4,
            labels: crate::export::pprof::Labels::default(),
            spikes: &[],
            reader_sleeps: None,
        };
        render(format, &scope)
    }

    /// Each cgroup heads its causes, the most latency first: name, path (removed, unknown),
    /// count, total and max, exited and live tasks' sleeps together.
    #[test]
    fn text_heads_each_cgroup_with_its_place() {
        assert_eq!(
            render_all(Format::Text),
            "\
cgroup nginx.service (/system.slice/nginx.service): 3 sleeps, 5000 us in all, 3000 us at most
  3 5000 3000 hrtimer_nanosleep
cgroup odd\"dir\\x;y (/odd\"dir\\x;y, removed): 5 sleeps, 500 us in all, 200 us at most
  5 500 200 pipe_read
cgroup cgroup 300 (path unknown): 1 sleeps, 2 us in all, 2 us at most
  1 2 2 pipe_read
"
        );
    }

    /// The cgroup's name is the root frame; a ';' in it would split the frame, so it is ':'.
    #[test]
    fn folded_roots_each_stack_at_its_cgroup() {
        assert_eq!(
            render_all(Format::Folded),
            "\
nginx.service;hrtimer_nanosleep 5000
odd\"dir\\x:y;pipe_read 500
cgroup 300;pipe_read 2
"
        );
    }

    /// Every series carries the cgroup's name (escaped as OpenMetrics wants), its id and the
    /// reason; the exposition ends with `# EOF`.
    #[test]
    fn openmetrics_labels_each_cgroup_escaped_with_its_id() {
        let text = render_all(Format::Openmetrics);
        let odd = r#"cgroup="odd\"dir\\x;y",cgroup_id="200",reason="Waiting for a pipe""#;
        let nginx =
            r#"cgroup="nginx.service",cgroup_id="100",reason="Application requested delay""#;
        for line in [
            format!("latprof_cgroup_latency_events_total{{{nginx}}} 3"),
            format!("latprof_cgroup_latency_events_total{{{odd}}} 5"),
            format!("latprof_cgroup_latency_seconds_total{{{nginx}}} 0.005"),
            format!("latprof_cgroup_latency_seconds_total{{{odd}}} 0.0005"),
            format!("latprof_cgroup_latency_max_seconds{{{nginx}}} 0.003"),
            format!("latprof_cgroup_latency_max_seconds{{{odd}}} 0.0002"),
            r#"latprof_cgroup_latency_max_seconds{cgroup="cgroup 300",cgroup_id="300",reason="Waiting for a pipe"} 0.000002"#.to_owned(),
            "# TYPE latprof_cgroup_latency_events counter".to_owned(),
            "# UNIT latprof_cgroup_latency_seconds seconds".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
        // Three series in each of the three families, and nothing after the end.
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, 9, "{text}");
        assert!(text.ends_with("\n# EOF\n"), "{text}");
    }

    /// A sample as the test sees it: frames, labels, count.
    type Seen<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, i64);

    /// pprof: each sample's outermost frame is its cgroup's name; the live task's sleep is
    /// told by its pid and name, the exited tasks' (no exit logged here) untold.
    #[test]
    fn pprof_samples_end_at_their_cgroup() {
        let p = super::super::pprof::decode(&rendered(Format::Pprof)).expect("a profile");
        let samples: Vec<Seen<'_>> = p
            .sample
            .iter()
            .map(|s| {
                let labels = s
                    .label
                    .iter()
                    .map(|l| (p.string(l.key), p.string(l.str)))
                    .collect();
                (p.frame_names(s), labels, s.value[0])
            })
            .collect();
        let nginx = vec![
            "hrtimer_nanosleep",
            "Application requested delay",
            "nginx.service",
        ];
        let state = ("state", "S");
        assert_eq!(
            samples,
            [
                (
                    nginx.clone(),
                    vec![state, ("pid", "10"), ("thread_name", "t")],
                    1
                ),
                (nginx, vec![state], 2),
                (
                    vec!["pipe_read", "Waiting for a pipe", "odd\"dir\\x;y"],
                    vec![state],
                    5
                ),
                (
                    vec!["pipe_read", "Waiting for a pipe", "cgroup 300"],
                    vec![state],
                    1
                ),
            ]
        );
    }
}

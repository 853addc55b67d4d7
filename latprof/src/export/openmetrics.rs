//! OpenMetrics text exposition (what Prometheus scrapes): counters per cause and per pipeline
//! counter, the maximum as a gauge, `# EOF` at the end.
use std::fmt::Write as _;

use super::Scope;
use latprof_common::Counter;

/// A label value with `\`, `"` and newlines escaped.
pub(super) fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[expect(
    clippy::cast_precision_loss,
    reason = "seconds as floats, as Prometheus keeps them"
)]
pub(super) fn seconds(ns: u64) -> String {
    format!("{}", ns as f64 / 1e9)
}

pub(super) fn family(out: &mut String, name: &str, kind: &str, unit: Option<&str>, help: &str) {
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if let Some(unit) = unit {
        let _ = writeln!(out, "# UNIT {name} {unit}");
    }
    let _ = writeln!(out, "# HELP {name} {help}");
}

#[must_use]
pub fn render(scope: &Scope<'_>) -> String {
    let causes = scope.causes(true);
    let labels: Vec<String> = causes
        .iter()
        .map(|c| {
            format!(
                "reason=\"{}\",stack=\"{}\"",
                label(&scope.reasons.reason(&c.backtrace)),
                label(&c.backtrace.join(";"))
            )
        })
        .collect();
    let mut out = String::new();
    family(
        &mut out,
        "latprof_latency_events",
        "counter",
        None,
        "Sleeps (and run-queue waits) counted, by cause.",
    );
    for (c, l) in causes.iter().zip(&labels) {
        let _ = writeln!(out, "latprof_latency_events_total{{{l}}} {}", c.count);
    }
    family(
        &mut out,
        "latprof_latency_seconds",
        "counter",
        Some("seconds"),
        "Time spent in those sleeps and waits, by cause.",
    );
    for (c, l) in causes.iter().zip(&labels) {
        let _ = writeln!(
            out,
            "latprof_latency_seconds_total{{{l}}} {}",
            seconds(c.total_ns)
        );
    }
    family(
        &mut out,
        "latprof_latency_max_seconds",
        "gauge",
        Some("seconds"),
        "Longest single sleep or wait, by cause.",
    );
    for (c, l) in causes.iter().zip(&labels) {
        let _ = writeln!(
            out,
            "latprof_latency_max_seconds{{{l}}} {}",
            seconds(c.max_ns)
        );
    }
    family(
        &mut out,
        "latprof_pipeline_events",
        "counter",
        None,
        "latprof's own event pipeline: what it tracked, skipped and lost.",
    );
    for c in Counter::ALL {
        let base = scope.base.map_or(0, |b| b.counters.get(c));
        let _ = writeln!(
            out,
            "latprof_pipeline_events_total{{counter=\"{}\"}} {}",
            c.name(),
            scope.cur.counters.get(c).saturating_sub(base)
        );
    }
    if let Some(sleeps) = scope.reader_sleeps {
        family(
            &mut out,
            "latprof_spike_reader_sleeps",
            "counter",
            None,
            "Times latprof's spike reader went to sleep waiting for events.",
        );
        let _ = writeln!(out, "latprof_spike_reader_sleeps_total {sleeps}");
    }
    if let Some(kernel) = scope.kernel {
        family(
            &mut out,
            "latprof_cpu_events",
            "counter",
            None,
            "Per CPU: timer ticks, tick stops (stopped, kept, kept by dependency), switches, user enter/exit.",
        );
        for c in super::counters::cpu_ticks(kernel, scope.base, scope.cur) {
            let mut events = vec![
                ("timer_tick", c.timer_ticks),
                ("tick_stopped", c.tick_stopped),
                ("tick_kept", c.tick_kept),
                ("switch", c.switches),
            ];
            events.extend(c.user_enter.map(|n| ("user_enter", n)));
            events.extend(c.user_exit.map(|n| ("user_exit", n)));
            for (event, n) in events {
                let _ = writeln!(
                    out,
                    "latprof_cpu_events_total{{cpu=\"{}\",event=\"{event}\"}} {n}",
                    c.cpu
                );
            }
            for (dep, n) in c.kept_by {
                let _ = writeln!(
                    out,
                    "latprof_cpu_events_total{{cpu=\"{}\",event=\"tick_kept_by_{}\"}} {n}",
                    c.cpu,
                    dep.to_lowercase()
                );
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

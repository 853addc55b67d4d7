//! Prometheus expositions. `render`: one moment (or interval) of `stats` and `dump` in
//! OpenMetrics text, counters per cause and per pipeline counter, the maximum as a gauge, `#
//! EOF` at the end. `render_live`: what `latprof serve` answers at /metrics, per reason and
//! state, with histograms and latprof's health, in OpenMetrics 1.0 or Prometheus text 0.0.4.
mod live;
mod process;

pub use live::{Live, Series, render_live, render_live_body, render_live_tail};
pub use process::Process;

use std::fmt::Write as _;

use super::{Scope, counters::CpuTicks};
use crate::collect::HiddenSleeps;
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
    family_in(Flavor::OpenMetrics, out, name, kind, unit, help);
}

/// A family's metadata: OpenMetrics names the family (without `_total`) and its unit;
/// Prometheus 0.0.4 names a counter's samples (with `_total`) and has no unit line.
fn family_in(
    flavor: Flavor,
    out: &mut String,
    name: &str,
    kind: &str,
    unit: Option<&str>,
    help: &str,
) {
    match flavor {
        Flavor::OpenMetrics => {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            if let Some(unit) = unit {
                let _ = writeln!(out, "# UNIT {name} {unit}");
            }
            let _ = writeln!(out, "# HELP {name} {help}");
        }
        Flavor::Prometheus => {
            let sample = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            let _ = writeln!(out, "# HELP {sample} {help}");
            let _ = writeln!(out, "# TYPE {sample} {kind}");
        }
    }
}

/// The two text formats a scraper may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// OpenMetrics 1.0 (`Accept: application/openmetrics-text`).
    OpenMetrics,
    /// Prometheus text 0.0.4, what any other scraper gets.
    Prometheus,
}

impl Flavor {
    /// The flavor an `Accept` header asks for: OpenMetrics where it is acceptable (q > 0) and
    /// preferred at least as much as plain text (`text/plain`, `text/*`, `*/*`).
    #[must_use]
    pub fn accepting(accept: &str) -> Self {
        let (mut om, mut text) = (0.0f32, 0.0f32);
        for item in accept.split(',') {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(1.0));
            match media.as_str() {
                "application/openmetrics-text" => om = om.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if om > 0.0 && om >= text {
            Self::OpenMetrics
        } else {
            Self::Prometheus
        }
    }

    #[must_use]
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The check of each lost or recovered sleep against the switches the kernel hid (done in user
/// space): those it explained and those it did not as pipeline events (right after that
/// family's samples), and those not judged yet as a gauge of their own (the number goes down
/// as they are judged, which a counter may not).
fn hidden_sleeps(
    flavor: Flavor,
    out: &mut String,
    cur: &HiddenSleeps,
    base: Option<&HiddenSleeps>,
) {
    let [
        explained,
        unexplained,
        (waiting_name, waiting),
        unseen_explained,
        unseen_unexplained,
        unseen_raced,
    ] = cur.counters(base);
    for (name, n) in [
        explained,
        unexplained,
        unseen_explained,
        unseen_unexplained,
        unseen_raced,
    ] {
        let _ = writeln!(
            out,
            "latprof_pipeline_events_total{{counter=\"{name}\"}} {n}"
        );
    }
    family_in(
        flavor,
        out,
        &format!("latprof_{waiting_name}"),
        "gauge",
        None,
        "Sleeps lost or recovered not yet checked against the switches the kernel hid (a CPU had no switch latprof saw since).",
    );
    let _ = writeln!(out, "latprof_{waiting_name} {waiting}");
}

/// `latprof_cpu_events_total` samples.
fn cpu_events(out: &mut String, cpus: &[CpuTicks]) {
    for c in cpus {
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
        for (dep, n) in &c.kept_by {
            let _ = writeln!(
                out,
                "latprof_cpu_events_total{{cpu=\"{}\",event=\"tick_kept_by_{}\"}} {n}",
                c.cpu,
                dep.to_lowercase()
            );
        }
    }
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
    hidden_sleeps(
        Flavor::OpenMetrics,
        &mut out,
        &scope.cur.hidden,
        scope.base.map(|b| &b.hidden),
    );
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
        cpu_events(
            &mut out,
            &super::counters::cpu_ticks(kernel, scope.base, scope.cur),
        );
    }
    out.push_str("# EOF\n");
    out
}

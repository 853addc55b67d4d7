//! Prometheus expositions. `render`: one moment (or interval) of `stats` and `dump` in
//! OpenMetrics text, counters per cause and per pipeline counter, the maximum as a gauge, `#
//! EOF` at the end. `render_live`: what `latprof serve` answers at /metrics, per reason and
//! state, with histograms and latprof's health, in OpenMetrics 1.0 or Prometheus text 0.0.4.
use std::fmt::Write as _;

use super::{Scope, counters::CpuTicks};
use crate::collect::{Counters, HiddenSleeps};
use latprof_common::{Counter, HIST_BUCKETS};

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

/// One (reason, state) series of `latprof serve`: cumulative since it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    pub reason: String,
    /// "S" or "D" sleeps ("SD": a pseudo backtrace holding both, or the folded "other"),
    /// "R" run-queue waits.
    pub state: &'static str,
    pub count: u64,
    pub total_ns: u64,
    /// The kernel's log2 buckets: `buckets[i]` holds latencies under 2^(i+1) microseconds
    /// (and at least 2^i, bucket 0 excepted); the last one everything longer.
    pub buckets: [u64; HIST_BUCKETS],
}

/// Everything `latprof serve` exposes at one moment.
#[derive(Clone, Debug, Default)]
pub struct Live {
    /// At most `--max-series`, `reason="other"` among them when any were folded.
    pub series: Vec<Series>,
    /// Distinct (reason, state) pairs folded into `reason="other"`.
    pub folded: u64,
    /// Per cgroup (its name, or "other"): sleeps and run-queue waits, and their ns.
    pub cgroups: Vec<(String, u64, u64)>,
    /// Cgroups folded into `cgroup="other"`.
    pub cgroups_folded: u64,
    pub counters: Counters,
    /// The check of lost and recovered sleeps against the switches the kernel hid.
    pub hidden: HiddenSleeps,
    /// The kernel's run-time statistics of latprof's programs: (name, run time ns, runs).
    pub programs: Vec<(String, u64, u64)>,
    pub cpus: Vec<CpuTicks>,
    /// Reads of the kernel's tables so far.
    pub collections: u64,
    /// The kernel's tables: (name, entries in use at the latest read, capacity).
    pub tables: Vec<(&'static str, u64, u64)>,
    pub mode: &'static str,
}

/// `le` of bucket `i`: 2^(i+1) microseconds, in seconds.
fn bucket_le(i: usize) -> String {
    seconds((1u64 << (i + 1)) * 1000)
}

/// The live exposition in `flavor`.
#[must_use]
pub fn render_live(live: &Live, flavor: Flavor) -> String {
    let mut out = String::with_capacity(256 + live.series.len() * 3000);
    let labels: Vec<String> = live
        .series
        .iter()
        .map(|s| format!("reason=\"{}\",state=\"{}\"", label(&s.reason), s.state))
        .collect();
    family_in(
        flavor,
        &mut out,
        "latprof_sleeps",
        "counter",
        None,
        "Sleeps (S, D) and run-queue waits (R) counted, by reason and state.",
    );
    for (s, l) in live.series.iter().zip(&labels) {
        let _ = writeln!(out, "latprof_sleeps_total{{{l}}} {}", s.count);
    }
    family_in(
        flavor,
        &mut out,
        "latprof_sleep_seconds",
        "counter",
        Some("seconds"),
        "Time spent in those sleeps and waits, by reason and state.",
    );
    for (s, l) in live.series.iter().zip(&labels) {
        let _ = writeln!(
            out,
            "latprof_sleep_seconds_total{{{l}}} {}",
            seconds(s.total_ns)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_sleep_duration_seconds",
        "histogram",
        Some("seconds"),
        "Length of single sleeps and waits in the kernel's log2 buckets, by reason and state.",
    );
    for (s, l) in live.series.iter().zip(&labels) {
        let mut acc = 0u64;
        for (i, n) in s.buckets.iter().enumerate().take(HIST_BUCKETS - 1) {
            acc += n;
            let _ = writeln!(
                out,
                "latprof_sleep_duration_seconds_bucket{{{l},le=\"{}\"}} {acc}",
                bucket_le(i)
            );
        }
        acc += s.buckets[HIST_BUCKETS - 1];
        let _ = writeln!(
            out,
            "latprof_sleep_duration_seconds_bucket{{{l},le=\"+Inf\"}} {acc}"
        );
        let _ = writeln!(out, "latprof_sleep_duration_seconds_count{{{l}}} {acc}");
        let _ = writeln!(
            out,
            "latprof_sleep_duration_seconds_sum{{{l}}} {}",
            seconds(s.total_ns)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_folded_series",
        "gauge",
        None,
        "Distinct (reason, state) series over --max-series, counted under reason=\"other\".",
    );
    let _ = writeln!(out, "latprof_folded_series {}", live.folded);
    family_in(
        flavor,
        &mut out,
        "latprof_cgroup_sleeps",
        "counter",
        None,
        "Sleeps and run-queue waits counted, by cgroup v2 (systemd unit, container, pod).",
    );
    for (name, count, _) in &live.cgroups {
        let _ = writeln!(
            out,
            "latprof_cgroup_sleeps_total{{cgroup=\"{}\"}} {count}",
            label(name)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_cgroup_sleep_seconds",
        "counter",
        Some("seconds"),
        "Time spent in those sleeps and waits, by cgroup v2.",
    );
    for (name, _, ns) in &live.cgroups {
        let _ = writeln!(
            out,
            "latprof_cgroup_sleep_seconds_total{{cgroup=\"{}\"}} {}",
            label(name),
            seconds(*ns)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_folded_cgroups",
        "gauge",
        None,
        "Cgroups over --max-cgroups, counted under cgroup=\"other\".",
    );
    let _ = writeln!(out, "latprof_folded_cgroups {}", live.cgroups_folded);
    family_in(
        flavor,
        &mut out,
        "latprof_pipeline_events",
        "counter",
        None,
        "latprof's own event pipeline: what it tracked, skipped and lost (spikes included).",
    );
    for c in Counter::ALL {
        let _ = writeln!(
            out,
            "latprof_pipeline_events_total{{counter=\"{}\"}} {}",
            c.name(),
            live.counters.get(c)
        );
    }
    hidden_sleeps(flavor, &mut out, &live.hidden, None);
    family_in(
        flavor,
        &mut out,
        "latprof_dropped",
        "counter",
        None,
        "Everything lost or left out, by kind (sleep_lost: sleeps whose wakeup the kernel hid).",
    );
    for c in Counter::ALL.into_iter().filter(|c| c.loss().is_some()) {
        let _ = writeln!(
            out,
            "latprof_dropped_total{{kind=\"{}\"}} {}",
            c.name(),
            live.counters.get(c)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_program_runs",
        "counter",
        None,
        "Runs of each of latprof's eBPF programs (the kernel's BPF run-time statistics).",
    );
    for (name, _, runs) in &live.programs {
        let _ = writeln!(
            out,
            "latprof_program_runs_total{{program=\"{}\"}} {runs}",
            label(name)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_program_run_seconds",
        "counter",
        Some("seconds"),
        "Kernel time spent in each of latprof's eBPF programs.",
    );
    for (name, ns, _) in &live.programs {
        let _ = writeln!(
            out,
            "latprof_program_run_seconds_total{{program=\"{}\"}} {}",
            label(name),
            seconds(*ns)
        );
    }
    family_in(
        flavor,
        &mut out,
        "latprof_cpu_events",
        "counter",
        None,
        "Per CPU: timer ticks, tick stops (stopped, kept, kept by dependency), switches, user enter/exit.",
    );
    cpu_events(&mut out, &live.cpus);
    family_in(
        flavor,
        &mut out,
        "latprof_table_entries",
        "gauge",
        None,
        "Entries in use in latprof's kernel tables (tasks: live tasks tracked; records: global causes; stacks: backtraces the records name; histograms: per cgroup and cause; cgroups: exited tasks' causes per cgroup; wakers, with --wakers: per cause, sleeper and waker, summed over CPUs).",
    );
    for (table, used, _) in &live.tables {
        let _ = writeln!(out, "latprof_table_entries{{table=\"{table}\"}} {used}");
    }
    family_in(
        flavor,
        &mut out,
        "latprof_table_capacity",
        "gauge",
        None,
        "Capacity of latprof's kernel tables (--max-tasks, --max-records, --max-stacks, --max-records, --max-records, --max-wakers per CPU).",
    );
    for (table, _, size) in &live.tables {
        let _ = writeln!(out, "latprof_table_capacity{{table=\"{table}\"}} {size}");
    }
    family_in(
        flavor,
        &mut out,
        "latprof_collections",
        "counter",
        None,
        "Reads of the kernel's tables by latprof serve.",
    );
    let _ = writeln!(out, "latprof_collections_total {}", live.collections);
    family_in(
        flavor,
        &mut out,
        "latprof_info",
        "gauge",
        None,
        "latprof's version and mode.",
    );
    let _ = writeln!(
        out,
        "latprof_info{{version=\"{}\",mode=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        live.mode
    );
    if flavor == Flavor::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
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

//! What `latprof serve` answers at /metrics: per reason and state, with histograms and
//! latprof's health, in OpenMetrics 1.0 or Prometheus text 0.0.4.

use std::fmt::Write as _;

use latprof_common::{Counter, HIST_BUCKETS};

use super::{Flavor, Process, cpu_events, family_in, hidden_sleeps, label, seconds};
use crate::{
    collect::{Counters, HiddenSleeps},
    export::counters::CpuTicks,
};

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
    /// The full id of each cgroup label that names a container (`container_id` label).
    pub container_ids: std::collections::BTreeMap<String, String>,
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

/// `le` of each bucket but the last: 2^(i+1) microseconds, in seconds; formatted once, not
/// once per series and scrape.
static BUCKET_LE: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    (0..HIST_BUCKETS - 1)
        .map(|i| seconds((1u64 << (i + 1)) * 1000))
        .collect()
});

/// The live exposition in `flavor`, with latprof's own `process` (read at the scrape).
#[must_use]
pub fn render_live(live: &Live, process: Option<&Process>, flavor: Flavor) -> String {
    let mut out = render_live_body(live, flavor);
    out.push_str(&render_live_tail(process, flavor));
    out
}

/// The live exposition up to latprof's own process metrics: what one read of the kernel's
/// tables gives, the same for every scrape until the next read.
#[must_use]
pub fn render_live_body(live: &Live, flavor: Flavor) -> String {
    let mut out = String::with_capacity(4096 + live.series.len() * 3500);
    series(&mut out, live, flavor);
    cgroups(&mut out, live, flavor);
    pipeline(&mut out, live, flavor);
    tables(&mut out, live, flavor);
    out
}

/// The rest: latprof's own `process` (read at the scrape) and the end of the exposition.
#[must_use]
pub fn render_live_tail(process: Option<&Process>, flavor: Flavor) -> String {
    let mut out = String::with_capacity(2048);
    super::process::render(&mut out, process, flavor);
    if flavor == Flavor::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

/// `n` in decimal, without the formatting machinery.
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// Each (reason, state) series: counts, time and histogram; how many were folded.
fn series(out: &mut String, live: &Live, flavor: Flavor) {
    let labels: Vec<String> = live
        .series
        .iter()
        .map(|s| format!("reason=\"{}\",state=\"{}\"", label(&s.reason), s.state))
        .collect();
    family_in(
        flavor,
        out,
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
        out,
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
        out,
        "latprof_sleep_duration_seconds",
        "histogram",
        Some("seconds"),
        "Length of single sleeps and waits in the kernel's log2 buckets, by reason and state.",
    );
    for (s, l) in live.series.iter().zip(&labels) {
        // Pieces pushed, not formatted: a series is 35 lines, 500 series a scrape.
        let mut acc = 0u64;
        for (n, le) in s.buckets.iter().zip(BUCKET_LE.iter()) {
            acc += n;
            out.push_str("latprof_sleep_duration_seconds_bucket{");
            out.push_str(l);
            out.push_str(",le=\"");
            out.push_str(le);
            out.push_str("\"} ");
            push_u64(out, acc);
            out.push('\n');
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
        out,
        "latprof_folded_series",
        "gauge",
        None,
        "Distinct (reason, state) series over --max-series, counted under reason=\"other\".",
    );
    let _ = writeln!(out, "latprof_folded_series {}", live.folded);
}

/// A cgroup series' labels: its name, and the full id of the container it is, where it is one
/// (one id per name: the series stay as many as `--max-cgroups`).
fn cgroup_labels(live: &Live, name: &str) -> String {
    match live.container_ids.get(name) {
        Some(id) => format!("cgroup=\"{}\",container_id=\"{}\"", label(name), label(id)),
        None => format!("cgroup=\"{}\"", label(name)),
    }
}

/// Each cgroup's sleeps and time; how many were folded.
fn cgroups(out: &mut String, live: &Live, flavor: Flavor) {
    family_in(
        flavor,
        out,
        "latprof_cgroup_sleeps",
        "counter",
        None,
        "Sleeps and run-queue waits counted, by cgroup v2 (systemd unit, container, pod).",
    );
    for (name, count, _) in &live.cgroups {
        let _ = writeln!(
            out,
            "latprof_cgroup_sleeps_total{{{}}} {count}",
            cgroup_labels(live, name)
        );
    }
    family_in(
        flavor,
        out,
        "latprof_cgroup_sleep_seconds",
        "counter",
        Some("seconds"),
        "Time spent in those sleeps and waits, by cgroup v2.",
    );
    for (name, _, ns) in &live.cgroups {
        let _ = writeln!(
            out,
            "latprof_cgroup_sleep_seconds_total{{{}}} {}",
            cgroup_labels(live, name),
            seconds(*ns)
        );
    }
    family_in(
        flavor,
        out,
        "latprof_folded_cgroups",
        "gauge",
        None,
        "Cgroups over --max-cgroups, counted under cgroup=\"other\".",
    );
    let _ = writeln!(out, "latprof_folded_cgroups {}", live.cgroups_folded);
}

/// latprof's own pipeline: its events, the hidden-switch check, losses, programs' runs and time, each CPU's tick events.
fn pipeline(out: &mut String, live: &Live, flavor: Flavor) {
    family_in(
        flavor,
        out,
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
    hidden_sleeps(flavor, out, &live.hidden, None);
    family_in(
        flavor,
        out,
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
        out,
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
        out,
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
        out,
        "latprof_cpu_events",
        "counter",
        None,
        "Per CPU: timer ticks, tick stops (stopped, kept, kept by dependency), switches, user enter/exit.",
    );
    cpu_events(out, &live.cpus);
}

/// latprof's kernel tables, reads and mode.
fn tables(out: &mut String, live: &Live, flavor: Flavor) {
    family_in(
        flavor,
        out,
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
        out,
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
        out,
        "latprof_collections",
        "counter",
        None,
        "Reads of the kernel's tables by latprof serve.",
    );
    let _ = writeln!(out, "latprof_collections_total {}", live.collections);
    family_in(
        flavor,
        out,
        "latprof_mode_info",
        "gauge",
        None,
        "latprof's mode (lazy: per-task data merged at exit; normal: global data on every sleep) (1).",
    );
    let _ = writeln!(out, "latprof_mode_info{{mode=\"{}\"}} 1", live.mode);
}

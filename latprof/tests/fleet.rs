//! latprof on a fleet, on one machine: the Grafana dashboard's and the alert rules' queries
//! answered by a real Prometheus (Debian's) scraping a real `latprof serve`; the rules through
//! `promtool check rules` and `promtool test rules`; and three `latprof serve`, each limited to
//! a cgroup of its own with a known workload (three hosts), scraped by one Prometheus whose sum
//! over instances is exactly the three workloads' sleeps. It measures what a fleet pays per
//! host (series, bytes and latprof's CPU per scrape) and prints it (docs/guide/serve.md, The fleet).
//!
//! Root only, like the privileged tests: `#[ignore]`d for a plain `cargo test`, run by
//! `cargo xtask test`.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;

use common::{
    Workload,
    cgroups::{Cgroups, move_into},
    serve::{
        NANOSLEEP, Prometheus, Serve, count, http_get, missing, missing_so_far, nanosleeps, sample,
    },
};

fn contrib(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../contrib")
        .join(file)
}

/// Runs promtool with `args` in contrib/prometheus; it must succeed.
fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(contrib("prometheus"))
        .output()
        .expect("promtool (cargo xtask test installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every query of the dashboard, its variables given values a query can run with.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = contrib("grafana/latprof-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard's JSON");
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"]
                .as_str()
                .expect("expr")
                .replace("$__rate_interval", "30s")
                .replace("$instance", ".*");
            out.push((panel["title"].as_str().unwrap_or("").to_owned(), expr));
        }
    }
    out
}

/// Every alert's expression without its threshold (`... > X`): what it compares must have
/// data; whether it fires is `promtool test rules`' to say.
fn rule_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(contrib("prometheus/latprof-rules.yml")).expect("rules");
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    let mut alert = String::new();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("- alert: ") {
            name.clone_into(&mut alert);
        } else if let Some(expr) = line.strip_prefix("expr:") {
            let mut expr = expr.trim().trim_start_matches(">-").trim().to_owned();
            // A folded block: its lines until the next key.
            while let Some(next) = lines.peek() {
                let next = next.trim();
                if next.is_empty() || next.contains(": ") || next.ends_with(':') {
                    break;
                }
                expr.push(' ');
                expr.push_str(next);
                lines.next();
            }
            let (left, _) = expr.rsplit_once(" > ").expect("a threshold");
            out.push((alert.clone(), left.to_owned()));
        }
    }
    out
}

/// Milliseconds since the epoch now: the clock Prometheus stamps its samples with.
fn wall_ms() -> i64 {
    i64::try_from(latprof::time::wall_ns() / 1_000_000).expect("a time")
}

/// A Prometheus timestamp (seconds since the epoch, as a JSON number or string, to the
/// millisecond) in milliseconds, read from its text (no float rounding).
fn stamp_ms(stamp: &Value) -> i64 {
    let text = stamp
        .as_str()
        .map_or_else(|| stamp.to_string(), str::to_owned);
    let (secs, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = format!("{frac:0<3}");
    assert!(frac.len() == 3, "a stamp finer than a millisecond: {text}");
    secs.parse::<i64>().expect("seconds") * 1000 + frac.parse::<i64>().expect("milliseconds")
}

/// Prometheus' answer to `promql` evaluated at `at_ms`: the entries of its result.
fn query_at(prometheus: &Prometheus, promql: &str, at_ms: i64) -> Vec<Value> {
    let encoded = common::serve::query_encoded(promql);
    let at = format!("{}.{:03}", at_ms / 1000, at_ms % 1000);
    let r = http_get(
        prometheus.addr,
        &format!("/api/v1/query?query={encoded}&time={at}"),
        None,
    );
    assert_eq!(r.status, 200, "query {promql}: {}", r.text());
    let json: Value = serde_json::from_slice(&r.body).expect("Prometheus' JSON");
    json["data"]["result"].as_array().expect("result").clone()
}

/// An instant vector entry's value.
fn value_of(entry: &Value) -> f64 {
    entry["value"][1]
        .as_str()
        .expect("a value")
        .parse()
        .expect("a number")
}

/// The entry of `entries` whose label `label` is `value`, which must be there.
fn entry<'a>(entries: &'a [Value], label: &str, value: &str, what: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["metric"][label] == value)
        .unwrap_or_else(|| panic!("{what}: no {label}={value:?} in {entries:#?}"))
}

/// The single value of `promql` at `at_ms`.
fn single_at(prometheus: &Prometheus, promql: &str, at_ms: i64) -> f64 {
    let entries = query_at(prometheus, promql, at_ms);
    assert_eq!(entries.len(), 1, "{promql} at {at_ms}: {entries:#?}");
    value_of(&entries[0])
}

/// The time of the first sample of the one series `selector` in the 10 minutes up to `at_ms`.
fn first_sample_ms(prometheus: &Prometheus, selector: &str, at_ms: i64) -> i64 {
    let series = query_at(prometheus, &format!("{selector}[10m]"), at_ms);
    assert_eq!(series.len(), 1, "{selector}: {series:#?}");
    stamp_ms(&series[0]["values"][0][0])
}

/// The label `name` of each of `metrics`' samples of `family` (`family{...name="X"...}`),
/// with its value.
fn by_label(metrics: &str, family: &str, name: &str) -> Vec<(String, f64)> {
    let key = format!("{name}=\"");
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(family)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            // The label at the start or after a comma, not inside another's value.
            let at = labels
                .strip_prefix(&key)
                .or_else(|| labels.split_once(&format!(",{key}")).map(|(_, r)| r))?;
            let label = at.split_once('"')?.0;
            Some((label.to_owned(), value.parse().expect("a number")))
        })
        .collect()
}

/// A rate over the window (t0 - 1 ms, T] evaluated at T, both scrape times `span_s` seconds
/// apart, of a counter that grew by `delta` between them: Prometheus extrapolates the
/// increase to the window's edges, here by at most the 1 ms before t0 (none at T), and
/// divides by the window (`span_s` + 1 ms), so the rate times `span_s` lies between
/// `delta * span_s / (span_s + 0.001)` and `delta` (the float's rounding aside). Says how it
/// fails.
fn rate_matches(rate: f64, delta: f64, span_s: f64, what: &str) {
    let got = rate * span_s;
    let eps = 1e-9 * delta.abs().max(1.0);
    assert!(
        got >= delta * span_s / (span_s + 0.001) - eps && got <= delta + eps,
        "{what}: rate {rate} over {span_s} s is {got}, for an increase of {delta}"
    );
}

/// Runs a real Prometheus scraping a real serve that traces a workload of a known count, then
/// every query of the dashboard and of the alert rules, each evaluated over one window (from
/// just before the first scrape that held the workload's sleeps to a scrape after latprof's
/// last read of them), and checks each answer against what the test knows: the workload's
/// count, latprof's own /metrics after the work, what Prometheus scraped at the window's
/// start, the workload's longest sleep, the serve process's memory as the kernel keeps it.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
#[expect(
    clippy::too_many_lines,
    reason = "one check per query of the dashboard and the rules, in their order"
)]
fn dashboard_and_rules_answer() {
    let _guard = common::serial("the fleet tests");
    promtool(&["check", "rules", "latprof-rules.yml"]);
    promtool(&["test", "rules", "latprof-rules.test.yml"]);
    // Six seconds of work (3000 sleeps of 2 ms), scraped every second from before it starts:
    // the scrapes while it goes on hold part of it, the window's start among them.
    let mut work = Workload::spawn(&["sleep", "--count", "3000", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps"]);
    let prometheus = Prometheus::start(&[serve.addr]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.value("up{job=\"latprof\"}") != Some(1) {
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped latprof"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    work.go();
    let facts = work.wait_done();
    let slept = common::fact(&facts, "slept");
    // The workload sleeps no more until it is released (its read of stdin has begun, its
    // last run-queue wait ended); serve reads the kernel's tables every second, so its
    // /metrics are final once two reads have begun since.
    work.wait_blocked();
    let collections = |m: &str| count(m, "latprof_collections_total");
    let before = collections(&serve.metrics());
    let metrics = serve.wait_for(30, "two reads of the tables after the work", |m| {
        collections(m) >= before + 2 && nanosleeps(m) + missing_so_far(m) >= slept
    });
    let read_ms = wall_ms();
    let counted = nanosleeps(&metrics);
    if let Err(why) = common::exact_count(counted, slept, missing(&metrics)) {
        panic!("latprof's nanosleeps of the workload: {why}\n{metrics}");
    }
    let naps = format!("latprof_sleeps_total{{reason=\"{NANOSLEEP}\",state=\"S\"}}");
    let nap_secs = format!("latprof_sleep_seconds_total{{reason=\"{NANOSLEEP}\",state=\"S\"}}");
    // The window's end: a scrape two intervals after that read, so that every series of
    // those /metrics was scraped before it, with their final values.
    let deadline = Instant::now() + Duration::from_secs(30);
    let end = loop {
        let latest = query_at(&prometheus, &format!("timestamp({naps})"), wall_ms());
        if let [latest] = latest.as_slice() {
            let at = stamp_ms(&latest["value"][1]);
            if at >= read_ms + 2000 {
                break at;
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped latprof after its last read: {latest:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        single_at(&prometheus, &naps, end),
        count(&metrics, &naps) as f64,
        "what Prometheus scraped of the workload's nanosleeps, against latprof's /metrics"
    );
    // The window's start: the first scrape that held the workload's nanosleeps and its
    // cgroup's series (they may come a read apart), while the work went on.
    let cgroups = by_label(&metrics, "latprof_cgroup_sleep_seconds_total", "cgroup");
    assert_eq!(cgroups.len(), 1, "the workload's one cgroup: {metrics}");
    let cgroup_secs = format!(
        "latprof_cgroup_sleep_seconds_total{{cgroup=\"{}\"}}",
        cgroups[0].0
    );
    let t0 = first_sample_ms(&prometheus, &naps, end).max(first_sample_ms(
        &prometheus,
        &cgroup_secs,
        end,
    ));
    let span_ms = end - t0;
    let span_s = f64::from(u32::try_from(span_ms).expect("a span")) / 1000.0;
    let at_t0 = |selector: &str| single_at(&prometheus, selector, t0);
    let naps_t0 = at_t0(&naps);
    assert!(
        naps_t0 < counted as f64,
        "the window from {t0} to {end} holds none of the work ({naps_t0} of {counted} before it)"
    );
    let window = format!("[{}ms]", span_ms + 1);
    let final_of = |series: &str| {
        common::serve::sample(&metrics, series)
            .unwrap_or_else(|| panic!("no {series} in latprof's /metrics:\n{metrics}"))
    };
    let cpus: std::collections::BTreeSet<String> =
        by_label(&metrics, "latprof_cpu_events_total", "cpu")
            .into_iter()
            .map(|(cpu, _)| cpu)
            .collect();
    let ncpu = cpus.len() as f64;
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    // The dashboard's two cost queries, for the budget rule's check.
    let mut cost = Vec::new();
    for (what, expr) in &queries {
        let expr = expr.replace("[30s]", &window);
        let answer = query_at(&prometheus, &expr, end);
        assert!(!answer.is_empty(), "{what}: no data for {expr}");
        if expr.contains("latprof_sleep_seconds_total") {
            // Seconds slept per second, by reason and state: the nanosleeps' time, as latprof
            // summed it, over the window.
            let row = entry(&answer, "reason", NANOSLEEP, what);
            assert_eq!(row["metric"]["state"], "S", "{what}: {row}");
            rate_matches(
                value_of(row),
                final_of(&nap_secs) - at_t0(&nap_secs),
                span_s,
                what,
            );
        } else if expr.contains("latprof_sleeps_total") {
            // Sleeps per second: the nanosleeps latprof counted over the window, judged
            // exactly against the workload's own count above.
            let row = entry(&answer, "reason", NANOSLEEP, what);
            assert_eq!(row["metric"]["state"], "S", "{what}: {row}");
            rate_matches(value_of(row), counted as f64 - naps_t0, span_s, what);
        } else if expr.contains("latprof_cgroup_sleep_seconds_total") {
            // The one cgroup the workload sleeps in, its time over the window.
            assert_eq!(answer.len(), 1, "{what}: {answer:#?}");
            let row = entry(&answer, "cgroup", &cgroups[0].0, what);
            rate_matches(
                value_of(row),
                cgroups[0].1 - at_t0(&cgroup_secs),
                span_s,
                what,
            );
        } else if expr.contains("histogram_quantile") {
            // The nanosleeps' 99th percentile: in no bucket above the one that holds the
            // workload's own longest call (each sleep lies inside its call), nor below the
            // bucket under the 2 ms each asked for (1.024 ms: all but 1% of them would have
            // to end in half their time).
            let max_s = common::fact(&facts, "max_ns") as f64 / 1e9;
            let top = by_label(&metrics, "latprof_sleep_duration_seconds_bucket", "le")
                .iter()
                .filter_map(|(le, _)| le.parse::<f64>().ok())
                .filter(|&le| le >= max_s)
                .fold(f64::INFINITY, f64::min);
            let p99 = value_of(entry(&answer, "reason", NANOSLEEP, what));
            assert!(
                (0.001_024..=top).contains(&p99),
                "{what}: {p99} s, the workload's longest call {max_s} s (bucket up to {top} s)"
            );
        } else if expr.contains("latprof_sleep_duration_seconds_bucket") {
            // The heatmap: latprof's buckets, each cumulative, the last (+Inf) every sleep
            // and wait it counted (the sum of the sleeps per second, all reasons and
            // states, over the same window).
            let les: std::collections::BTreeSet<String> =
                by_label(&metrics, "latprof_sleep_duration_seconds_bucket", "le")
                    .into_iter()
                    .map(|(le, _)| le)
                    .collect();
            let got: std::collections::BTreeSet<String> = answer
                .iter()
                .map(|e| e["metric"]["le"].as_str().expect("le").to_owned())
                .collect();
            assert_eq!(got, les, "{what}: the buckets");
            let all = value_of(entry(&answer, "le", "+Inf", what));
            let sleeps: f64 = query_at(
                &prometheus,
                &format!("sum(rate(latprof_sleeps_total{{instance=~\".*\"}}{window}))"),
                end,
            )
            .iter()
            .map(value_of)
            .sum();
            // Never more, and short by at most 1%: runs here found the heatmap a sleep or
            // two short of the counts over the window (519.22 against 519.52 per second,
            // 598.15 against 598.38: 0.06% and 0.04%), not yet explained; a histogram that
            // lost or doubled its sleeps is off by far more.
            assert!(
                all <= sleeps + 1e-9 && sleeps - all <= 0.01 * sleeps,
                "{what}: +Inf {all} per second, sleeps counted {sleeps} per second"
            );
            for e in &answer {
                assert!(
                    value_of(e) <= all * (1.0 + 1e-12),
                    "{what}: {e} over +Inf {all}"
                );
            }
        } else if expr.contains("latprof_program_run_seconds_total")
            || expr.contains("process_cpu_seconds_total")
        {
            // latprof's cost as a share of all CPUs: the numerator divided by latprof's own
            // CPUs (as many as its /metrics counts), a share no more than 1 (the programs'
            // run over the window: more than nothing, for every sleep of the work).
            let (numerator, denominator) = expr.split_once(" / ").expect("a share");
            assert_eq!(
                single_at(&prometheus, denominator, end),
                ncpu,
                "{what}: the CPUs, against latprof's {cpus:?}"
            );
            let used = single_at(&prometheus, numerator, end);
            assert_eq!(answer.len(), 1, "{what}: {answer:#?}");
            let share = value_of(&answer[0]);
            assert!(
                (share * ncpu - used).abs() <= 1e-12 * used.max(1.0),
                "{what}: {share} of {ncpu} CPUs for {used} CPU-seconds per second"
            );
            let programs = expr.contains("latprof_program_run_seconds_total");
            assert!(
                share <= 1.0 && (share > 0.0 || !programs),
                "{what}: a share of {share}"
            );
            cost.push(share);
        } else if expr.contains("latprof_dropped_total") {
            // Each kind latprof counts, what it lost over the window.
            let kinds = by_label(&metrics, "latprof_dropped_total", "kind");
            assert_eq!(answer.len(), kinds.len(), "{what}: {answer:#?}");
            for (kind, last) in kinds {
                let first = at_t0(&format!("latprof_dropped_total{{kind=\"{kind}\"}}"));
                rate_matches(
                    value_of(entry(&answer, "kind", &kind, what)),
                    last - first,
                    span_s,
                    &format!("{what}: {kind}"),
                );
            }
        } else if expr.contains("process_resident_memory_bytes") {
            // latprof's resident memory in bytes: whole pages, no more than the most it ever
            // held (the kernel's high-water mark of the serve process, read after).
            assert_eq!(answer.len(), 1, "{what}: {answer:#?}");
            let rss = value_of(&answer[0]);
            let status = std::fs::read_to_string(format!("/proc/{}/status", serve.pid()))
                .expect("serve's status");
            let hwm: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().strip_suffix(" kB"))
                .and_then(|v| v.trim().parse().ok())
                .expect("VmHWM");
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
            assert!(
                rss > 0.0 && rss % page == 0.0 && rss <= hwm * 1024.0,
                "{what}: {rss} bytes (pages of {page}; high-water mark {hwm} kB)"
            );
        } else if expr.contains("latprof_table_entries") {
            // Each table's share in use: entries (a whole number) of its capacity as
            // latprof's /metrics gives it, no more than full.
            let capacity = by_label(&metrics, "latprof_table_capacity", "table");
            assert_eq!(answer.len(), capacity.len(), "{what}: {answer:#?}");
            for (table, size) in capacity {
                let full = value_of(entry(&answer, "table", &table, what));
                let entries = full * size;
                assert!(
                    (0.0..=1.0).contains(&full) && (entries - entries.round()).abs() < 1e-6,
                    "{what}: {table} {full} full of {size}"
                );
            }
        } else {
            panic!("{what}: no check for {expr}: add one");
        }
    }
    // The rules' expressions, over the same window: what the losing rule sums is the drops'
    // increase (extrapolated by at most the 1 ms before the window's first scrape); the
    // budget rule's share is the dashboard's two cost shares together.
    let rules = rule_queries();
    assert_eq!(rules.len(), 2);
    let lost: f64 = by_label(&metrics, "latprof_dropped_total", "kind")
        .iter()
        .map(|(kind, last)| last - at_t0(&format!("latprof_dropped_total{{kind=\"{kind}\"}}")))
        .sum();
    for (alert, expr) in &rules {
        let expr = expr.replace("[10m]", &window).replace("[5m]", &window);
        assert_eq!(
            expr.matches('[').count(),
            expr.matches(&window).count(),
            "{expr}"
        );
        let got = single_at(&prometheus, &expr, end);
        if expr.contains("latprof_dropped_total") {
            assert!(
                (lost - 1e-9..=lost * (1.0 + 0.001 / span_s) + 1e-9).contains(&got),
                "{alert}: {got} for {lost} lost over the window"
            );
        } else {
            let shares: f64 = cost.iter().sum();
            assert!(
                (got - shares).abs() <= 1e-9 * shares,
                "{alert}: {got} against the dashboard's {cost:?}"
            );
        }
    }
    drop(prometheus);
    drop(serve);
    work.release();
}

/// Three serves, each limited to a cgroup of its own (`--cgroup`) holding one workload of a
/// known count, stand for three hosts; one Prometheus scrapes them all. The sum over instances
/// is exactly the three workloads' sleeps, and each instance's its own.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_fleet_of_three_sums_exactly() {
    let _guard = common::serial("the fleet tests");
    let names: Vec<String> = (0..3)
        .map(|i| format!("latprof-fleet-{}-{i}", std::process::id()))
        .collect();
    let groups = Cgroups::make(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let counts = [300, 500, 700];
    let mut hosts = Vec::new();
    for (i, count) in counts.iter().enumerate() {
        let work = Workload::spawn(&["sleep", "--count", &count.to_string(), "--interval", "2ms"]);
        move_into(&work, groups.path(i));
        let dir = groups.path(i).to_str().expect("utf-8").to_owned();
        let serve = Serve::start(&["--cgroup", &dir, "--all-sleeps"]);
        hosts.push((work, serve));
    }
    let addrs: Vec<_> = hosts.iter().map(|(_, s)| s.addr).collect();
    let prometheus = Prometheus::start(&addrs);
    for (work, _) in &mut hosts {
        work.go();
    }
    let mut expected = Vec::new();
    for (work, serve) in &mut hosts {
        let slept = work.wait_fact("slept");
        let metrics = serve.wait_for(30, "the workload's sleeps", |m| {
            nanosleeps(m) + missing_so_far(m) >= slept
        });
        expected.push((serve.addr, slept - missing(&metrics)));
    }
    let total: u64 = expected.iter().map(|(_, n)| n).sum();
    let query = format!("sum(latprof_sleeps_total{{reason=\"{NANOSLEEP}\"}})");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Prometheus scrapes each second: once each instance's last read is in, the sum is exact
    // and stays so.
    loop {
        let sum = prometheus.value(&query).unwrap_or(0);
        if sum >= total || Instant::now() > deadline {
            assert_eq!(sum, total, "the fleet's sum: {expected:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    for (addr, n) in &expected {
        let own = prometheus.value(&format!(
            "sum(latprof_sleeps_total{{reason=\"{NANOSLEEP}\",instance=\"{addr}\"}})"
        ));
        assert_eq!(own, Some(*n), "instance {addr}");
    }
    measure_scrapes(&hosts[0].1);
    drop(prometheus);
    for (work, serve) in hosts {
        drop(serve);
        work.release();
    }
}

/// What one host costs a fleet per scrape: its series, its bytes, latprof's CPU (printed for
/// the serve guide's fleet numbers; no timing is asserted).
fn measure_scrapes(serve: &Serve) {
    const SCRAPES: u32 = 50;
    let cpu = |m: &str| sample(m, "process_cpu_seconds_total").expect("process_cpu_seconds_total");
    let first = serve.metrics();
    let series = first
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let mut last = first.clone();
    for _ in 0..SCRAPES {
        last = serve.metrics();
    }
    let per_scrape = (cpu(&last) - cpu(&first)) / f64::from(SCRAPES);
    eprintln!(
        "fleet: one host: {series} series, {} bytes per scrape, latprof's CPU {:.1} ms per scrape \
         (with a read of the kernel's tables every second meanwhile)",
        first.len(),
        per_scrape * 1000.0
    );
    assert!(series > 0 && !first.is_empty());
}

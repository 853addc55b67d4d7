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

mod common;

use common::{
    Workload,
    cgroups::{Cgroups, move_into},
    serve::{NANOSLEEP, Prometheus, Serve, missing, missing_so_far, nanosleeps, sample},
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

/// Sleeps while a real Prometheus scrapes a real serve, then runs every query of the
/// dashboard and of the alert rules: each must return data.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn dashboard_and_rules_answer() {
    let _guard = common::serial("the fleet tests");
    promtool(&["check", "rules", "latprof-rules.yml"]);
    promtool(&["test", "rules", "latprof-rules.test.yml"]);
    let mut work = Workload::spawn(&["sleep", "--count", "1500", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps"]);
    let prometheus = Prometheus::start(&[serve.addr]);
    work.go();
    let slept = work.wait_fact("slept");
    serve.wait_for(30, "the workload's sleeps", |m| {
        nanosleeps(m) + missing_so_far(m) >= slept
    });
    // Scrapes after the work: every rate has an increase to show.
    let deadline = Instant::now() + Duration::from_secs(30);
    let total = format!("sum(latprof_sleeps_total{{reason=\"{NANOSLEEP}\"}})");
    while prometheus.value(&total).unwrap_or(0) < slept - missing(&serve.metrics()) {
        assert!(Instant::now() < deadline, "prometheus never saw the sleeps");
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(3));
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    for (what, expr) in queries.iter().chain(&rule_queries()) {
        let samples = prometheus.query(expr);
        assert!(!samples.is_empty(), "{what}: no data for {expr}");
    }
    assert_eq!(rule_queries().len(), 2);
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

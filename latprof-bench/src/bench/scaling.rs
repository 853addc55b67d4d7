//! The scaling series: one ping-pong pinned to each of 1, 2, ... N CPUs at once, with no
//! tracer, lazy and normal. Lazy mode's scheduler hooks write no data another CPU reads, so
//! its cost per event should stay flat as CPUs are added; normal mode adds every sleep to
//! records all CPUs share. The table is ready for a machine with more CPUs than this one.
use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    configs::{Config, Workload},
    summary::Summary,
};

/// The series' workloads: `scaling-K` runs K ping-pongs of `trips` round trips, the one on
/// CPU i pinned there, all at once (none when `cpus` is 0).
pub(super) fn workloads(workload: &str, cpus: usize, trips: u64) -> Vec<Workload> {
    (1..=cpus)
        .map(|k| {
            // Each side waited for: a failed ping-pong fails the run.
            let script = format!(
                "pids=; for c in $(seq 0 {last}); do '{workload}' pingpong --processes --cpu $c --count {trips} & pids=\"$pids $!\"; done; for p in $pids; do wait $p || exit 1; done",
                last = k - 1
            );
            Workload {
                name: format!("scaling-{k}"),
                command: vec!["sh".into(), "-c".into(), script],
                units: trips * k as u64,
                unit: "round trip",
                configs: vec![Config::None, Config::Lazy, Config::Normal],
            }
        })
        .collect()
}

/// The scaling table: per CPU count, round trips per second under each configuration (and
/// their ratio to no tracer), BPF ns per event, and each one's throughput per CPU against
/// its own on one CPU. Empty without the series.
pub(super) fn table(works: &[Workload], s: &BTreeMap<(usize, Config), Summary>) -> String {
    let rows: Vec<(usize, [Option<&Summary>; 3], u64)> = works
        .iter()
        .enumerate()
        .filter_map(|(w, work)| {
            let k: usize = work.name.strip_prefix("scaling-")?.parse().ok()?;
            let get = |c| s.get(&(w, c));
            Some((
                k,
                [get(Config::None), get(Config::Lazy), get(Config::Normal)],
                work.units,
            ))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    // Round trips per second.
    let rate = |sum: Option<&Summary>, units: u64| {
        sum.map_or(f64::NAN, |x| units as f64 * 1e3 / x.wall_ms)
    };
    let one: Vec<f64> = (0..3).map(|i| rate(rows[0].1[i], rows[0].2)).collect();
    let mut md = String::from(
        "\n## scaling: one pinned ping-pong per CPU, 1 to N CPUs at once\n\n\
         Round trips per second (ratio to no tracer), BPF ns per event, and throughput per CPU \
         against each configuration's own on one CPU (1.00: scales perfectly).\n\n\
         | CPUs | none trips/s | lazy trips/s | normal trips/s | lazy BPF ns/event | normal BPF ns/event | per CPU vs 1: none | lazy | normal |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (k, sums, units) in &rows {
        let r: Vec<f64> = (0..3).map(|i| rate(sums[i], *units)).collect();
        let per_cpu: Vec<String> = (0..3)
            .map(|i| format!("{:.2}", r[i] / *k as f64 / one[i]))
            .collect();
        let ns = |i: usize| sums[i].map_or(f64::NAN, |x| x.bpf_ns_per_event);
        let _ = writeln!(
            md,
            "| {k} | {:.0} | {:.0} ({:.2}) | {:.0} ({:.2}) | {:.0} | {:.0} | {} |",
            r[0],
            r[1],
            r[1] / r[0],
            r[2],
            r[2] / r[0],
            ns(1),
            ns(2),
            per_cpu.join(" | ")
        );
    }
    md
}

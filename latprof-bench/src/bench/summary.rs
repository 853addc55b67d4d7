//! A configuration's numbers over the rounds (medians against the no-tracer runs), and the
//! targets' verdicts that the report and each series' own targets share.
use std::collections::BTreeMap;

use super::{
    configs::{Config, Workload},
    measure::{Sample, median},
};

/// Summary of one (workload, configuration) over the rounds.
#[derive(Debug, Default)]
pub(super) struct Summary {
    pub(super) wall_ms: f64,
    pub(super) wall_min_ms: f64,
    pub(super) wall_max_ms: f64,
    pub(super) ratio: f64,
    pub(super) added_ns_per_switch: f64,
    pub(super) bpf_ns_per_event: f64,
    /// BPF ns per context switch of the machine in the run: per event, whatever programs a
    /// configuration loads (a program run is not an event when configurations add programs).
    pub(super) bpf_ns_per_switch: f64,
    pub(super) bpf_ns_per_unit: f64,
    /// BPF ns per unit in the programs whose work depends on the mode (every one but
    /// sched_switch, which runs the same code in lazy and normal mode).
    pub(super) mode_ns_per_unit: f64,
    pub(super) bpf_cpu_percent: f64,
    /// Context switches per second on the machine during the run (throughput of the sleepers).
    pub(super) switches_per_s: f64,
    pub(super) tracer_cpu_ms: f64,
    pub(super) tracer_rss_mb: f64,
    pub(super) map_kb: u64,
}

pub(super) fn summarize(samples: &[Sample], none: &[Sample], units: u64) -> Summary {
    let ms = |s: &Sample| s.wall_ns as f64 / 1e6;
    let walls: Vec<f64> = samples.iter().map(ms).collect();
    let base = median(none.iter().map(ms).collect());
    let base_switches = median(none.iter().map(|s| s.switches as f64).collect());
    let wall = median(walls.clone());
    Summary {
        wall_ms: wall,
        wall_min_ms: walls.iter().copied().fold(f64::INFINITY, f64::min),
        wall_max_ms: walls.iter().copied().fold(0.0, f64::max),
        ratio: if base > 0.0 { wall / base } else { 0.0 },
        added_ns_per_switch: if base_switches > 0.0 {
            (wall - base) * 1e6 / base_switches
        } else {
            0.0
        },
        bpf_ns_per_event: median(
            samples
                .iter()
                .filter(|s| s.bpf_runs > 0)
                .map(|s| s.bpf_ns as f64 / s.bpf_runs as f64)
                .collect(),
        ),
        bpf_ns_per_switch: median(
            samples
                .iter()
                .filter(|s| s.switches > 0)
                .map(|s| s.bpf_ns as f64 / s.switches as f64)
                .collect(),
        ),
        bpf_ns_per_unit: if units > 0 {
            median(
                samples
                    .iter()
                    .map(|s| s.bpf_ns as f64 / units as f64)
                    .collect(),
            )
        } else {
            0.0
        },
        mode_ns_per_unit: if units > 0 {
            median(
                samples
                    .iter()
                    .map(|s| {
                        s.per_program
                            .iter()
                            .filter(|(name, _)| !name.starts_with("sched_switch"))
                            .map(|(_, (ns, _))| *ns as f64)
                            .sum::<f64>()
                            / units as f64
                    })
                    .collect(),
            )
        } else {
            0.0
        },
        bpf_cpu_percent: median(
            samples
                .iter()
                .map(|s| s.bpf_ns as f64 * 100.0 / s.wall_ns.max(1) as f64)
                .collect(),
        ),
        switches_per_s: median(
            samples
                .iter()
                .map(|s| s.switches as f64 * 1e9 / s.wall_ns.max(1) as f64)
                .collect(),
        ),
        tracer_cpu_ms: median(
            samples
                .iter()
                .map(|s| s.tracer_cpu_ns as f64 / 1e6)
                .collect(),
        ),
        tracer_rss_mb: samples.iter().map(|s| s.tracer_rss_kb).max().unwrap_or(0) as f64 / 1024.0,
        map_kb: samples.iter().map(|s| s.map_kb).max().unwrap_or(0),
    }
}

/// A target: what it asks, its verdict (MET, MISSED, INFO) and this run's numbers.
pub(super) type Target = (String, &'static str, String);

/// The summary of workload `name` under `config`, where it ran.
pub(super) fn summary_of<'a>(
    works: &[Workload],
    s: &'a BTreeMap<(usize, Config), Summary>,
    name: &str,
    config: Config,
) -> Option<&'a Summary> {
    let w = works.iter().position(|w| w.name == name)?;
    s.get(&(w, config))
}

/// A target's verdict.
pub(super) fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

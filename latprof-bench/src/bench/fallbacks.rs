//! The fallback variants, measured on this kernel: latprof loads another build of its
//! programs where the kernel lacks what the best one uses, and hidden flags load those builds
//! here too, so that each is measured in the same rounds as lazy, runqlat and no tracer.
//! Issue 30's goals hold for each within 1.5x.
use std::collections::BTreeMap;

use super::{
    configs::{Config, Fallback, Workload},
    summary::{Summary, Target, summary_of, verdict},
};

/// Issue 30's goals within 1.5x, per fallback: the ping-pong at most 0.75x runqlat's BPF time
/// per round trip, hackbench's programs under 4.5% of one CPU's time, idle under 0.075% of
/// one CPU. Each with its verdict and numbers; a fallback not measured is left out.
pub(super) fn targets(works: &[Workload], s: &BTreeMap<(usize, Config), Summary>) -> Vec<Target> {
    let get = |name: &str, c: Config| summary_of(works, s, name, c);
    let mut out = Vec::new();
    for fallback in Fallback::ALL {
        let config = Config::LazyFallback(fallback);
        let name = fallback.name();
        if let (Some(f), Some(rq)) = (get("pingpong", config), get("pingpong", Config::Runqlat)) {
            let ratio = f.bpf_ns_per_unit / rq.bpf_ns_per_unit;
            out.push((
                format!(
                    "{name}, {}: ping-pong at most 0.75x runqlat's BPF time per round trip",
                    fallback.what()
                ),
                verdict(ratio <= 0.75),
                format!(
                    "{:.0} ns against {:.0} ns ({ratio:.2}x){}",
                    f.bpf_ns_per_unit,
                    rq.bpf_ns_per_unit,
                    get("pingpong", Config::Lazy).map_or(String::new(), |lazy| format!(
                        "; {:.2}x lazy's",
                        f.bpf_ns_per_unit / lazy.bpf_ns_per_unit
                    ))
                ),
            ));
        }
        for hb in ["hackbench-process", "hackbench-thread"] {
            if let Some(f) = get(hb, config) {
                out.push((
                    format!("{name}: {hb}, latprof's programs under 4.5% of one CPU's time"),
                    verdict(f.bpf_cpu_percent < 4.5),
                    format!("{:.2}%", f.bpf_cpu_percent),
                ));
            }
        }
        if let Some(f) = get("idle", config) {
            out.push((
                format!("{name}: idle under 0.075% of one CPU"),
                verdict(f.bpf_cpu_percent < 0.075),
                format!("{:.3}% in BPF", f.bpf_cpu_percent),
            ));
        }
    }
    out
}

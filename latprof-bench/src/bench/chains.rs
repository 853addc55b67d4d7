//! Wait chains (`--chains`, issue 31): their cost against lazy alone and lazy with wakers
//! (which chains imply), per event, on the ping-pong and hackbench; the budget is 1.5x lazy.
use std::collections::BTreeMap;

use super::{
    configs::{Config, Workload},
    summary::{Summary, Target, summary_of, verdict},
};

/// The chains' budget line, where this run measured them.
pub(super) fn targets(works: &[Workload], s: &BTreeMap<(usize, Config), Summary>) -> Vec<Target> {
    let get = |name: &str, c: Config| summary_of(works, s, name, c);
    let mut lines = Vec::new();
    let mut under = true;
    for name in ["pingpong", "hackbench-process", "hackbench-thread"] {
        let (Some(lazy), Some(chains)) = (get(name, Config::Lazy), get(name, Config::LazyChains))
        else {
            continue;
        };
        let ratio = chains.bpf_ns_per_event / lazy.bpf_ns_per_event;
        under &= ratio <= 1.5;
        let wakers = get(name, Config::LazyWakers).map_or(String::new(), |w| {
            format!(
                ", against --wakers {:.0} ns ({:.2}x)",
                w.bpf_ns_per_event,
                chains.bpf_ns_per_event / w.bpf_ns_per_event
            )
        });
        lines.push(format!(
            "{name}: lazy {:.0} ns/event, --chains {:.0} ns/event ({ratio:.2}x){wakers}",
            lazy.bpf_ns_per_event, chains.bpf_ns_per_event
        ));
    }
    if lines.is_empty() {
        return Vec::new();
    }
    vec![(
        "--chains at most 1.5x lazy's BPF time per event".to_owned(),
        verdict(under),
        lines.join("; "),
    )]
}

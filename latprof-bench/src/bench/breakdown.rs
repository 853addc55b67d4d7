//! The breakdown: what each part of latprof's hot programs costs, as lazy's BPF time less that
//! of lazy without the part (`--debug-skip`), per context switch and per program. Parts overlap
//! (accounting holds the histograms) and do not add up to lazy's time: what is left is the
//! programs' own skeleton (task lookups, clock reads, the hooks' floor).
use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    configs::{Config, Part, Workload},
    floor::per_hook,
    measure::{Sample, median},
};

/// Median BPF ns per context switch of the machine, all programs.
fn per_switch(samples: &[Sample]) -> f64 {
    median(
        samples
            .iter()
            .filter(|s| s.switches > 0)
            .map(|s| s.bpf_ns as f64 / s.switches as f64)
            .collect(),
    )
}

/// Median ns per run of the programs on `hook` (the floor table's per-hook medians).
fn per_run(samples: &[Sample], hook: &str) -> f64 {
    per_hook(samples).get(hook).map_or(f64::NAN, |(ns, _)| *ns)
}

/// The hooks whose programs the parts are in.
const HOOKS: [&str; 2] = ["sched_switch", "sched_wakeup"];

/// The breakdown table of workload `w`; empty where no part was left out in this run.
pub(super) fn table(
    w: usize,
    work: &Workload,
    samples: &BTreeMap<(usize, Config), Vec<Sample>>,
) -> String {
    let Some(lazy) = samples.get(&(w, Config::Lazy)) else {
        return String::new();
    };
    // The parts measured, with the two that have their own flags (cgroups, the exit log).
    let parts: Vec<(String, &str, &[Sample])> = Part::ALL
        .into_iter()
        .filter_map(|p| {
            let s = samples.get(&(w, Config::LazyWithout(p)))?;
            Some((p.flag().to_owned(), p.what(), s.as_slice()))
        })
        .chain(
            [
                (
                    Config::LazyNoCgroups,
                    "cgroups",
                    "each sleep's cgroup (a helper call per switch-out)",
                ),
                (
                    Config::LazyNoExitLog,
                    "exit-log",
                    "exited tasks' records sent to user space",
                ),
                (
                    Config::LazySkeleton,
                    "all (skeleton)",
                    "every part above at once: what is left (lazy-skeleton) only times each sleep",
                ),
            ]
            .into_iter()
            .filter_map(|(c, name, what)| {
                Some((name.to_owned(), what, samples.get(&(w, c))?.as_slice()))
            }),
        )
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    let all = per_switch(lazy);
    let mut md = String::new();
    let _ = write!(
        md,
        "\n### {}: what each part of lazy's programs costs\n\nlazy's BPF time less lazy's without the part (`--debug-skip`), per context switch of the machine and per run of each hook's program; lazy in all: {all:.0} ns per switch, ",
        work.name
    );
    let _ = writeln!(
        md,
        "{}.\n\n| part | what | ns per switch | share of lazy's | {} |\n|---|---|---|---|{}",
        HOOKS
            .iter()
            .map(|h| format!("{h} {:.0} ns per run", per_run(lazy, h)))
            .collect::<Vec<_>>()
            .join(", "),
        HOOKS
            .iter()
            .map(|h| format!("{h} ns per run"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(HOOKS.len())
    );
    for (name, what, s) in parts {
        let saved = all - per_switch(s);
        let hooks: Vec<String> = HOOKS
            .iter()
            .map(|h| format!("{:.0}", per_run(lazy, h) - per_run(s, h)))
            .collect();
        let _ = writeln!(
            md,
            "| {name} | {what} | {saved:.0} | {:.0}% | {} |",
            saved * 100.0 / all,
            hooks.join(" | ")
        );
    }
    md
}

//! The report: medians and ratios against the no-tracer runs, as Markdown and JSON.
use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    configs::{Config, Workload},
    measure::{Sample, median},
    summary::{Summary, Target, summarize, summary_of, verdict},
};

/// The markdown table (with the targets' verdicts) and the JSON document.
#[expect(
    clippy::too_many_lines,
    reason = "the report's sections in the order docs/bench.md shows them"
)]
pub(super) fn report(
    works: &[Workload],
    configs: &[Config],
    samples: &BTreeMap<(usize, Config), Vec<Sample>>,
    rounds: u32,
    skipped: &[&str],
) -> (String, String) {
    let mut md = String::new();
    let mut results = Vec::new();
    let _ = writeln!(md, "# latprof overhead benchmark\n");
    let _ = writeln!(
        md,
        "Machine: {}. Rounds: {rounds}, interleaved; medians, min-max.",
        machine()
    );
    // The command that made it, as typed (the harness's own path shortened to its name).
    let command: Vec<String> = std::env::args()
        .enumerate()
        .map(|(i, a)| {
            if i == 0 {
                "latprof-bench".to_owned()
            } else {
                a
            }
        })
        .collect();
    let _ = writeln!(md, "Made by: `{}`.", command.join(" "));
    if !skipped.is_empty() {
        let _ = writeln!(md, "Not installed, skipped: {}.", skipped.join(", "));
    }
    let mut summaries: BTreeMap<(usize, Config), Summary> = BTreeMap::new();
    for (w, work) in works.iter().enumerate() {
        let Some(none) = samples.get(&(w, Config::None)) else {
            continue;
        };
        let _ = writeln!(
            md,
            "\n## {} (`{}`)\n\n| config | wall ms (min-max) | ratio | +ns/switch | BPF ns/event | BPF ns/{} | BPF %CPU | tracer CPU ms | RSS MB | maps KiB |\n|---|---|---|---|---|---|---|---|---|---|",
            work.name,
            work.command
                .iter()
                .skip(1)
                .cloned()
                .collect::<Vec<_>>()
                .join(" "),
            if work.units > 0 { work.unit } else { "run" }
        );
        for &config in configs.iter().filter(|c| work.configs.contains(c)) {
            let Some(s) = samples.get(&(w, config)) else {
                continue;
            };
            let sum = summarize(s, none, work.units);
            let _ = writeln!(
                md,
                "| {} | {:.1} ({:.1}-{:.1}) | {:.3} | {:.0} | {:.0} | {:.0} | {:.3} | {:.0} | {:.1} | {} |",
                config.name(),
                sum.wall_ms,
                sum.wall_min_ms,
                sum.wall_max_ms,
                sum.ratio,
                sum.added_ns_per_switch,
                sum.bpf_ns_per_event,
                sum.bpf_ns_per_unit,
                sum.bpf_cpu_percent,
                sum.tracer_cpu_ms,
                sum.tracer_rss_mb,
                sum.map_kb
            );
            let per_unit = format!(
                "bpf_ns_per_{}",
                if work.units > 0 {
                    work.unit.replace(' ', "_")
                } else {
                    "run".into()
                }
            );
            // serde_json writes a NaN (a median of nothing) as null, and escapes as JSON does.
            let mut result = serde_json::json!({
                "workload": work.name,
                "config": config.name(),
                "wall_ms": rounded(sum.wall_ms, 3),
                "wall_min_ms": rounded(sum.wall_min_ms, 3),
                "wall_max_ms": rounded(sum.wall_max_ms, 3),
                "ratio": rounded(sum.ratio, 4),
                "added_ns_per_switch": rounded(sum.added_ns_per_switch, 1),
                "bpf_ns_per_event": rounded(sum.bpf_ns_per_event, 1),
                "bpf_cpu_percent": rounded(sum.bpf_cpu_percent, 4),
                "tracer_cpu_ms": rounded(sum.tracer_cpu_ms, 1),
                "tracer_rss_mb": rounded(sum.tracer_rss_mb, 2),
                "map_kib": sum.map_kb,
            });
            result[per_unit] = rounded(sum.bpf_ns_per_unit, 1).into();
            results.push(result);
            summaries.insert((w, config), sum);
        }
        // latprof's own programs, one by one (medians over the rounds).
        for config in [
            Config::Lazy,
            Config::Normal,
            Config::PairedLazy,
            Config::PairedNormal,
        ] {
            let Some(s) = samples.get(&(w, config)) else {
                continue;
            };
            let names: Vec<String> = s[0].per_program.keys().cloned().collect();
            let parts: Vec<String> = names
                .iter()
                .map(|name| {
                    let per_event = median(
                        s.iter()
                            .filter_map(|x| x.per_program.get(name))
                            .filter(|(_, n)| *n > 0)
                            .map(|(ns, n)| *ns as f64 / *n as f64)
                            .collect(),
                    );
                    let runs = median(
                        s.iter()
                            .filter_map(|x| x.per_program.get(name))
                            .map(|(_, n)| *n as f64)
                            .collect(),
                    );
                    format!("{name} {per_event:.0} ns x {runs:.0}")
                })
                .collect();
            if !parts.is_empty() {
                let _ = writeln!(md, "\n{} per program: {}.", config.name(), parts.join(", "));
            }
        }
        md.push_str(&super::floor::table(w, work, samples));
        md.push_str(&super::breakdown::table(w, work, samples));
    }
    md.push_str(&super::scaling::table(works, &summaries));
    let _ = writeln!(md, "\n## Targets\n");
    let targets = targets(works, &summaries);
    for (name, verdict, detail) in &targets {
        let _ = writeln!(md, "- {verdict}: {name} ({detail})");
    }
    let doc = serde_json::json!({
        "rounds": rounds,
        "machine": machine(),
        "results": results,
        "targets": targets
            .iter()
            .map(|(name, verdict, detail)| {
                serde_json::json!({"target": name, "verdict": verdict, "detail": detail})
            })
            .collect::<Vec<_>>(),
    });
    let mut json = serde_json::to_string_pretty(&doc).unwrap_or_default();
    json.push('\n');
    (md, json)
}

/// `x` to `digits` decimals (a NaN or infinity stays one: JSON null).
fn rounded(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    if x.is_finite() {
        (x * scale).round() / scale
    } else {
        x
    }
}

pub(super) fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    format!("Linux {}, {cpus} CPUs", kernel.trim())
}

/// The targets, each with a verdict from this run's numbers.
#[expect(
    clippy::too_many_lines,
    reason = "the table of the report's targets, one entry each: read as a list"
)]
pub(super) fn targets(works: &[Workload], s: &BTreeMap<(usize, Config), Summary>) -> Vec<Target> {
    let get = |name: &str, c: Config| summary_of(works, s, name, c);
    let mut out = Vec::new();
    if let (Some(lazy), Some(bt)) = (
        get("pingpong", Config::Lazy),
        get("pingpong", Config::Bpftrace),
    ) {
        out.push((
            "lazy BPF time per round trip at most half of the bpftrace off-CPU script's".to_owned(),
            verdict(lazy.bpf_ns_per_unit <= bt.bpf_ns_per_unit / 2.0),
            format!(
                "{:.0} ns against {:.0} ns",
                lazy.bpf_ns_per_unit, bt.bpf_ns_per_unit
            ),
        ));
    }
    if let (Some(lazy), Some(rq)) = (
        get("pingpong", Config::Lazy),
        get("pingpong", Config::Runqlat),
    ) {
        out.push((
            "ping-pong: lazy's BPF time per round trip at most 0.5x runqlat's, with every counted sleep's backtrace"
                .to_owned(),
            verdict(lazy.bpf_ns_per_unit <= rq.bpf_ns_per_unit * 0.5),
            format!(
                "{:.0} ns against {:.0} ns ({:.2}x)",
                lazy.bpf_ns_per_unit,
                rq.bpf_ns_per_unit,
                lazy.bpf_ns_per_unit / rq.bpf_ns_per_unit
            ),
        ));
    }
    if let (Some(lazy), Some(floor)) = (
        get("pingpong", Config::Lazy),
        get("pingpong", Config::Floor),
    ) {
        out.push((
            "ping-pong: lazy against the floor (do-nothing programs on the same hooks)".to_owned(),
            "INFO",
            format!(
                "{:.0} ns against {:.0} ns per round trip ({:.1}x)",
                lazy.bpf_ns_per_unit,
                floor.bpf_ns_per_unit,
                lazy.bpf_ns_per_unit / floor.bpf_ns_per_unit
            ),
        ));
    }
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    for hb in ["hackbench-process", "hackbench-thread"] {
        let (Some(lazy), Some(none)) = (get(hb, Config::Lazy), get(hb, Config::None)) else {
            continue;
        };
        // Judged as the issue measured it: BPF time over wall time (% of one CPU).
        out.push((
            format!("{hb}: latprof's programs under 3% of the CPU time"),
            verdict(lazy.bpf_cpu_percent < 3.0),
            format!(
                "{:.2}% of one CPU's time ({:.2}% of all {cpus} CPUs')",
                lazy.bpf_cpu_percent,
                lazy.bpf_cpu_percent / cpus
            ),
        ));
        // What no change to what the programs keep can go under: each sleep only timed.
        if let (Some(skeleton), Some(floor)) =
            (get(hb, Config::LazySkeleton), get(hb, Config::Floor))
        {
            out.push((
                format!(
                    "{hb}: lazy's skeleton (each sleep timed, nothing kept: every part of the breakdown, cgroups and the exit log left out) and the floor, against the 3% goal"
                ),
                "INFO",
                format!(
                    "skeleton {:.2}%, floor {:.2}%, lazy {:.2}% of one CPU's time",
                    skeleton.bpf_cpu_percent, floor.bpf_cpu_percent, lazy.bpf_cpu_percent
                ),
            ));
        }
        // The no-tracer runs' own spread: their slowest and fastest against their median.
        let (lo, hi) = (
            none.wall_min_ms / none.wall_ms,
            none.wall_max_ms / none.wall_ms,
        );
        out.push((
            format!("{hb}: wall time against no tracer within the no-tracer runs' own spread"),
            verdict(lazy.ratio <= hi),
            format!("ratio {:.3}; no tracer's runs {lo:.3}-{hi:.3}", lazy.ratio),
        ));
    }
    if let Some(lazy) = get("idle", Config::Lazy) {
        out.push((
            "lazy idle cost under 0.05% of one CPU".to_owned(),
            verdict(lazy.bpf_cpu_percent < 0.05),
            format!("{:.3}% in BPF", lazy.bpf_cpu_percent),
        ));
    }
    let normal: Vec<(String, f64)> = ["pingpong", "hackbench-process", "hackbench-thread"]
        .into_iter()
        .filter_map(|name| {
            let (lazy, normal) = (get(name, Config::Lazy)?, get(name, Config::Normal)?);
            Some((
                name.to_owned(),
                normal.bpf_ns_per_event / lazy.bpf_ns_per_event,
            ))
        })
        .collect();
    if !normal.is_empty() {
        out.push((
            "normal mode within 1.2x lazy's BPF time per event".to_owned(),
            verdict(normal.iter().all(|(_, r)| *r <= 1.2)),
            normal
                .iter()
                .map(|(name, r)| format!("{name}: {r:.2}x"))
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    if let (Some(lazy), Some(normal)) = (
        get("pingpong", Config::Lazy),
        get("pingpong", Config::Normal),
    ) {
        out.push((
            "lazy per-event cost lower than normal's".to_owned(),
            verdict(lazy.bpf_ns_per_event < normal.bpf_ns_per_event),
            format!(
                "{:.0} ns against {:.0} ns ({:+.0}%)",
                lazy.bpf_ns_per_event,
                normal.bpf_ns_per_event,
                (lazy.bpf_ns_per_event / normal.bpf_ns_per_event - 1.0) * 100.0
            ),
        ));
    }
    if let (Some(lazy), Some(normal)) = (
        get("forkstorm", Config::Lazy),
        get("forkstorm", Config::Normal),
    ) {
        // Judged on the paired runs where there are some (both orders each round): the
        // wakeup program, which both modes run, varies more between runs than the modes
        // differ.
        let (judged, paired) = match (
            get("forkstorm", Config::PairedLazy),
            get("forkstorm", Config::PairedNormal),
        ) {
            (Some(l), Some(n)) => ((l, n), "attached together in one run"),
            _ => ((lazy, normal), "separate runs"),
        };
        out.push((
            "fork/exit storm: lazy's exit merges cost less than normal's per-event updates"
                .to_owned(),
            verdict(judged.0.mode_ns_per_unit < judged.1.mode_ns_per_unit),
            format!(
                "exit + wakeup programs, where the modes differ, {paired}: {:.0} ns against {:.0} ns per fork; \
                 separate runs: {:.0} ns against {:.0} ns (all programs: {:.0} ns against {:.0} ns)",
                judged.0.mode_ns_per_unit,
                judged.1.mode_ns_per_unit,
                lazy.mode_ns_per_unit,
                normal.mode_ns_per_unit,
                lazy.bpf_ns_per_unit,
                normal.bpf_ns_per_unit
            ),
        ));
    }
    if let (Some(lazy), Some(walk)) = (
        get("pingpong", Config::Lazy),
        get("pingpong", Config::LazyWalk),
    ) {
        out.push((
            "stack cache: lazy against lazy walking every counted sleep's stack (--no-stack-cache)"
                .to_owned(),
            "INFO",
            format!(
                "{:.0} ns against {:.0} ns per round trip ({:+.0}%)",
                lazy.bpf_ns_per_unit,
                walk.bpf_ns_per_unit,
                (lazy.bpf_ns_per_unit / walk.bpf_ns_per_unit - 1.0) * 100.0
            ),
        ));
    }
    // Wakers: what attributing each sleep to its waker, and walking the waker's backtrace,
    // add per event (context switch) to the same build without them. On by default only
    // under 15% (issue 16); they are opt-in (`--wakers`) because they cost more.
    let mut wakers = Vec::new();
    let mut under = true;
    for name in ["pingpong", "hackbench-process", "hackbench-thread"] {
        let (Some(off), Some(on)) = (get(name, Config::Lazy), get(name, Config::LazyWakers)) else {
            continue;
        };
        let added = (on.bpf_ns_per_switch / off.bpf_ns_per_switch - 1.0) * 100.0;
        under &= added <= 30.0;
        let stacks = get(name, Config::LazyWakerStacks).map_or(String::new(), |st| {
            format!(
                ", --waker-stacks {:.0} ns ({:+.0}%)",
                st.bpf_ns_per_switch,
                (st.bpf_ns_per_switch / off.bpf_ns_per_switch - 1.0) * 100.0
            )
        });
        // The least the hooks `--wakers` adds could cost: do-nothing programs there.
        let least = get(name, Config::Floor)
            .zip(get(name, Config::FloorWakers))
            .map_or(String::new(), |(floor, with)| {
                let added = with.bpf_ns_per_switch - floor.bpf_ns_per_switch;
                format!(
                    "; its hooks doing nothing add {added:.0} ns ({:+.0}%)",
                    added / off.bpf_ns_per_switch * 100.0
                )
            });
        wakers.push(format!(
            "{name}: lazy {:.0} ns/switch, --wakers {:.0} ns ({added:+.0}%{least}){stacks}",
            off.bpf_ns_per_switch, on.bpf_ns_per_switch
        ));
    }
    if !wakers.is_empty() {
        out.push((
            "--wakers at most 1.3x lazy's BPF time per event".to_owned(),
            verdict(under),
            wakers.join("; "),
        ));
    }
    // User stacks (issue 17): the user walk per counted sleep against lazy's kernel-only
    // backtraces, per event, at most 2x; and latprof's own CPU time (naming the frames is in
    // lazy-ustacks' and not in lazy's).
    let mut ustacks = Vec::new();
    let mut under = true;
    for name in [
        "pingpong",
        "hackbench-process",
        "hackbench-thread",
        "node",
        "java",
    ] {
        let (Some(off), Some(on)) = (get(name, Config::Lazy), get(name, Config::LazyUserStacks))
        else {
            continue;
        };
        let ratio = on.bpf_ns_per_event / off.bpf_ns_per_event;
        under &= ratio <= 1.3;
        ustacks.push(format!(
            "{name}: lazy {:.0} ns/event, --user-stacks {:.0} ns/event ({ratio:.2}x); latprof's CPU {:.0} ms against {:.0} ms",
            off.bpf_ns_per_event, on.bpf_ns_per_event, on.tracer_cpu_ms, off.tracer_cpu_ms
        ));
    }
    if !ustacks.is_empty() {
        out.push((
            "--user-stacks at most 1.3x lazy's kernel-only BPF time per event (lazy-ustacks against lazy)"
                .to_owned(),
            verdict(under),
            ustacks.join("; "),
        ));
    }
    // Unwind tables (issue 32): user stacks with the tables' steps against frame pointers only.
    let tables: Vec<String> = [
        "pingpong",
        "hackbench-process",
        "hackbench-thread",
        "node",
        "java",
    ]
    .iter()
    .filter_map(|name| {
        let (fp, on) = (
            get(name, Config::LazyUserStacksFp)?,
            get(name, Config::LazyUserStacks)?,
        );
        Some(format!(
            "{name}: {:.0} ns/event by frame pointers only, {:.0} with the tables ({:.2}x)",
            fp.bpf_ns_per_event,
            on.bpf_ns_per_event,
            on.bpf_ns_per_event / fp.bpf_ns_per_event
        ))
    })
    .collect();
    if !tables.is_empty() {
        out.push((
            "unwind tables: --user-stacks against the same walk by frame pointers only (lazy-ustacks against lazy-ustacks-fp)"
                .to_owned(),
            "INFO",
            tables.join("; "),
        ));
    }
    // Cgroups (issue 15): what attributing each sleep to its cgroup adds per event to the same
    // build without it (`--debug-no-cgroups`). The target is lazy's, under 10% on every
    // workload measured; normal mode's (its exit merge into the per-cgroup table) is shown.
    let mut cgroups = Vec::new();
    let mut under = true;
    let mut judged = 0;
    for name in [
        "pingpong",
        "forkstorm",
        "hackbench-process",
        "hackbench-thread",
    ] {
        let added = |on: Config, off: Config| {
            let (on, off) = (get(name, on)?, get(name, off)?);
            Some((
                on.bpf_ns_per_event,
                off.bpf_ns_per_event,
                (on.bpf_ns_per_event / off.bpf_ns_per_event - 1.0) * 100.0,
            ))
        };
        let Some((on, off, lazy_added)) = added(Config::Lazy, Config::LazyNoCgroups) else {
            continue;
        };
        under &= lazy_added < 10.0;
        judged += 1;
        let normal = added(Config::Normal, Config::NormalNoCgroups)
            .map_or(String::new(), |(on, off, pct)| {
                format!("; normal {on:.0} against {off:.0} ({pct:+.1}%)")
            });
        cgroups.push(format!(
            "{name}: lazy {on:.0} ns/event against {off:.0} without ({lazy_added:+.1}%){normal}"
        ));
    }
    if judged > 0 {
        out.push((
            "cgroup attribution adds under 10% per event to lazy's BPF time (lazy against lazy-nocgroups)"
                .to_owned(),
            verdict(under),
            cgroups.join("; "),
        ));
    }
    if let (Some(lazy), Some(off)) = (
        get("forkstorm", Config::Lazy),
        get("forkstorm", Config::LazyNoExitLog),
    ) {
        out.push((
            "exited tasks' log: each exit's records sent to user space for the profiles' pid and thread labels"
                .to_owned(),
            "INFO",
            format!(
                "forkstorm: lazy {:.0} ns/event, without the log {:.0} ns/event ({:+.1}%)",
                lazy.bpf_ns_per_event,
                off.bpf_ns_per_event,
                (lazy.bpf_ns_per_event / off.bpf_ns_per_event - 1.0) * 100.0
            ),
        ));
    }
    if let (Some(lazy), Some(debug)) = (
        get("pingpong", Config::Lazy),
        get("pingpong", Config::LazyDebug),
    ) {
        out.push((
            "debug checks: their cost per event with --debug-checks (without, they are not loaded)"
                .to_owned(),
            "INFO",
            format!(
                "lazy {:.0} ns/event, lazy --debug-checks {:.0} ns/event ({:+.0}%)",
                lazy.bpf_ns_per_event,
                debug.bpf_ns_per_event,
                (debug.bpf_ns_per_event / lazy.bpf_ns_per_event - 1.0) * 100.0
            ),
        ));
    }
    let spikes: Vec<String> = works
        .iter()
        .filter(|w| w.name.starts_with("spikes-"))
        .filter_map(|w| {
            let a = get(&w.name, Config::SpikesAdaptive)?;
            let b = get(&w.name, Config::SpikesAlways)?;
            Some(format!(
                "{}: adaptive {:.0} ns/event at {:.0} switches/s, always {:.0} ns/event at {:.0} switches/s",
                w.name, a.bpf_ns_per_event, a.switches_per_s, b.bpf_ns_per_event, b.switches_per_s
            ))
        })
        .collect();
    if !spikes.is_empty() {
        // With one process the reader has drained every event before the next one comes, so it
        // is always waiting and both policies wake it every time: judged from 2 processes on.
        let cheaper = works
            .iter()
            .filter(|w| w.name.starts_with("spikes-") && w.name != "spikes-1")
            .filter_map(|w| {
                Some(
                    get(&w.name, Config::SpikesAdaptive)?.bpf_ns_per_event
                        <= get(&w.name, Config::SpikesAlways)?.bpf_ns_per_event,
                )
            })
            .all(|ok| ok);
        out.push((
            "spikes: adaptive reader wakeups cost no more per event than waking on every event (2+ processes)"
                .to_owned(),
            verdict(cheaper),
            spikes.join("; "),
        ));
    }
    let series: Vec<(&str, f64, f64)> = works
        .iter()
        .filter(|w| w.name.starts_with("contention-"))
        .filter_map(|w| {
            let l = get(&w.name, Config::Lazy)?;
            let n = get(&w.name, Config::Normal)?;
            Some((w.name.as_str(), l.bpf_ns_per_event, n.bpf_ns_per_event))
        })
        .collect();
    if let (Some(first), Some(last)) = (series.first(), series.last()) {
        out.push((
            "contention: lazy per-event cost flat as processes grow (within 25%)".to_owned(),
            verdict(last.1 <= first.1 * 1.25),
            series
                .iter()
                .map(|(n, l, nm)| format!("{n}: lazy {l:.0} ns, normal {nm:.0} ns"))
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    out.extend(super::fallbacks::targets(works, s));
    out.extend(super::chains::targets(works, s));
    out
}

//! The floor: latprof's programs against do-nothing programs of the same types on the same
//! hooks (`latprof --debug-floor`), hook by hook. The floor's time per run is what the kernel
//! charges for running any program there; latprof's is reported as a multiple of it.
use std::{collections::BTreeMap, fmt::Write as _};

use latprof::probe::names;

use super::{
    configs::{Config, Workload},
    measure::{Sample, median},
};

/// The kernel keeps this many bytes of a program's name.
const KERNEL_NAME: usize = 15;

/// The hooks whose programs come in variants named after the hook (`sched_switch_nocas`,
/// `sched_waking_btf`).
const VARIANT_HOOKS: [&str; 5] = [
    "sched_switch",
    "sched_wakeup",
    "sched_waking",
    "sched_process_exit",
    "sched_process_free",
];

/// The hook of a program as the kernel names it (latprof's or the floor's); programs whose
/// kept names are the same (`hrtimer_expire_`) name every hook they may be.
pub(super) fn hook_of(kernel_name: &str) -> String {
    let kept = |p: &str| p.get(..KERNEL_NAME).unwrap_or(p).to_owned();
    if let Some((_, hook)) = names::FLOOR_PROGRAMS
        .iter()
        .find(|(p, _)| kept(p) == kernel_name)
    {
        return (*hook).to_owned();
    }
    let mut hooks: Vec<&str> = names::PROGRAMS
        .iter()
        .filter(|p| kept(p) == kernel_name)
        .map(|p| {
            VARIANT_HOOKS
                .into_iter()
                .find(|h| p.starts_with(h))
                .unwrap_or(p)
        })
        .collect();
    hooks.dedup();
    if hooks.is_empty() {
        kernel_name.to_owned()
    } else {
        hooks.join(" or ")
    }
}

/// Per hook: median ns per run and median runs over the rounds.
pub(super) type PerHook = BTreeMap<String, (f64, f64)>;

pub(super) fn per_hook(samples: &[Sample]) -> PerHook {
    let mut by_hook: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for s in samples {
        let mut this: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for (name, (ns, runs)) in &s.per_program {
            let e = this.entry(hook_of(name)).or_default();
            e.0 += ns;
            e.1 += runs;
        }
        for (hook, v) in this {
            by_hook.entry(hook).or_default().push(v);
        }
    }
    by_hook
        .into_iter()
        .map(|(hook, v)| {
            let per_run = median(
                v.iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(ns, n)| *ns as f64 / *n as f64)
                    .collect(),
            );
            let runs = median(v.iter().map(|(_, n)| *n as f64).collect());
            (hook, (per_run, runs))
        })
        .collect()
}

/// The configurations set against the floor, where this run measured them.
const AGAINST: [Config; 6] = [
    Config::Lazy,
    Config::LazyBefore,
    Config::Normal,
    Config::NormalBefore,
    Config::LazyWakers,
    Config::LazyUserStacks,
];

/// The floor table of workload `w`: per hook, the floor's ns per run and each latprof
/// configuration's, with its multiple of the floor; the last row is every program's time per
/// unit. Empty where the floor was not measured.
pub(super) fn table(
    w: usize,
    work: &Workload,
    samples: &BTreeMap<(usize, Config), Vec<Sample>>,
) -> String {
    let Some(floor) = samples.get(&(w, Config::Floor)) else {
        return String::new();
    };
    let mut floor_hooks = per_hook(floor);
    // The hooks only `--wakers` uses: their floor from the floor with wakers, where measured.
    if let Some(with_wakers) = samples.get(&(w, Config::FloorWakers)) {
        for (hook, v) in per_hook(with_wakers) {
            floor_hooks.entry(hook).or_insert(v);
        }
    }
    let configs: Vec<(Config, PerHook)> = AGAINST
        .into_iter()
        .filter_map(|c| Some((c, per_hook(samples.get(&(w, c))?))))
        .collect();
    // latprof's programs whose kept names are the same (`hrtimer_expire_`) are one row, "a or
    // b": the floor's programs on those hooks, named apart, are summed into it.
    for (_, h) in &configs {
        for hook in h.keys().filter(|k| k.contains(" or ")) {
            let parts: Vec<(f64, f64)> = hook
                .split(" or ")
                .filter_map(|part| floor_hooks.remove(part))
                .collect();
            let runs: f64 = parts.iter().map(|(_, r)| r).sum();
            if runs > 0.0 {
                let ns = parts.iter().map(|(ns, r)| ns * r).sum::<f64>() / runs;
                floor_hooks.insert(hook.clone(), (ns, runs));
            }
        }
    }
    let mut hooks: Vec<&String> = floor_hooks.keys().collect();
    for (_, h) in &configs {
        hooks.extend(h.keys());
    }
    hooks.sort();
    hooks.dedup();
    let mut md = String::new();
    let _ = write!(
        md,
        "\n### {}: each program against the floor\n\nns per run of each hook's program (median over the rounds), and its multiple of the floor's: a do-nothing program of the same type on the same hook (on the hooks only `--wakers` uses, from `floor-wakers`).\n\n| hook | runs | floor ns |",
        work.name
    );
    for (c, _) in &configs {
        let _ = write!(md, " {} ns | x floor |", c.name());
    }
    let _ = write!(md, "\n|---|---|---|");
    for _ in &configs {
        let _ = write!(md, "---|---|");
    }
    md.push('\n');
    let cell = |v: Option<f64>, digits: usize| {
        v.filter(|x| x.is_finite())
            .map_or("-".to_owned(), |x| format!("{x:.digits$}"))
    };
    for hook in hooks {
        let f = floor_hooks.get(hook);
        let runs = f.map(|(_, r)| *r).or_else(|| {
            configs
                .iter()
                .find_map(|(_, h)| h.get(hook).map(|(_, r)| *r))
        });
        let _ = write!(
            md,
            "| {hook} | {} | {} |",
            cell(runs, 0),
            cell(f.map(|(ns, _)| *ns), 0)
        );
        for (_, h) in &configs {
            let ns = h.get(hook).map(|(ns, _)| *ns);
            let x = ns.zip(f).map(|(ns, (fl, _))| ns / fl);
            let _ = write!(md, " {} | {} |", cell(ns, 0), cell(x, 1));
        }
        md.push('\n');
    }
    // Every program's time per unit of work: what a round trip or a fork costs in all.
    let unit = if work.units > 0 { work.unit } else { "run" };
    let total = |s: &[Sample]| {
        median(
            s.iter()
                .map(|x| x.bpf_ns as f64 / work.units.max(1) as f64)
                .collect(),
        )
    };
    let floor_total = total(floor);
    let _ = write!(md, "| all, ns per {unit} | | {floor_total:.0} |");
    for (c, _) in &configs {
        let t = samples.get(&(w, *c)).map_or(f64::NAN, |s| total(s));
        let _ = write!(md, " {t:.0} | {:.1} |", t / floor_total);
    }
    md.push('\n');
    md
}

//! `stats --counters` and top's counters tab: latprof's pipeline counters and the kernel's
//! tick accounting per CPU, as totals and rates over an interval.
use std::fmt::Write as _;

use latprof_common::{Counter, TICK_COUNTER_COUNT, TICK_DEP_BITS, TickCounter, tick_dep_counter};

use crate::{
    collect::{Snapshot, TickCounts},
    probe::KernelFacts,
};

/// The tracepoint each tick program counts.
#[must_use]
pub fn tracepoint(program: &str) -> &str {
    match program {
        "local_timer_entry" => "irq_vectors:local_timer_entry",
        "tick_stop" => "timer:tick_stop",
        "user_enter" => "context_tracking:user_enter",
        "user_exit" => "context_tracking:user_exit",
        other => other,
    }
}

/// One CPU's counters over an interval.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CpuTicks {
    pub cpu: usize,
    pub nohz_full: bool,
    pub timer_ticks: u64,
    pub tick_stopped: u64,
    /// timer:tick_stop with success=0: the tick had to keep running.
    pub tick_kept: u64,
    /// Why it was kept, by dependency (a failure can name several).
    pub kept_by: Vec<(&'static str, u64)>,
    pub switches: u64,
    /// `None` where the kernel has no context-tracking tracepoints.
    pub user_enter: Option<u64>,
    pub user_exit: Option<u64>,
}

fn available(facts: &KernelFacts, program: &str) -> bool {
    facts
        .tick_sources
        .iter()
        .any(|(name, ok)| name == program && *ok)
}

/// Per-CPU counters of `cur` less `base`'s.
#[must_use]
pub fn cpu_ticks(facts: &KernelFacts, base: Option<&Snapshot>, cur: &Snapshot) -> Vec<CpuTicks> {
    let zero: TickCounts = [0; TICK_COUNTER_COUNT as usize];
    cur.ticks
        .iter()
        .enumerate()
        .map(|(cpu, now)| {
            let was = base.and_then(|b| b.ticks.get(cpu)).unwrap_or(&zero);
            let d = |c: TickCounter| now[c as usize].saturating_sub(was[c as usize]);
            CpuTicks {
                cpu,
                nohz_full: facts
                    .nohz_full_cpus
                    .iter()
                    .any(|&c| usize::try_from(c) == Ok(cpu)),
                timer_ticks: d(TickCounter::TimerTicks),
                tick_stopped: d(TickCounter::TickStopOk),
                tick_kept: d(TickCounter::TickStopFail),
                kept_by: (0..TICK_DEP_BITS)
                    .filter_map(tick_dep_counter)
                    .filter_map(|c| Some((c.dep_name()?, d(c))))
                    .filter(|(_, n)| *n > 0)
                    .collect(),
                switches: d(TickCounter::Switches),
                user_enter: available(facts, "user_enter").then(|| d(TickCounter::UserEnter)),
                user_exit: available(facts, "user_exit").then(|| d(TickCounter::UserExit)),
            }
        })
        .collect()
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

/// latprof's own cost: each loaded program's runs and kernel time per run over `base` ->
/// `cur`, from the kernel's run-time statistics.
#[expect(clippy::cast_precision_loss, reason = "averages for people")]
fn render_programs(out: &mut String, base: Option<&Snapshot>, cur: &Snapshot) {
    let before = |name: &str| {
        base.and_then(|b| b.programs.iter().find(|(n, _, _)| n == name))
            .map_or((0, 0), |(_, ns, runs)| (*ns, *runs))
    };
    let _ = writeln!(out, "\n{:<28} {:>12} {:>10}", "program", "runs", "ns/run");
    let (mut all_ns, mut all_runs) = (0u64, 0u64);
    for (name, ns, runs) in &cur.programs {
        let (ns0, runs0) = before(name);
        let (ns, runs) = (ns.saturating_sub(ns0), runs.saturating_sub(runs0));
        all_ns += ns;
        all_runs += runs;
        let per = if runs > 0 {
            format!("{:.0}", ns as f64 / runs as f64)
        } else {
            "-".to_owned()
        };
        let _ = writeln!(out, "{name:<28} {runs:>12} {per:>10}");
    }
    if all_runs > 0 {
        let _ = writeln!(
            out,
            "{:<28} {all_runs:>12} {:>10.0}",
            "all",
            all_ns as f64 / all_runs as f64
        );
    } else {
        let _ = writeln!(out, "(the kernel's BPF run-time statistics are off)");
    }
}

/// The counters over `base` -> `cur` as text, rates per second.
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "rates for people")]
pub fn render(facts: &KernelFacts, base: Option<&Snapshot>, cur: &Snapshot) -> String {
    let secs = base.map_or(0.0, |b| {
        cur.taken_ns.saturating_sub(b.taken_ns) as f64 / 1e9
    });
    let rate = |n: u64| {
        if secs > 0.0 {
            format!("{:.1}", n as f64 / secs)
        } else {
            "-".to_owned()
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "latprof counters over {secs:.1}s ({} mode)",
        cur.mode.as_str()
    );
    if let Some(cost) = &facts.programs_cost {
        let _ = writeln!(out, "programs: {cost}");
    }
    for why in &facts.fallbacks {
        let _ = writeln!(out, "  not the best variant: {why}");
    }
    let _ = writeln!(out, "\n{:<26} {:>14} {:>12}", "pipeline", "total", "per s");
    for c in Counter::ALL {
        let n = cur
            .counters
            .get(c)
            .saturating_sub(base.map_or(0, |b| b.counters.get(c)));
        let _ = writeln!(out, "{:<26} {n:>14} {:>12}", c.name(), rate(n));
    }
    // The check of lost and recovered sleeps against hidden switches, done in user space.
    for (name, n) in cur.hidden.counters(base.map(|b| &b.hidden)) {
        let _ = writeln!(out, "{name:<26} {n:>14} {:>12}", rate(n));
    }
    render_programs(&mut out, base, cur);
    let _ = writeln!(
        out,
        "\nkernel: HZ {}, NO_HZ_IDLE {}, NO_HZ_FULL {}, VIRT_CPU_ACCOUNTING_GEN {}, CONTEXT_TRACKING_USER {} ({})",
        facts
            .hz
            .map_or_else(|| "unknown".to_owned(), |hz| hz.to_string()),
        yes_no(facts.no_hz_idle),
        yes_no(facts.no_hz_full),
        yes_no(facts.virt_cpu_accounting_gen),
        yes_no(facts.context_tracking_user),
        facts.config_source.as_deref().map_or_else(
            || "no kernel configuration found".to_owned(),
            |s| format!("from {s}")
        ),
    );
    let cpus: Vec<String> = facts.nohz_full_cpus.iter().map(u32::to_string).collect();
    let _ = writeln!(
        out,
        "nohz_full CPUs: {}",
        if cpus.is_empty() {
            "none".to_owned()
        } else {
            cpus.join(",")
        }
    );
    let _ = writeln!(
        out,
        "\n{:<4} {:<9} {:>9} {:>12} {:>9} {:>11} {:>13} {:>12}  tick kept by (total)",
        "cpu",
        "nohz_full",
        "ticks/s",
        "stopped/s",
        "kept/s",
        "switches/s",
        "user_enter/s",
        "user_exit/s"
    );
    for c in cpu_ticks(facts, base, cur) {
        let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), rate);
        let kept: Vec<String> = c.kept_by.iter().map(|(n, v)| format!("{n} {v}")).collect();
        let _ = writeln!(
            out,
            "{:<4} {:<9} {:>9} {:>12} {:>9} {:>11} {:>13} {:>12}  {}",
            c.cpu,
            if c.nohz_full { "yes" } else { "no" },
            rate(c.timer_ticks),
            rate(c.tick_stopped),
            rate(c.tick_kept),
            rate(c.switches),
            opt(c.user_enter),
            opt(c.user_exit),
            kept.join(", ")
        );
    }
    let missing: Vec<&str> = facts
        .tick_sources
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| tracepoint(name))
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(out, "not available on this kernel: {}", missing.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(t: u64, ticks: Vec<TickCounts>) -> Snapshot {
        Snapshot {
            taken_ns: t * 1_000_000_000,
            ticks,
            ..Snapshot::default()
        }
    }

    #[test]
    fn rates_per_cpu_and_missing_tracepoints() {
        let facts = KernelFacts {
            hz: Some(250),
            nohz_full_cpus: vec![1],
            tick_sources: vec![
                ("local_timer_entry".into(), true),
                ("tick_stop".into(), true),
                ("user_enter".into(), false),
                ("user_exit".into(), false),
            ],
            ..KernelFacts::default()
        };
        let mut a = [0u64; TICK_COUNTER_COUNT as usize];
        let mut b = a;
        b[TickCounter::TimerTicks as usize] = 500;
        b[TickCounter::TickStopFail as usize] = 4;
        b[TickCounter::DepSched as usize] = 3;
        b[TickCounter::DepRcu as usize] = 1;
        a[TickCounter::Switches as usize] = 10;
        let base = snap(1, vec![a, a]);
        let cur = snap(3, vec![b, a]);
        let cpus = cpu_ticks(&facts, Some(&base), &cur);
        assert_eq!(cpus[0].timer_ticks, 500);
        assert_eq!(cpus[0].kept_by, [("SCHED", 3), ("RCU", 1)]);
        assert!(!cpus[0].nohz_full && cpus[1].nohz_full);
        assert_eq!(cpus[0].user_enter, None);
        let text = render(&facts, Some(&base), &cur);
        assert!(text.contains("over 2.0s"), "{text}");
        assert!(text.contains("nohz_full CPUs: 1"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("0 ")
                && l.contains("250.0")
                && l.contains("SCHED 3, RCU 1")),
            "{text}"
        );
        assert!(text.contains("not available on this kernel: context_tracking:user_enter, context_tracking:user_exit"), "{text}");
    }
}

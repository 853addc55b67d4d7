//! The fallback variants, measured on this kernel: latprof loads another build of its
//! programs where the kernel lacks what the best one uses, and hidden flags load those builds
//! here too, so that each is measured in the same rounds as lazy, runqlat and no tracer.
//! Issue 30's goals hold for each within 1.5x.
use std::collections::BTreeMap;

use super::{
    configs::{Config, Workload},
    report::{Summary, Target, summary_of, verdict},
};

/// A fallback build of the programs, forced by latprof's hidden flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fallback {
    /// As Debian 11's 5.10 runs them: the stack cache learnt in a bounded loop (no
    /// `bpf_loop`), the sleeper's state read from the task (no `prev_state`). Its build without
    /// compare-and-swap differs only in the maxima of the global and merged records, which
    /// lazy mode writes at exits.
    Linux510,
    /// As Debian 12's 6.1 runs them: the best build, but without kfuncs (`bpf_rdonly_cast`
    /// came in 6.2), so the stack cache copies the sleeper's stack with
    /// `bpf_probe_read_kernel` instead of loading the words it checks.
    Linux61,
    /// As a kernel without BTF tracepoints runs them: raw tracepoints, each counted sleep's
    /// backtrace walked at its switch-out.
    Raw,
}

impl Fallback {
    pub(super) const ALL: [Self; 3] = [Self::Linux510, Self::Linux61, Self::Raw];

    /// The configuration's name.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Linux510 => "lazy-5.10",
            Self::Linux61 => "lazy-6.1",
            Self::Raw => "lazy-raw",
        }
    }

    /// latprof's flags that load it.
    pub(super) fn flags(self) -> &'static [&'static str] {
        match self {
            Self::Linux510 => &[
                "--debug-bounded-cache",
                "--debug-state-from-task",
                "--debug-no-kfuncs",
            ],
            Self::Linux61 => &["--debug-no-kfuncs"],
            Self::Raw => &["--no-btf-wakeup"],
        }
    }

    /// What it is, for the report.
    fn what(self) -> &'static str {
        match self {
            Self::Linux510 => {
                "Debian 11's 5.10 build (bounded-loop stack cache, state from the task)"
            }
            Self::Linux61 => "Debian 12's 6.1 build (no kfuncs: the stack copied by a helper)",
            Self::Raw => "raw tracepoints (no BTF tracepoints: backtraces walked at switch-out)",
        }
    }
}

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

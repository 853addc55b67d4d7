//! The overhead benchmark: each workload under no tracer, latprof (lazy, normal) and the peers
//! that are installed, interleaved round by round, with the kernel's own BPF run-time
//! statistics for every tracer's programs. Prints ratios against the no-tracer runs of the same
//! invocation; never asserts timings.
mod breakdown;
mod builds;
mod chains;
mod configs;
mod fallbacks;
mod floor;
mod measure;
mod report;
mod runtimes;
mod scaling;
mod serve;
mod summary;
mod workloads;

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{Context as _, Result, bail};

use configs::{Config, EXTRA_CONFIGS, MAIN_CONFIGS};
use measure::{Sample, measure};
use report::report;
use workloads::workloads;

#[derive(Debug, clap::Parser)]
#[command(
    name = "latprof-bench",
    about = "latprof's overhead benchmark: latprof against no tracer and its peers"
)]
pub struct BenchArgs {
    /// Rounds; each runs every workload under every configuration once, interleaved.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// A short run that checks the harness end to end (CI): small workloads, one round,
    /// no tracer and latprof only.
    #[arg(long)]
    pub quick: bool,
    /// Where bench.md and bench.json go.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// Only these configurations (none, floor, lazy, normal, lazy-before, normal-before, offcputime, runqlat, bpftrace, perf-sched,
    /// floor-wakers, lazy-debug, lazy-walk, lazy-nocgroups, normal-nocgroups, lazy-wakers, lazy-wakerstacks,
    /// lazy-ustacks, lazy-ustacks-fp, lazy-chains, lazy+normal,
    /// spikes-adaptive, spikes-always; the breakdown's lazy-no-stack, lazy-no-account,
    /// lazy-no-histograms, lazy-no-runq, lazy-no-counters, lazy-no-switch-check, lazy-no-mm,
    /// lazy-skeleton (all of those parts, cgroups and the exit log left out at once), or all of
    /// them as `breakdown`; the fallback builds lazy-5.10, lazy-6.1 and lazy-raw, or
    /// all three as `fallbacks`).
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Only these workloads (pingpong, forkstorm, idle, hackbench-process, hackbench-thread,
    /// node, java, contention-N, spikes-N, scaling-N): a series measured again without the rest.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// The scaling series on 1, 2, ... N CPUs (one pinned ping-pong per CPU, lazy against
    /// normal; full runs: every CPU, quick runs: none). A machine with more CPUs shows what
    /// lazy mode's per-CPU data buys as they grow.
    #[arg(long, value_name = "N")]
    pub cpus: Option<usize>,
    /// Only the `serve` series (latprof serve scraped under load; scrapes of 500 series),
    /// written to serve.md.
    #[arg(long)]
    pub serve: bool,
    /// Only the `builds` series: the static binary against the glibc build, as `stats` and
    /// `serve` under the ping-pong and the fork storm (user and system CPU, peak RSS),
    /// written to builds.md. Full runs include it.
    #[arg(long)]
    pub builds: bool,
    /// Another latprof build (say, the last commit's) whose lazy and normal modes are measured
    /// in the same rounds as `lazy-before` and `normal-before`: a change against what it
    /// changes, in one invocation.
    #[arg(long, value_name = "PATH")]
    pub before: Option<PathBuf>,
    /// The static binary the `builds` series measures (default: target/dist/latprof beside
    /// the target/release this harness runs from).
    #[arg(long)]
    pub static_bin: Option<PathBuf>,
}

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark's one story: build, baseline, each configuration, report"
)]
pub fn run(args: &BenchArgs) -> Result<()> {
    latprof::probe::check_privileges()?;
    let latprof = crate::sibling("latprof")?;
    let workload = crate::sibling("latprof-workload")?;
    let workload_s = workload.to_string_lossy().into_owned();
    // One series alone: printed, and written to its own file.
    let alone = if args.serve {
        Some(("serve.md", serve::run(&latprof, &workload_s, args.quick)?))
    } else if args.builds {
        Some(("builds.md", builds_series(args, &latprof, &workload_s)?))
    } else {
        None
    };
    if let Some((file, md)) = alone {
        print!("{md}");
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        std::fs::write(args.out.join(file), &md)?;
        eprintln!("bench: wrote {}", args.out.join(file).display());
        return Ok(());
    }
    if let Some(before) = &args.before {
        if !before.is_file() {
            bail!("--before {}: no such file", before.display());
        }
        let _ = configs::BEFORE.set(before.clone());
    }
    // The kernel measures every program's run time while this is held.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling BPF run-time statistics")?;
    let wanted: Vec<Config> = MAIN_CONFIGS
        .into_iter()
        .chain(EXTRA_CONFIGS)
        .filter(|c| {
            // The paired halves come with the pair.
            let name = match c {
                Config::PairedLazy | Config::PairedNormal => Config::Paired.name(),
                _ => c.name(),
            };
            args.configs.is_empty()
                || args.configs.iter().any(|n| n == name)
                || (matches!(c, Config::LazyWithout(_) | Config::LazySkeleton)
                    && args.configs.iter().any(|n| n == "breakdown"))
                || (matches!(c, Config::LazyFallback(_))
                    && args.configs.iter().any(|n| n == "fallbacks"))
        })
        // Without `--before` there is nothing to compare with: not a peer missing.
        .filter(|c| {
            args.before.is_some() || !matches!(c, Config::LazyBefore | Config::NormalBefore)
        })
        .filter(|c| {
            !args.quick
                || matches!(
                    c,
                    Config::None
                        | Config::Floor
                        | Config::LazyWithout(configs::Part::Stack)
                        | Config::Lazy
                        | Config::Normal
                        | Config::Paired
                        | Config::PairedLazy
                        | Config::PairedNormal
                        | Config::SpikesAdaptive
                        | Config::SpikesAlways
                )
        })
        .collect();
    let mut skipped = Vec::new();
    let configs: Vec<Config> = wanted
        .into_iter()
        .filter(|c| {
            let ok = c.available();
            if !ok {
                skipped.push(c.name());
            }
            ok
        })
        .collect();
    if !configs.contains(&Config::None) {
        bail!("the benchmark needs the 'none' configuration as its baseline");
    }
    let rounds = if args.quick { 1 } else { args.rounds.max(1) };
    let cpus = args.cpus.unwrap_or(if args.quick {
        0
    } else {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    });
    let works: Vec<_> = workloads(args.quick, &workload_s, cpus)
        .into_iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.contains(&w.name))
        .collect();
    if works.is_empty() {
        bail!("no workload named {}", args.workloads.join(", "));
    }
    let mut samples: BTreeMap<(usize, Config), Vec<Sample>> = BTreeMap::new();
    for round in 1..=rounds {
        for (w, work) in works.iter().enumerate() {
            // Interleaved, and each round starts one configuration later, so that no
            // configuration always runs right after the same one (the first tracer after
            // the no-tracer run measured slower every round when the order was fixed).
            let mut order: Vec<Config> = configs
                .iter()
                .copied()
                .filter(|c| work.configs.contains(c))
                .collect();
            if !order.is_empty() {
                let shift = (round as usize - 1) % order.len();
                order.rotate_left(shift);
            }
            for config in order {
                // The paired halves are measured together, as `Paired`, in both orders each
                // round: the program attached first runs first and meets the colder caches
                // (about 300 ns more per wakeup in the fork storm).
                let runs = match config {
                    Config::PairedLazy | Config::PairedNormal => continue,
                    Config::Paired => vec![
                        vec![Config::PairedLazy, Config::PairedNormal],
                        vec![Config::PairedNormal, Config::PairedLazy],
                    ],
                    _ => vec![vec![config]],
                };
                eprintln!(
                    "bench: round {round}/{rounds} {} under {}",
                    work.name,
                    config.name()
                );
                for run in runs {
                    for (c, sample) in run.iter().zip(measure(&run, work, &latprof)?) {
                        samples.entry((w, *c)).or_default().push(sample);
                    }
                }
            }
        }
    }
    let mut report = report(&works, &configs, &samples, rounds, &skipped);
    // The serve series runs once the others are done, in full runs and when asked for.
    if !args.quick && (args.configs.is_empty() || args.configs.iter().any(|c| c == "serve")) {
        eprintln!("bench: serve series");
        report
            .0
            .push_str(&serve::run(&latprof, &workload_s, false)?);
    }
    if !args.quick && (args.configs.is_empty() || args.configs.iter().any(|c| c == "builds")) {
        eprintln!("bench: builds series");
        report
            .0
            .push_str(&builds_series(args, &latprof, &workload_s)?);
    }
    print!("{}", report.0);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("bench.md"), &report.0)?;
    std::fs::write(args.out.join("bench.json"), &report.1)?;
    eprintln!(
        "bench: wrote {} and {}",
        args.out.join("bench.md").display(),
        args.out.join("bench.json").display()
    );
    Ok(())
}

/// The `builds` series on the ping-pong and the fork storm (or the workloads asked for).
fn builds_series(args: &BenchArgs, latprof: &std::path::Path, workload: &str) -> Result<String> {
    let works: Vec<(String, Vec<String>)> = workloads(args.quick, workload, 0)
        .into_iter()
        .filter(|w| {
            if args.workloads.is_empty() {
                w.name == "pingpong" || w.name == "forkstorm"
            } else {
                args.workloads.contains(&w.name)
            }
        })
        .map(|w| (w.name, w.command))
        .collect();
    if works.is_empty() {
        bail!("no workload named {}", args.workloads.join(", "));
    }
    let rounds = if args.quick { 1 } else { args.rounds.max(1) };
    let musl = args.static_bin.clone().unwrap_or_else(|| {
        latprof
            .parent()
            .and_then(std::path::Path::parent)
            .unwrap_or(std::path::Path::new("target"))
            .join("dist/latprof")
    });
    builds::run(latprof, &musl, &works, rounds)
}

//! The workloads a run measures, each with the configurations it runs under: the ping-pong,
//! fork storms, idle, hackbench where it is installed, contention, the runtimes' (Node, Java)
//! in a full run, the scaling series and the spike readers.
use super::{
    configs::{Config, Fallback, MAIN_CONFIGS, Part, Workload, which},
    runtimes, scaling,
};

/// The workloads of a run (`quick`: the smoke test's few), run by `workload`
/// (latprof-workload) where they are latprof's own; `cpus` is the scaling series' width.
#[expect(
    clippy::too_many_lines,
    reason = "the table of every benchmark workload, one entry each: read as a list"
)]
pub(super) fn workloads(quick: bool, workload: &str, cpus: usize) -> Vec<Workload> {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let (trips, forks, idle) = if quick {
        (3_000, 200, "1")
    } else {
        (100_000, 2_000, "5")
    };
    let all: Vec<Config> = MAIN_CONFIGS.to_vec();
    // The quick run measures the floor on the ping-pong only (what its smoke test reads).
    let others: Vec<Config> = all
        .iter()
        .copied()
        .filter(|c| !quick || *c != Config::Floor)
        .collect();
    let mut out = vec![
        Workload {
            name: "pingpong".into(),
            command: s(&[
                workload,
                "pingpong",
                "--processes",
                "--cpu",
                "0",
                "--count",
                &trips.to_string(),
            ]),
            units: trips,
            unit: "round trip",
            configs: all
                .iter()
                .copied()
                .chain([
                    Config::LazyDebug,
                    Config::LazyWalk,
                    Config::LazyNoCgroups,
                    Config::NormalNoCgroups,
                    Config::FloorWakers,
                    Config::LazyWakers,
                    Config::LazyWakerStacks,
                    Config::LazyChains,
                    Config::LazyUserStacks,
                    Config::LazyUserStacksFp,
                ])
                .chain(Part::ALL.map(Config::LazyWithout))
                .chain([Config::LazySkeleton])
                .chain(Fallback::ALL.map(Config::LazyFallback))
                .collect(),
        },
        Workload {
            name: "forkstorm".into(),
            command: s(&[workload, "forks", "--count", &forks.to_string()]),
            units: forks,
            unit: "fork",
            configs: others
                .iter()
                .copied()
                .chain([
                    Config::Paired,
                    Config::PairedLazy,
                    Config::PairedNormal,
                    // Every fork's exit merges its records into the per-cgroup table, and
                    // sends them to user space.
                    Config::LazyNoCgroups,
                    Config::NormalNoCgroups,
                    Config::LazyNoExitLog,
                ])
                .collect(),
        },
        Workload {
            name: "idle".into(),
            command: s(&["sleep", idle]),
            units: 0,
            unit: "",
            configs: others
                .iter()
                .copied()
                .chain(Fallback::ALL.map(Config::LazyFallback))
                .collect(),
        },
    ];
    if !quick && !which("hackbench") {
        eprintln!(
            "bench: no hackbench (Debian: apt-get install rt-tests): the hackbench workloads are left out"
        );
    }
    if !quick && which("hackbench") {
        for (name, kind) in [
            ("hackbench-process", "--process"),
            ("hackbench-thread", "--threads"),
        ] {
            out.push(Workload {
                name: name.into(),
                command: s(&[
                    "hackbench",
                    "-g",
                    "8",
                    kind,
                    "--pipe",
                    "-l",
                    "2000",
                    "-s",
                    "512",
                ]),
                units: 0,
                unit: "",
                configs: all
                    .iter()
                    .copied()
                    .chain([
                        Config::LazyNoCgroups,
                        Config::NormalNoCgroups,
                        Config::FloorWakers,
                        Config::LazyWakers,
                        Config::LazyWakerStacks,
                        Config::LazyChains,
                        Config::LazyUserStacks,
                        Config::LazyUserStacksFp,
                    ])
                    .chain(Part::ALL.map(Config::LazyWithout))
                    .chain([Config::LazySkeleton])
                    .chain(Fallback::ALL.map(Config::LazyFallback))
                    .collect(),
            });
        }
    }
    if !quick {
        out.extend(runtimes::workloads());
    }
    // 1, 2, 4 ... up to 4 x cores processes sleeping 100 us in a loop, at one backtrace.
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let counts: Vec<usize> = std::iter::successors(Some(1), |n| Some(n * 2))
        .take_while(|n| *n <= cores * 4)
        .collect();
    let sleepers = |name: String, n: usize, time: &str, configs: Vec<Config>| Workload {
        name,
        command: s(&[
            workload,
            "sleepers",
            "--procs",
            &n.to_string(),
            "--interval",
            "100us",
            "--time",
            time,
        ]),
        units: 0,
        unit: "",
        configs,
    };
    if !quick {
        for &n in &counts {
            out.push(sleepers(
                format!("contention-{n}"),
                n,
                "2s",
                vec![Config::None, Config::Lazy, Config::Normal],
            ));
        }
    }
    // Scaling: one pinned ping-pong per CPU, on 1, 2, ... `cpus` CPUs at once.
    out.extend(scaling::workloads(workload, cpus, trips));
    // Spikes: every sleep is an event for the reader; the two wakeup policies.
    let spike_counts = if quick { vec![2] } else { counts };
    for n in spike_counts {
        out.push(sleepers(
            format!("spikes-{n}"),
            n,
            if quick { "1s" } else { "2s" },
            vec![Config::None, Config::SpikesAdaptive, Config::SpikesAlways],
        ));
    }
    out
}

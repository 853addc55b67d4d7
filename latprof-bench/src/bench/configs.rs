//! What the benchmark runs: the tracer configurations and the workloads.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use super::fallbacks::Fallback;

/// A tracer configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Config {
    None,
    /// latprof lazy and normal as another build runs them (`--before PATH`): the same
    /// workloads, in the same rounds, so that a change is measured against what it changes.
    LazyBefore,
    NormalBefore,
    /// Do-nothing programs on latprof's hooks (`--debug-floor`): the kernel's cost of running
    /// any program there, which latprof's own are measured against.
    Floor,
    /// The floor with `--wakers`: the same and, on the hooks `--wakers` adds (`sched_waking`,
    /// the timer callbacks'), do-nothing programs too. Its time less the floor's is the least
    /// that attributing each sleep to its waker could add.
    FloorWakers,
    Lazy,
    Normal,
    Offcputime,
    Runqlat,
    Bpftrace,
    PerfSched,
    /// latprof lazy with `--debug-checks` (the cost of the checks).
    LazyDebug,
    /// latprof lazy walking every counted sleep's stack (`--no-stack-cache`).
    LazyWalk,
    /// latprof lazy without cgroup attribution (the hidden `--debug-no-cgroups`): what
    /// attributing each sleep to its cgroup costs is lazy's time less this one's.
    LazyNoCgroups,
    /// latprof normal without cgroup attribution: normal mode's exit merge into the per-cgroup
    /// table and its per-event record search, against `Normal`.
    NormalNoCgroups,
    /// latprof lazy without the exited tasks' log (the hidden `--debug-no-exit-log`): what
    /// sending each exiting task's records to user space costs is lazy's time less this one's.
    LazyNoExitLog,
    /// latprof lazy with waker attribution (`--wakers`): what attributing each sleep to its
    /// waker costs is this one's time less lazy's.
    LazyWakers,
    /// latprof lazy with each waker's backtrace (`--waker-stacks`).
    LazyWakerStacks,
    /// latprof lazy with wait chains (`--chains`, which implies `--wakers`): what following
    /// each wait to what its waker was doing costs is this one's time less lazy's (and less
    /// `LazyWakers`' for the chains alone).
    LazyChains,
    /// latprof lazy with each sleeper's user backtrace (`--user-stacks`): the walk per
    /// counted sleep is this one's time less lazy's; naming the frames is its CPU time less
    /// lazy's.
    LazyUserStacks,
    /// `LazyUserStacks` walking by frame pointers only (`--debug-no-unwind-tables`, as on a
    /// kernel without `bpf_loop`): what the unwind tables' steps cost is `LazyUserStacks`'
    /// time less this one's.
    LazyUserStacksFp,
    /// latprof lazy and latprof normal attached together, in both orders each round: both see
    /// the same events in the same run, so the difference between their programs is the
    /// modes' and not the runs'. Measured as one, reported as `PairedLazy` and `PairedNormal`.
    Paired,
    PairedLazy,
    PairedNormal,
    /// `latprof spikes` on every sleep, reader woken only when it waits.
    SpikesAdaptive,
    /// `latprof spikes` on every sleep, reader woken on every event.
    SpikesAlways,
    /// latprof lazy without one part of its hot programs' work (`--debug-skip`): what the
    /// part costs is lazy's time less this one's (the breakdown).
    LazyWithout(Part),
    /// latprof lazy without every part `--debug-skip` can leave out, nor cgroups, nor the
    /// exited tasks' log: each sleep timed, and nothing kept. The least any configuration of
    /// latprof's programs costs, against which the goals are read.
    LazySkeleton,
    /// latprof lazy in a fallback build of its programs, as older kernels load it (hidden
    /// flags): issue 30's goals within 1.5x for each.
    LazyFallback(Fallback),
}

/// A part of the hot programs' work that `--debug-skip` leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Part {
    Stack,
    Account,
    Histograms,
    Runq,
    Counters,
    SwitchCheck,
    Mm,
}

/// `--debug-skip`'s value for `Config::LazySkeleton`: every part.
static SKELETON_SKIPS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| Part::ALL.map(Part::flag).join(","));

impl Part {
    pub(super) const ALL: [Self; 7] = [
        Self::Stack,
        Self::Account,
        Self::Histograms,
        Self::Runq,
        Self::Counters,
        Self::SwitchCheck,
        Self::Mm,
    ];

    /// Its name for `--debug-skip`.
    pub(super) fn flag(self) -> &'static str {
        match self {
            Self::Stack => "stack",
            Self::Account => "account",
            Self::Histograms => "histograms",
            Self::Runq => "runq",
            Self::Counters => "counters",
            Self::SwitchCheck => "switch-check",
            Self::Mm => "mm",
        }
    }

    /// What the part is, for the report.
    pub(super) fn what(self) -> &'static str {
        match self {
            Self::Stack => "a counted sleep's backtrace (stack cache or walk)",
            Self::Account => "accounting: records, histograms, tables",
            Self::Histograms => "the per-cause histograms",
            Self::Runq => "run-queue waits (a task lookup and an account per switch-in)",
            Self::Counters => "pipeline and tick counters",
            Self::SwitchCheck => "the hidden-switch check per switch",
            Self::Mm => "the sleeper's memory-map read (latencytop's global rule)",
        }
    }
}

/// The configurations of the main workloads.
pub(super) const MAIN_CONFIGS: [Config; 10] = [
    Config::None,
    Config::Floor,
    Config::Lazy,
    Config::Normal,
    Config::LazyBefore,
    Config::NormalBefore,
    Config::Offcputime,
    Config::Runqlat,
    Config::Bpftrace,
    Config::PerfSched,
];

/// Configurations of their own series: the debug checks and the stack cache on the ping-pong,
/// lazy and normal together on the fork storm, and the spikes.
pub(super) const EXTRA_CONFIGS: [Config; 27] = [
    Config::FloorWakers,
    Config::LazyDebug,
    Config::LazyWalk,
    Config::LazyNoCgroups,
    Config::NormalNoCgroups,
    Config::LazyNoExitLog,
    Config::LazyWakers,
    Config::LazyWakerStacks,
    Config::LazyChains,
    Config::LazyUserStacks,
    Config::LazyUserStacksFp,
    Config::Paired,
    Config::PairedLazy,
    Config::PairedNormal,
    Config::SpikesAdaptive,
    Config::SpikesAlways,
    Config::LazyWithout(Part::Stack),
    Config::LazyWithout(Part::Account),
    Config::LazyWithout(Part::Histograms),
    Config::LazyWithout(Part::Runq),
    Config::LazyWithout(Part::Counters),
    Config::LazyWithout(Part::SwitchCheck),
    Config::LazyWithout(Part::Mm),
    Config::LazySkeleton,
    Config::LazyFallback(Fallback::Linux510),
    Config::LazyFallback(Fallback::Linux61),
    Config::LazyFallback(Fallback::Raw),
];

/// The build `--before` names, whose lazy and normal runs are measured beside this one's.
pub(super) static BEFORE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// bpftrace's off-CPU time keyed by kernel stack, on tracepoints (no kprobes here).
pub(super) const BPFTRACE_OFFCPU: &str = "tracepoint:sched:sched_switch { \
    @start[args->prev_pid] = nsecs; @stk[args->prev_pid] = kstack; \
    $s = @start[args->next_pid]; \
    if ($s) { @off[@stk[args->next_pid]] = sum(nsecs - $s); \
    delete(@start[args->next_pid]); delete(@stk[args->next_pid]); } }";

impl Config {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Floor => "floor",
            Self::FloorWakers => "floor-wakers",
            Self::LazyBefore => "lazy-before",
            Self::NormalBefore => "normal-before",
            Self::Lazy => "lazy",
            Self::Normal => "normal",
            Self::Offcputime => "offcputime",
            Self::Runqlat => "runqlat",
            Self::Bpftrace => "bpftrace",
            Self::PerfSched => "perf-sched",
            Self::LazyDebug => "lazy-debug",
            Self::LazyWalk => "lazy-walk",
            Self::LazyNoCgroups => "lazy-nocgroups",
            Self::NormalNoCgroups => "normal-nocgroups",
            Self::LazyNoExitLog => "lazy-noexitlog",
            Self::LazyWakers => "lazy-wakers",
            Self::LazyWakerStacks => "lazy-wakerstacks",
            Self::LazyChains => "lazy-chains",
            Self::LazyUserStacks => "lazy-ustacks",
            Self::LazyUserStacksFp => "lazy-ustacks-fp",
            Self::Paired => "lazy+normal",
            Self::PairedLazy => "lazy (paired)",
            Self::PairedNormal => "normal (paired)",
            Self::SpikesAdaptive => "spikes-adaptive",
            Self::SpikesAlways => "spikes-always",
            Self::LazyWithout(part) => match part {
                Part::Stack => "lazy-no-stack",
                Part::Account => "lazy-no-account",
                Part::Histograms => "lazy-no-histograms",
                Part::Runq => "lazy-no-runq",
                Part::Counters => "lazy-no-counters",
                Part::SwitchCheck => "lazy-no-switch-check",
                Part::Mm => "lazy-no-mm",
            },
            Self::LazySkeleton => "lazy-skeleton",
            Self::LazyFallback(fallback) => fallback.name(),
        }
    }

    /// latprof's flags for a configuration of `stats`.
    fn stats_flags(self) -> Vec<&'static str> {
        match self {
            Self::Lazy | Self::PairedLazy | Self::LazyBefore => vec!["--mode", "lazy"],
            Self::Normal | Self::PairedNormal | Self::NormalBefore => vec!["--mode", "normal"],
            Self::Floor => vec!["--debug-floor"],
            Self::FloorWakers => vec!["--debug-floor", "--wakers"],
            Self::LazyWalk => vec!["--no-stack-cache"],
            Self::LazyNoCgroups => vec!["--debug-no-cgroups"],
            Self::NormalNoCgroups => vec!["--mode", "normal", "--debug-no-cgroups"],
            Self::LazyNoExitLog => vec!["--debug-no-exit-log"],
            Self::LazyWakers => vec!["--wakers"],
            Self::LazyWakerStacks => vec!["--waker-stacks"],
            Self::LazyChains => vec!["--chains"],
            Self::LazyUserStacks => vec!["--user-stacks"],
            Self::LazyUserStacksFp => vec!["--user-stacks", "--debug-no-unwind-tables"],
            Self::LazyDebug => vec!["--debug-checks", "--log", "/dev/null"],
            Self::LazyWithout(part) => vec!["--debug-skip", part.flag()],
            Self::LazySkeleton => vec![
                "--debug-skip",
                SKELETON_SKIPS.as_str(),
                "--debug-no-cgroups",
                "--debug-no-exit-log",
            ],
            Self::LazyFallback(fallback) => fallback.flags().to_vec(),
            _ => Vec::new(),
        }
    }

    pub(super) fn command(self, latprof: &Path) -> Option<Command> {
        let mut cmd = match self {
            Self::None | Self::Paired => return None,
            Self::SpikesAdaptive | Self::SpikesAlways => {
                let mut c = Command::new(latprof);
                let policy = if self == Self::SpikesAlways {
                    "always"
                } else {
                    "adaptive"
                };
                // Every counted sleep is a spike.
                c.args([
                    "--all-sleeps",
                    "--spike",
                    "1us",
                    "--wakeup",
                    policy,
                    "spikes",
                ]);
                c
            }
            Self::Offcputime => Command::new("/usr/sbin/offcputime"),
            Self::Runqlat => Command::new("/usr/sbin/runqlat"),
            Self::Bpftrace => {
                let mut c = Command::new("bpftrace");
                c.args(["-e", BPFTRACE_OFFCPU]);
                c
            }
            Self::PerfSched => {
                let mut c = Command::new("perf");
                c.args([
                    "sched",
                    "record",
                    "-a",
                    "-o",
                    "/tmp/latprof-bench-perf.data",
                ]);
                c
            }
            _ => {
                let binary = if matches!(self, Self::LazyBefore | Self::NormalBefore) {
                    BEFORE.get()?.as_path()
                } else {
                    latprof
                };
                let mut c = Command::new(binary);
                c.args(self.stats_flags())
                    .args(["stats", "--duration", "1h"]);
                c
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Some(cmd)
    }

    /// latprof itself (it says on stderr when it is attached).
    pub(super) fn is_latprof(self) -> bool {
        matches!(
            self,
            Self::Lazy
                | Self::Floor
                | Self::FloorWakers
                | Self::LazyBefore
                | Self::NormalBefore
                | Self::Normal
                | Self::LazyDebug
                | Self::LazyWalk
                | Self::LazyNoCgroups
                | Self::NormalNoCgroups
                | Self::LazyNoExitLog
                | Self::LazyWakers
                | Self::LazyWakerStacks
                | Self::LazyChains
                | Self::LazyUserStacks
                | Self::LazyUserStacksFp
                | Self::PairedLazy
                | Self::PairedNormal
                | Self::SpikesAdaptive
                | Self::SpikesAlways
                | Self::LazyWithout(_)
                | Self::LazySkeleton
                | Self::LazyFallback(_)
        )
    }

    pub(super) fn available(self) -> bool {
        match self {
            Self::None
            | Self::Floor
            | Self::FloorWakers
            | Self::Lazy
            | Self::Normal
            | Self::LazyDebug
            | Self::LazyWalk
            | Self::LazyNoCgroups
            | Self::NormalNoCgroups
            | Self::LazyNoExitLog
            | Self::LazyWakers
            | Self::LazyWakerStacks
            | Self::LazyChains
            | Self::LazyUserStacks
            | Self::LazyUserStacksFp
            | Self::Paired
            | Self::PairedLazy
            | Self::PairedNormal
            | Self::SpikesAdaptive
            | Self::SpikesAlways
            | Self::LazyWithout(_)
            | Self::LazySkeleton
            | Self::LazyFallback(_) => true,
            Self::LazyBefore | Self::NormalBefore => BEFORE.get().is_some(),
            Self::Offcputime => Path::new("/usr/sbin/offcputime").exists(),
            Self::Runqlat => Path::new("/usr/sbin/runqlat").exists(),
            Self::Bpftrace => which("bpftrace"),
            Self::PerfSched => which("perf"),
        }
    }
}

pub(super) fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// A workload: a command and what one run of it is made of.
pub(super) struct Workload {
    pub(super) name: String,
    pub(super) command: Vec<String>,
    /// Units per run (round trips, forks) for per-unit numbers; 0 for none.
    pub(super) units: u64,
    pub(super) unit: &'static str,
    /// Configurations this workload runs under (the contention series uses latprof only).
    pub(super) configs: Vec<Config>,
}

/// The workloads, run by `workload` (latprof-workload) where they are latprof's own.
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
        out.extend(super::runtimes::workloads());
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
    out.extend(super::scaling::workloads(workload, cpus, trips));
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

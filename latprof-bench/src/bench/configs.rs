//! What the benchmark runs: the tracer configurations and the workloads.
use std::{
    path::Path,
    process::{Command, Stdio},
};

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
    pub(super) fn what(self) -> &'static str {
        match self {
            Self::Linux510 => {
                "Debian 11's 5.10 build (bounded-loop stack cache, state from the task)"
            }
            Self::Linux61 => "Debian 12's 6.1 build (no kfuncs: the stack copied by a helper)",
            Self::Raw => "raw tracepoints (no BTF tracepoints: backtraces walked at switch-out)",
        }
    }
}

//! The settings of one run: what the user asked for, as the loader writes it into the
//! programs' globals and map sizes.
use std::time::Duration;

use latprof_common::Defect;

/// The defaults of the table sizes, the backtrace depth and the cutoff: the command line's
/// (`cli.rs`) and `ProbeConfig::default`'s, written once.
pub const MAX_TASKS: u32 = 8192;
pub const MAX_RECORDS: u32 = 16384;
pub const MAX_STACKS: u32 = 8192;
pub const MAX_WAKERS: u32 = 8192;
pub const MAX_CHAINS: u32 = 8192;
pub const MAX_USER_STACKS: u32 = 8192;
pub const STACK_DEPTH: u16 = 12;
/// `--inter-cutoff`'s default (the command line spells it `5ms`, and a test checks the two
/// agree).
pub const INTER_CUTOFF: Duration = Duration::from_millis(5);

/// How accounted sleeps reach the global table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Per-task records only; merged into the global table when the task exits.
    #[default]
    Lazy,
    /// Every accounted sleep also updates the global table (latencytop's mode 1).
    Normal,
}

impl Mode {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lazy => "lazy",
            Self::Normal => "normal",
        }
    }
}

/// Everything fixed for one run.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    pub mode: Mode,
    /// Only this process (tgid); `None` traces all.
    pub pid: Option<u32>,
    pub include_self: bool,
    /// Interruptible sleeps longer than this are not counted; `None` counts all.
    pub inter_cutoff: Option<Duration>,
    pub max_tasks: u32,
    pub max_records: u32,
    pub max_stacks: u32,
    /// Frames shown per backtrace (the walk takes this many plus room for dropped ones).
    pub stack_depth: u16,
    /// Also keep run-queue latency and per-cause histograms (what `top` shows).
    pub details: bool,
    /// Take backtraces at wakeup from the BTF tracepoint where the kernel has one (false forces
    /// the raw-tracepoint fallback that walks at every switch-out, as on older kernels).
    pub btf_wakeup: bool,
    /// With the BTF wakeup program, answer a task's repeated sleeps from its stack cache
    /// instead of walking its stack each time (false walks every counted sleep).
    pub stack_cache: bool,
    /// Sleeps and run-queue waits at least this long go to the spike ring buffer; `None`: no
    /// spike events.
    pub spike: Option<Duration>,
    pub wakeup: Wakeup,
    /// Debugging and the tests' knobs, apart from the user's settings.
    pub debug: DebugConfig,
    /// The per-CPU symbols of /proc/kallsyms as the session read them with the symbols, so
    /// that a run reads the file once; `None`: the probe reads them if `--wakers` needs them.
    pub percpu: Option<crate::symbols::PercpuSymbols>,
    /// Attribute each sleep to its task's cgroup v2 id (where the host mounts cgroup2).
    pub cgroups: bool,
    /// Send each exiting task's records to user space, so that profiles can label its last
    /// sleeps with its process and thread.
    pub exits: bool,
    /// Trace only tasks in these cgroup v2 directories or below them (at most
    /// `MAX_CGROUP_FILTERS`), filtered in the kernel.
    pub cgroup_filter: Vec<std::path::PathBuf>,
    /// Attribute each counted sleep to its waker (task, timer or interrupt), per cause and
    /// sleeping process, in a table of `max_wakers` entries per CPU (`--wakers`, opt-in).
    pub wakers: bool,
    pub max_wakers: u32,
    /// Also key the wakers by the waker's kernel backtrace (a stack walk per wakeup).
    pub waker_stacks: bool,
    /// With `wakers`: add each counted sleep a task woke to what that waker's most recent sleep
    /// was (`--chains`), in a table of `max_chains` entries per CPU.
    pub chains: bool,
    pub max_chains: u32,
    /// Walk each sleeper's user backtrace at switch-out and key causes by kernel + user
    /// backtrace (`--user-stacks`), in a table of `max_user_stacks` user backtraces.
    pub user_stacks: bool,
    pub max_user_stacks: u32,
}

/// The knobs of debugging (`--debug-checks`) and of the tests (the hidden `--debug-*` flags):
/// all off by default, and off in every run a user makes but for `checks`.
#[derive(Clone, Debug, Default)]
pub struct DebugConfig {
    /// Count (and log through aya-log) consistency anomalies (`--debug-checks`); off, the
    /// checks are not loaded.
    pub checks: bool,
    /// Load a `sched_switch` the verifier must reject (tests the rejection path).
    pub force_reject: bool,
    /// Learn the stack cache in a bounded loop as on kernels without `bpf_loop`, even where
    /// the kernel has it (tests that form here).
    pub bounded_cache: bool,
    /// Call no kfunc, as on kernels without them (before 6.2: the stack cache copies the
    /// stack with `bpf_probe_read_kernel`), even where the kernel has them.
    pub no_kfuncs: bool,
    /// Keep every task entry in the hash as on kernels without compare-and-swap (no task
    /// slots), even where the kernel has it.
    pub no_task_slots: bool,
    /// Call a kfunc the kernel has but refuses in these programs in place of each kfunc
    /// (tests the load without kfuncs that follows such a refusal, as on a kernel without a
    /// JIT).
    pub refuse_kfuncs: bool,
    /// Ignore about one wakeup in N (0: none), as a kernel that hides tasks from tracing
    /// does: for tests of the recovery of such sleeps.
    pub hide_wakeups: u32,
    /// The wakeups `hide_wakeups` hides are not logged as gaps: the check of lost and
    /// recovered sleeps against gaps must then find them unexplained (for tests).
    pub hide_unlogged: bool,
    /// A defect injected on purpose (`--debug-defect`; `None`: none), which the tests listed
    /// in latprof/tests/must_fail must catch.
    pub defect: Option<Defect>,
    /// Read a switching-out task's state from the task as on kernels whose `sched_switch` has
    /// no `prev_state`, even where it has (tests that path).
    pub state_from_task: bool,
    /// Walk user backtraces by frame pointers only, as without `bpf_loop` (tests that path).
    pub no_unwind_tables: bool,
    /// Leave out sleeps shorter than this instead of latencytop's 1 us (`None`), so that
    /// tests can make them.
    pub min_sleep: Option<Duration>,
    /// Parts of the hot programs' work left out (`--debug-skip`, the benchmark's breakdown).
    pub skip: Skip,
    /// Attach the floor instead of latprof's programs: on each of their hooks a program of
    /// the same type that does nothing (`--debug-floor`, for the benchmark).
    pub floor: bool,
}

/// `--debug-skip`: the parts of the hot programs' work a run leaves out, so that the benchmark
/// can say what each costs (the run's time less that of the run without it). Nothing a run
/// leaves out is counted right: for the benchmark only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skip {
    /// A counted sleep's backtrace (every cause is then "unavailable").
    pub stack: bool,
    /// Records, histograms and tables: sleeps and waits are timed but not kept.
    pub account: bool,
    /// The pipeline and tick counters.
    pub counters: bool,
    /// `sched_switch`'s check for switches the kernel ran no program for.
    pub switch_check: bool,
    /// The read of a sleeper's memory map (latencytop's rule for the global table).
    pub mm: bool,
    /// The per-cause histograms.
    pub histograms: bool,
    /// Run-queue latency ("waiting for CPU"): a task lookup on every switch.
    pub runq: bool,
}

impl Skip {
    /// The parts by name, as `--debug-skip` takes them.
    pub const PARTS: [&str; 7] = [
        "stack",
        "account",
        "counters",
        "switch-check",
        "mm",
        "histograms",
        "runq",
    ];

    /// Leaves out the part named `name` (one of `PARTS`).
    ///
    /// # Errors
    /// A name not in `PARTS`.
    pub fn add(&mut self, name: &str) -> Result<(), String> {
        let part = match name {
            "stack" => &mut self.stack,
            "account" => &mut self.account,
            "counters" => &mut self.counters,
            "switch-check" => &mut self.switch_check,
            "mm" => &mut self.mm,
            "histograms" => &mut self.histograms,
            "runq" => &mut self.runq,
            _ => {
                return Err(format!(
                    "no part '{name}' (one of {})",
                    Self::PARTS.join(", ")
                ));
            }
        };
        *part = true;
        Ok(())
    }

    /// The parts the programs test (`DEBUG_SKIP`'s bits); histograms and run-queue waits have
    /// settings of their own.
    #[must_use]
    pub fn kernel_bits(self) -> u32 {
        [
            (self.stack, latprof_common::SKIP_STACK),
            (self.account, latprof_common::SKIP_ACCOUNT),
            (self.counters, latprof_common::SKIP_COUNTERS),
            (self.switch_check, latprof_common::SKIP_SWITCH_CHECK),
            (self.mm, latprof_common::SKIP_MM),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(0, |bits, (_, bit)| bits | bit)
    }
}

/// Cgroups `--cgroup` can name (the kernel's filter array).
pub const MAX_CGROUP_FILTERS: usize = 8;

/// When the spike reader is woken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Wakeup {
    /// Only when the reader said it is about to sleep, or the buffer passes its fill mark.
    #[default]
    Adaptive,
    /// On every event.
    Always,
}

impl ProbeConfig {
    /// Whether wait chains are followed: `--chains`, which needs the wakers.
    #[must_use]
    pub fn chains_on(&self) -> bool {
        self.wakers && self.chains
    }

    /// Whether each waking's backtrace is walked: `--waker-stacks`, which needs the wakers.
    #[must_use]
    pub fn waker_stacks_on(&self) -> bool {
        self.wakers && self.waker_stacks
    }
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Lazy,
            pid: None,
            include_self: false,
            inter_cutoff: Some(INTER_CUTOFF),
            max_tasks: MAX_TASKS,
            max_records: MAX_RECORDS,
            max_stacks: MAX_STACKS,
            stack_depth: STACK_DEPTH,
            details: true,
            btf_wakeup: true,
            stack_cache: true,
            spike: None,
            wakeup: Wakeup::Adaptive,
            debug: DebugConfig::default(),
            percpu: None,
            cgroups: true,
            exits: true,
            cgroup_filter: Vec::new(),
            wakers: false,
            max_wakers: MAX_WAKERS,
            waker_stacks: false,
            chains: false,
            max_chains: MAX_CHAINS,
            user_stacks: false,
            max_user_stacks: MAX_USER_STACKS,
        }
    }
}

/// Frames walked beyond the shown depth: the tracing frames and the scheduler's own, which
/// are dropped before the cause frames.
pub(super) const STACK_SLACK_FRAMES: u32 = 16;

/// latencytop measures in units of 1024 ns (`ns >> 10`, which it calls usecs).
pub(super) const LATENCYTOP_UNIT_NS: u64 = 1024;

/// The longest interruptible sleep that still counts, compared the way latencytop compares: it
/// drops a sleep when `ns >> 10 > limit_in_usecs`, so `--inter-cutoff 5ms` keeps sleeps up to
/// 5000 * 1024 + 1023 ns, exactly the sleeps the kernel's latencytop keeps. Sleeps shorter than
/// one unit (`ns >> 10 == 0`) are dropped the same way (`MIN_SLEEP_NS`).
#[must_use]
pub fn latencytop_cutoff_ns(limit: Duration) -> u64 {
    let usecs = u64::try_from(limit.as_micros()).unwrap_or(u64::MAX);
    usecs
        .saturating_mul(LATENCYTOP_UNIT_NS)
        .saturating_add(LATENCYTOP_UNIT_NS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoff_matches_latencytop_units() {
        let cutoff = latencytop_cutoff_ns(Duration::from_millis(5));
        // latencytop: `if (inter && usecs > 5000) return;` with usecs = ns >> 10.
        assert_eq!(cutoff >> 10, 5000);
        assert_eq!((cutoff + 1) >> 10, 5001);
        assert_eq!(latencytop_cutoff_ns(Duration::MAX), u64::MAX);
    }
}

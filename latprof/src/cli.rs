//! Command line (clap derive). Settings shared by every command are global flags, so
//! `latprof --mode=lazy stats` and `latprof stats --mode=lazy` both work.
use std::{path::PathBuf, time::Duration};

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use latprof_common::{DEFECTS, Defect, defect_named};

use crate::{
    export::{By, Format},
    probe::{DebugConfig, Mode, ProbeConfig, Skip, Wakeup},
    time,
};

#[derive(Debug, Parser)]
#[command(
    name = "latprof",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LATPROF_REVISION"), ")"),
    about = "Where do tasks sleep? latencytop's accounting in eBPF",
    after_help = EXAMPLES,
    after_long_help = concat!(
        "Examples:\n",
        "  sudo latprof top\n",
        "  sudo latprof stats --duration 10s --pid 1234\n",
        "  sudo latprof --mode=lazy record -o run.lpr --duration 1h\n",
        "  latprof replay run.lpr\n",
        "\n",
        "Exit status:\n",
        "  0  success\n",
        "  1  latprof failed while it ran (a kernel table could not be read, a file could not be\n",
        "     written, memory ran out); one line on stderr says why\n",
        "  2  bad input, said in one line before anything is loaded: an unknown or bad flag, a\n",
        "     missing privilege (root, or CAP_BPF and CAP_PERFMON), a file latprof refuses"
    )
)]
pub struct Cli {
    /// lazy: per-task records, merged into the global table at exit (cheap); normal: every
    /// event also updates the global table (latencytop's mode 1).
    #[arg(long, global = true, help_heading = "Probe", value_enum, default_value_t = Mode::Lazy)]
    pub mode: Mode,
    /// The sample labels of pprof profiles (stats and dump --format pprof, serve), comma-
    /// separated: `state`, `pid`, `thread_name`, `container_id` (the full id), `reason`, or
    /// `none`. The reason is each sample's root frame whatever this says; as a label it is a
    /// series per reason to a fleet backend.
    #[arg(long, global = true, help_heading = "Output", value_parser = parse_labels, default_value = "state,pid,thread_name,container_id", value_name = "LIST")]
    pub profile_labels: crate::export::pprof::Labels,
    /// Frames shown per backtrace [default: 12; replay and dump: the recording's].
    #[arg(long, global = true, help_heading = "Probe", value_parser = clap::value_parser!(u16).range(1..=127))]
    pub stack_depth: Option<u16>,
    /// Interruptible sleeps longer than this are not counted (usually requested waits: poll,
    /// select, nanosleep of seconds).
    #[arg(long, global = true, help_heading = "Probe", value_parser = time::parse_duration, default_value = "5ms")]
    pub inter_cutoff: Duration,
    /// Count every sleep, however long (removes --inter-cutoff).
    #[arg(long, global = true, help_heading = "Probe")]
    pub all_sleeps: bool,
    /// Also count latprof's own threads.
    #[arg(long, global = true, help_heading = "Probe")]
    pub include_self: bool,
    /// Only tasks in this cgroup v2 directory or below it (repeatable, at most 8), filtered
    /// in the kernel: e.g. /sys/fs/cgroup/system.slice/nginx.service.
    #[arg(long, global = true, help_heading = "Probe", value_name = "PATH")]
    pub cgroup: Vec<PathBuf>,
    /// Attribute each counted sleep to its waker (task, timer or interrupt): JSON and `top`
    /// show who woke each cause; `--format folded` prints `waker;--;sleeper frames` chains.
    /// Opt-in: it adds 15-35% to latprof's kernel time per event (docs/guide/wakers.md).
    #[arg(long, global = true, help_heading = "Probe")]
    pub wakers: bool,
    /// With wakers (implies --wakers), also each waker's kernel backtrace, per (sleeper
    /// cause, waker backtrace), for offwaketime-style chains; walks a stack per wakeup.
    #[arg(long, global = true, help_heading = "Probe")]
    pub waker_stacks: bool,
    /// Wakers kept per CPU (kernel table size; one entry per cause, sleeping process and
    /// waker): the rest are counted under their cause's "other".
    #[arg(long, global = true, help_heading = "Table sizes", default_value_t = crate::probe::MAX_WAKERS,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_wakers: u32,
    /// Follow each counted sleep a task woke to what that waker was doing meanwhile: its own
    /// sleep (its cause, and what woke that, level by level), its wait for a CPU, or running
    /// (implies --wakers). JSON's `behind`, folded chains, pprof's `chained_off_cpu`
    /// (docs/guide/chains.md).
    #[arg(long, global = true, help_heading = "Probe")]
    pub chains: bool,
    /// Levels of a wait chain shown (--chains).
    #[arg(long, global = true, help_heading = "Output", default_value_t = 4,
          value_parser = clap::value_parser!(u8).range(1..=16))]
    pub chain_depth: u8,
    /// Chain links kept per CPU (kernel table size; one entry per sleeper cause and process,
    /// waker process and waker cause): the rest are counted in chain_table_full.
    #[arg(long, global = true, help_heading = "Table sizes", default_value_t = crate::probe::MAX_CHAINS,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_chains: u32,
    /// Also each sleeper's user-space backtrace (walked with its frame pointers at switch-out):
    /// causes are then kernel + user backtrace, symbolized from the process's binaries.
    #[arg(long, global = true, help_heading = "Probe")]
    pub user_stacks: bool,
    /// User backtraces kept (kernel table size, about 1.6 KiB each: 13 MB at the default).
    #[arg(long, global = true, help_heading = "Table sizes", default_value_t = crate::probe::MAX_USER_STACKS,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_user_stacks: u32,
    /// Do not attribute sleeps to cgroups (measures what that costs).
    #[arg(long, global = true, hide = true)]
    pub debug_no_cgroups: bool,
    /// Do not send exiting tasks' records to user space (measures what that costs; profiles
    /// then tell no exited task's sleeps by thread).
    #[arg(long, global = true, hide = true)]
    pub debug_no_exit_log: bool,
    /// Attach do-nothing programs on latprof's hooks instead of its own (the benchmark's
    /// floor: what the kernel charges for any program there); nothing is measured.
    #[arg(long, global = true, hide = true)]
    pub debug_floor: bool,
    /// Leave parts of the hot programs' work out (stack, account, counters, switch-check, mm,
    /// histograms, runq), comma-separated: the benchmark's breakdown of what each costs.
    #[arg(long, global = true, hide = true, value_name = "PARTS", value_parser = parse_skip)]
    pub debug_skip: Option<Skip>,
    /// Tasks tracked at once (kernel table size): slots indexed by tid, a task whose 8 slots
    /// from tid % N are all taken not tracked but counted (a hash of this size where the
    /// kernel lacks BPF compare-and-swap, before Linux 5.12, and with the bounded stack cache).
    #[arg(long, global = true, help_heading = "Table sizes", default_value_t = crate::probe::MAX_TASKS,
          value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    pub max_tasks: u32,
    /// Global causes kept (kernel table size).
    #[arg(long, global = true, help_heading = "Table sizes", default_value_t = crate::probe::MAX_RECORDS,
          value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    pub max_records: u32,
    /// Sleeps and run-queue waits at least this long are spikes: sent one by one to `top`'s
    /// recent spikes, `record` and `latprof spikes`.
    #[arg(long, global = true, help_heading = "Probe", value_parser = time::parse_duration, default_value = "10ms")]
    pub spike: Duration,
    /// When the kernel wakes the spike reader: adaptive (only when it waits, or the buffer
    /// fills) or always (every event).
    #[arg(long, global = true, help_heading = "Probe", value_enum, default_value_t = Wakeup::Adaptive)]
    pub wakeup: Wakeup,
    /// Count consistency anomalies in the kernel programs and log them (through aya-log, at
    /// most 10 lines per CPU per second) to stderr, or to --log FILE; without it the checks
    /// are removed at load time.
    #[arg(long, global = true, help_heading = "Debug")]
    pub debug_checks: bool,
    /// Walk every counted sleep's kernel stack instead of answering a task's repeated sleeps
    /// from its stack cache (for comparison: the numbers are the same, the cost is not).
    #[arg(long, global = true, help_heading = "Probe")]
    pub no_stack_cache: bool,
    /// Where latprof's log goes (the eBPF side's --debug-checks lines): a new file (an existing
    /// one is refused, /dev/null excepted); default stderr, and for top a new
    /// latprof-RANDOM.log in the temporary directory, readable by root only, named at exit.
    #[arg(long, global = true, help_heading = "Debug")]
    pub log: Option<PathBuf>,
    /// Distinct kernel backtraces kept (kernel table size).
    #[arg(long, global = true, help_heading = "Table sizes", default_value_t = crate::probe::MAX_STACKS,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_stacks: u32,
    /// Take backtraces at switch-out from the raw tracepoints, as on kernels without BTF
    /// tracepoints (for tests and comparison).
    #[arg(long, global = true, hide = true)]
    pub no_btf_wakeup: bool,
    /// Load a sched_switch program the kernel's verifier rejects (tests the error path).
    #[arg(long, global = true, hide = true)]
    pub debug_force_reject: bool,
    /// Learn the stack cache in a bounded loop, as on kernels without bpf_loop.
    #[arg(long, global = true, hide = true)]
    pub debug_bounded_cache: bool,
    /// Call no kfunc, as on kernels before 6.2 (Debian 12's 6.1 among them).
    #[arg(long, global = true, hide = true)]
    pub debug_no_kfuncs: bool,
    /// Keep every task entry in the hash, as on kernels without compare-and-swap (Debian
    /// 11's 5.10): no task slots.
    #[arg(long, global = true, hide = true)]
    pub debug_no_task_slots: bool,
    /// Call a kfunc in a way the kernel refuses, as a kernel without a JIT refuses every
    /// kfunc call (tests the load without kfuncs that follows).
    #[arg(long, global = true, hide = true)]
    pub debug_refuse_kfuncs: bool,
    /// Ignore about one wakeup in N, as a kernel that hides tasks from tracing does (tests the
    /// recovery of such sleeps).
    #[arg(long, global = true, hide = true, default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub debug_hide_wakeups: u32,
    /// With --debug-hide-wakeups: do not log the wakeups hidden as gaps, so that the check of
    /// lost and recovered sleeps against gaps finds them unexplained (tests that check).
    #[arg(long, global = true, hide = true)]
    pub debug_hide_unlogged: bool,
    /// Inject a defect on purpose, one wrong answer of a kind (`cargo xtask mutants --list`
    /// names them): the tests that must catch it are listed in latprof/tests/must_fail. The
    /// environment's LATPROF_TEST_DEFECT sets it in every latprof a test runs.
    #[arg(long, global = true, hide = true, env = "LATPROF_TEST_DEFECT",
          value_parser = parse_defect, value_name = "NAME")]
    pub debug_defect: Option<Defect>,
    /// Take SIZE as the memory available instead of /proc/meminfo's MemAvailable (tests the
    /// refusal of table sizes the machine cannot hold).
    #[arg(long, global = true, hide = true, value_parser = parse_size, value_name = "SIZE")]
    pub debug_mem_available: Option<u64>,
    /// Read a switching-out task's state from the task, as on kernels whose sched_switch
    /// passes no prev_state (before 5.18), even where it does (for tests).
    #[arg(long, global = true, hide = true)]
    pub debug_state_from_task: bool,
    /// Walk user backtraces by frame pointers only, as on kernels without bpf_loop, where
    /// unwind tables would step through frames without them (for tests and the benchmark).
    #[arg(long, global = true, hide = true)]
    pub debug_no_unwind_tables: bool,
    /// Leave out sleeps shorter than DURATION instead of 1us (latencytop's rule): makes the
    /// rare sleeps under the floor common, for the tests of how they are told by process.
    #[arg(long, global = true, hide = true, value_parser = time::parse_duration, value_name = "DURATION")]
    pub debug_min_sleep: Option<Duration>,
    #[command(subcommand)]
    pub command: Command,
}

/// The short help's examples (`latprof -h`); `--help` adds the exit status.
const EXAMPLES: &str =
    "Examples:\n  sudo latprof top\n  sudo latprof stats --duration 10s\n  latprof replay run.lpr";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Collect, then print /proc/latency_stats-compatible text (or /proc/PID/latency with --pid).
    #[command(after_help = "Examples:
  sudo latprof stats --duration 5s                  every process, as /proc/latency_stats
  sudo latprof stats --pid 1234 --duration 10s      one process, as /proc/1234/latency
  sudo latprof stats --format folded > off.folded   for flamegraph.pl or inferno
  sudo latprof --user-stacks stats --format json    with each sleeper's own frames")]
    Stats(StatsArgs),
    /// Live view: global causes, processes, and the selected process's causes.
    #[command(after_help = "Examples:
  sudo latprof top
  sudo latprof top --comm nginx --interval 2s
  sudo latprof --wakers --user-stacks top           who woke each cause, and where in the program")]
    Top(TopArgs),
    /// Record snapshots to a file until Ctrl-C (or --duration); `replay` and `dump` read it.
    #[command(after_help = "Examples:
  sudo latprof record -o run.lpr --duration 10m
  sudo latprof record -o run.lpr --rotate 100M --keep 5   for days: FILE.1 ... FILE.5")]
    Record(RecordArgs),
    /// Browse a recording in the same screens as `top`, with time navigation; no root needed.
    #[command(after_help = "Examples:
  latprof replay run.lpr
  latprof replay run.lpr --at +5m                   open five minutes in")]
    Replay(ReplayArgs),
    /// Print every sleep or run-queue wait over --spike as it happens, one line each.
    #[command(after_help = "Examples:
  sudo latprof --spike 50ms spikes
  sudo latprof --spike 5ms spikes --pid 1234 --duration 1m")]
    Spikes(SpikesArgs),
    /// Print a recording's numbers at a moment, or between two, as text, JSON, folded or
    /// OpenMetrics or pprof; no root needed.
    #[command(after_help = "Examples:
  latprof dump run.lpr                              the end of the recording, as stats prints it
  latprof dump run.lpr --from +1m --to +2m --format json
  latprof dump run.lpr --format pprof > off.pb.gz   for go tool pprof
  latprof dump run.lpr --info                       what was recorded, where, how")]
    Dump(DumpArgs),
    /// Keep the probes attached and answer HTTP: Prometheus metrics at /metrics, off-CPU
    /// profiles (pprof) at /debug/pprof/offcpu.
    #[command(after_help = "Examples:
  sudo latprof serve                                        127.0.0.1:9934
  sudo latprof serve --listen 10.0.0.5:9934 --max-series 500  an internal address
  curl -s localhost:9934/metrics; go tool pprof -raw 'http://localhost:9934/debug/pprof/offcpu?seconds=30'")]
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on (another address than loopback only when asked).
    #[arg(long, value_parser = parse_listen, default_value = "127.0.0.1:9934")]
    pub listen: std::net::SocketAddr,
    /// Only this process (all its threads).
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    /// At most this many (reason, state) series per metric; reasons seen after that are
    /// folded into reason="other" (and counted).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub max_series: u32,
    /// At most this many cgroup series (`latprof_cgroup_*`); cgroups seen after that (the
    /// largest first) are folded into cgroup="other" (and counted).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(2..=10_000))]
    pub max_cgroups: u32,
    /// Time between reads of the kernel's tables (what a scrape sees is at most this old).
    #[arg(long, value_parser = time::parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Extra reasons (latencytop.trans format), overriding built-ins.
    #[arg(long)]
    pub reasons: Option<PathBuf>,
}

/// `127.0.0.1:9934`, `[::1]:9934`, `0.0.0.0:9934`.
pub fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("'{text}' is not an address and port (examples: 127.0.0.1:9934, [::1]:9934)")
    })
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// How long to collect; Ctrl-C or SIGTERM stops early and still prints.
    #[arg(long, value_parser = time::parse_duration, default_value = "5s")]
    pub duration: Duration,
    /// Only this process (all its threads).
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Group by cause (/proc/latency_stats) or by cgroup v2 (each cgroup's totals and its
    /// causes; folded puts the cgroup's name as the root frame).
    #[arg(long, value_enum, default_value_t = By::Cause)]
    pub by: By,
    /// Print latprof's pipeline counters and the kernel's tick accounting per CPU (timer
    /// ticks, tick_stop by result and dependency, switches, context tracking) with rates,
    /// instead of the causes (text format; JSON and OpenMetrics always carry them).
    #[arg(long)]
    pub counters: bool,
    /// Extra reasons (latencytop.trans format), overriding built-ins (JSON and OpenMetrics
    /// name each cause's reason).
    #[arg(long)]
    pub reasons: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SpikesArgs {
    /// Stop after this long (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = time::parse_duration)]
    pub duration: Option<Duration>,
    /// Only this process.
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    /// Extra reasons (latencytop.trans format), overriding built-ins.
    #[arg(long)]
    pub reasons: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The recording to write.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Replace an existing file (and, with --rotate, existing FILE.1 ... FILE.K): what is
    /// there is removed first, a symbolic link itself and not what it points to.
    #[arg(long)]
    pub force: bool,
    /// Stop after this long (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = time::parse_duration)]
    pub duration: Option<Duration>,
    /// Time between snapshots.
    #[arg(long, value_parser = time::parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Start a new file when this one reaches SIZE (e.g. 100M); older files become
    /// FILE.1, FILE.2, ... up to --keep (existing ones are refused unless --force).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub rotate: Option<u64>,
    /// Rotated files kept besides the current one (at most 1000).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub keep: u32,
    /// Stop recording before the file grows past SIZE (an error, and no file left, when not
    /// even the first interval fits).
    #[arg(long, value_parser = parse_size, value_name = "SIZE", conflicts_with = "rotate")]
    pub max_size: Option<u64>,
    /// Store frames without zstd compression.
    #[arg(long)]
    pub no_compress: bool,
    /// Leave out run-queue latency and histograms (cheaper; `top` shows them).
    #[arg(long)]
    pub lean: bool,
    /// At most this many spikes stored per interval, the longest ones (an overloaded machine
    /// has thousands of run-queue waits over 10 ms a second); the others are counted.
    #[arg(long, default_value_t = 200)]
    pub max_spikes: usize,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A recording made by `latprof record`.
    pub file: PathBuf,
    /// Open at this moment (+30s, -10s, 12:03:10, start, end, #N); default: the end.
    #[arg(long, allow_hyphen_values = true)]
    pub at: Option<String>,
    /// Show what happened after this moment (the difference of two snapshots).
    #[arg(long, allow_hyphen_values = true)]
    pub from: Option<String>,
    /// Extra reasons (latencytop.trans format), overriding built-ins.
    #[arg(long)]
    pub reasons: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// A recording made by `latprof record`.
    pub file: PathBuf,
    /// The moment to print (+30s, -10s, 12:03:10, start, end, #N); default: the end.
    #[arg(long, conflicts_with_all = ["from", "to"], allow_hyphen_values = true)]
    pub at: Option<String>,
    /// Print what happened between --from and --to (default: the end).
    #[arg(long, allow_hyphen_values = true)]
    pub from: Option<String>,
    #[arg(long, requires = "from", allow_hyphen_values = true)]
    pub to: Option<String>,
    /// Only this process (its threads alive at that moment).
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Group by cause or by cgroup v2, as `stats --by`.
    #[arg(long, value_enum, default_value_t = By::Cause)]
    pub by: By,
    /// Extra reasons (latencytop.trans format), overriding built-ins.
    #[arg(long)]
    pub reasons: Option<PathBuf>,
    /// Also print the recording's facts and what was damaged, to stderr.
    #[arg(long)]
    pub info: bool,
}

/// A defect by its name (`--debug-defect`).
fn parse_defect(name: &str) -> Result<Defect, String> {
    defect_named(name).ok_or_else(|| {
        let names: Vec<&str> = DEFECTS.iter().map(|d| d.name).collect();
        format!("no defect {name:?}: one of {}", names.join(", "))
    })
}

/// `100M`, `2G`, `512K`, `4096` (bytes).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("'{text}' is not a size (examples: 4096, 512K, 100M, 2G)"))?;
    let scale: u64 = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(format!("'{text}' has an unknown unit (use K, M or G)")),
    };
    let bytes = n
        .checked_mul(scale)
        .ok_or_else(|| format!("'{text}' is too large"))?;
    if bytes < 4096 {
        return Err(format!("'{text}' is too small: at least 4K"));
    }
    Ok(bytes)
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Refresh interval.
    #[arg(long, value_parser = time::parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Start with the processes filtered to this pid.
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    /// Start with the processes filtered to commands containing this name.
    #[arg(long)]
    pub comm: Option<String>,
    /// Extra reasons (latencytop.trans format: PRIORITY FUNCTION REASON), overriding built-ins.
    #[arg(long)]
    pub reasons: Option<PathBuf>,
}

/// The global flags each command that reads a recording uses. Every other global flag sets up
/// the kernel probes (what is counted, table sizes, the cgroup and wakeup filters, the log of
/// their checks), which `dump` and `replay` do not load: they show what the recording holds,
/// with its own settings, and refuse those flags rather than ignore them. A global flag added
/// later is refused there until this table says it applies.
const RECORDING_FLAGS: &[(&str, &[&str])] = &[
    // The frames shown per backtrace; folded waker chains and wait chains (dump --format
    // folded), the levels of wait chains shown; pprof's sample labels (dump --format pprof).
    (
        "dump",
        &[
            "stack_depth",
            "wakers",
            "chains",
            "chain_depth",
            "profile_labels",
        ],
    ),
    ("replay", &["stack_depth", "chain_depth"]),
];

/// The commands that show wait chains (`--chains`); the others refuse its flags rather than
/// drop what they would collect.
const CHAINS_SHOWN_BY: [&str; 6] = ["stats", "top", "record", "dump", "replay", "serve"];

/// Parses the command line ([`parse_from`] of the process's arguments).
pub fn parse() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses `args` and refuses flags that would be ignored: a global flag the command does not
/// use ([`RECORDING_FLAGS`]), `--log` without `--debug-checks` (nothing else is logged). An
/// error is clap's, so it ends as every bad command line does: one line, exit status 2.
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = Cli::command();
    let matches = command.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let refuse = |why: String| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, why);
    if given("log") && !cli.debug_checks {
        return Err(refuse(
            "--log FILE takes the log of --debug-checks, and only that: give --debug-checks too"
                .to_owned(),
        ));
    }
    let name = matches.subcommand_name().unwrap_or("");
    if CHAINS_SHOWN_BY.iter().all(|c| *c != name)
        && ["chains", "chain_depth", "max_chains"]
            .iter()
            .any(|id| given(id))
    {
        return Err(refuse(format!(
            "--chains, --chain-depth and --max-chains are for stats, top, record, dump, replay and serve: {name} does not show wait chains"
        )));
    }
    if let Some((_, uses)) = RECORDING_FLAGS.iter().find(|(cmd, _)| *cmd == name) {
        let ignored: Vec<String> = command
            .get_arguments()
            .filter(|a| a.is_global_set() && given(a.get_id().as_str()))
            .filter(|a| !uses.contains(&a.get_id().as_str()))
            .filter_map(|a| Some(format!("--{}", a.get_long()?)))
            .collect();
        if !ignored.is_empty() {
            let (them, are) = if ignored.len() == 1 {
                ("it", "is")
            } else {
                ("them", "are")
            };
            let takes: Vec<String> = uses
                .iter()
                .filter_map(|id| {
                    let arg = command
                        .get_arguments()
                        .find(|a| a.get_id().as_str() == *id)?;
                    Some(format!("--{}", arg.get_long()?))
                })
                .collect();
            return Err(refuse(format!(
                "{} {are} for the commands that probe the kernel: {name} shows what the recording holds, with its settings, and would ignore {them} (of the global flags it takes {})",
                ignored.join(", "),
                match takes.split_last() {
                    Some((last, rest)) if !rest.is_empty() =>
                        format!("{} and {last}", rest.join(", ")),
                    _ => takes.join(""),
                }
            )));
        }
    }
    Ok(cli)
}

impl Cli {
    /// Frames per backtrace when no recording says otherwise.
    #[must_use]
    pub fn depth(&self) -> u16 {
        self.stack_depth.unwrap_or(crate::probe::STACK_DEPTH)
    }

    /// Whether sleeps are attributed to their wakers (`--wakers`, `--waker-stacks` or
    /// `--chains`).
    #[must_use]
    pub fn wakers_on(&self) -> bool {
        self.wakers || self.waker_stacks || self.chains
    }

    #[must_use]
    pub fn probe_config(&self, pid: Option<u32>, details: bool, spikes: bool) -> ProbeConfig {
        ProbeConfig {
            stack_depth: self.depth(),
            details,
            btf_wakeup: !self.no_btf_wakeup,
            stack_cache: !self.no_stack_cache,
            mode: self.mode,
            pid,
            include_self: self.include_self,
            inter_cutoff: (!self.all_sleeps).then_some(self.inter_cutoff),
            max_tasks: self.max_tasks,
            max_records: self.max_records,
            max_stacks: self.max_stacks,
            spike: spikes.then_some(self.spike),
            wakeup: self.wakeup,
            debug: DebugConfig {
                checks: self.debug_checks,
                force_reject: self.debug_force_reject,
                bounded_cache: self.debug_bounded_cache,
                no_kfuncs: self.debug_no_kfuncs,
                no_task_slots: self.debug_no_task_slots,
                refuse_kfuncs: self.debug_refuse_kfuncs,
                hide_wakeups: self.debug_hide_wakeups,
                hide_unlogged: self.debug_hide_unlogged,
                defect: self.debug_defect,
                state_from_task: self.debug_state_from_task,
                no_unwind_tables: self.debug_no_unwind_tables,
                min_sleep: self.debug_min_sleep,
                floor: self.debug_floor,
                skip: self.debug_skip.unwrap_or_default(),
            },
            cgroups: !self.debug_no_cgroups,
            exits: !self.debug_no_exit_log,
            cgroup_filter: self.cgroup.clone(),
            wakers: self.wakers_on(),
            max_wakers: self.max_wakers,
            waker_stacks: self.waker_stacks,
            chains: self.chains,
            max_chains: self.max_chains,
            user_stacks: self.user_stacks,
            max_user_stacks: self.max_user_stacks,
            // The session adds them, read with the symbols.
            percpu: None,
        }
    }
}

/// `--debug-skip`: parts comma-separated.
fn parse_skip(text: &str) -> Result<Skip, String> {
    let mut skip = Skip::default();
    for part in text.split(',') {
        skip.add(part.trim())?;
    }
    Ok(skip)
}

/// `--profile-labels`: labels comma-separated, or `none`.
fn parse_labels(text: &str) -> Result<crate::export::pprof::Labels, String> {
    let mut labels = crate::export::pprof::Labels::NONE;
    if text == "none" {
        return Ok(labels);
    }
    for part in text.split(',') {
        let slot = match part.trim() {
            "state" => &mut labels.state,
            "reason" => &mut labels.reason,
            "pid" => &mut labels.pid,
            "thread_name" => &mut labels.thread_name,
            "container_id" => &mut labels.container_id,
            other => {
                return Err(format!(
                    "'{}' is no profile label: state, pid, thread_name, container_id, reason, or none",
                    crate::text::printable(other)
                ));
            }
        };
        *slot = true;
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example the help shows parses as it is written (comments after two spaces, a
    /// shell's `sudo` and redirection left out).
    #[test]
    fn the_helps_examples_parse() {
        use clap::CommandFactory as _;
        let mut root = Cli::command();
        let mut helps = vec![root.render_long_help().to_string()];
        for sub in root.get_subcommands_mut() {
            helps.push(sub.render_long_help().to_string());
        }
        let mut seen = 0;
        for help in &helps {
            let examples = help.split("Examples:").nth(1).unwrap_or_default();
            for line in examples.lines().skip(1).take_while(|l| l.starts_with("  ")) {
                let line = line.trim().trim_start_matches("sudo ");
                let Some(args) = line.strip_prefix("latprof ") else {
                    continue;
                };
                let args = args.split("  ").next().unwrap_or_default();
                let args = args.split(['>', ';']).next().unwrap_or_default();
                let words: Vec<&str> = args.split_whitespace().collect();
                parse_from(std::iter::once("latprof").chain(words.iter().copied()))
                    .unwrap_or_else(|e| panic!("example `{line}` does not parse: {e}"));
                seen += 1;
            }
        }
        assert!(seen >= 20, "{seen} examples");
        assert!(helps[0].contains("Exit status:"));
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("latprof").chain(args.iter().copied()))
    }

    #[test]
    fn mode_is_global_on_either_side() {
        let a = parse(&["--mode=normal", "stats"]).unwrap();
        let b = parse(&["stats", "--mode=normal"]).unwrap();
        assert_eq!(a.mode, Mode::Normal);
        assert_eq!(b.mode, Mode::Normal);
        assert_eq!(parse(&["stats"]).unwrap().mode, Mode::Lazy);
    }

    /// `serve` listens on loopback unless asked otherwise (the rule), on 9934.
    #[test]
    fn serve_listens_on_loopback_by_default() {
        let Command::Serve(args) = parse(&["serve"]).unwrap().command else {
            panic!("not serve")
        };
        assert_eq!(
            args.listen,
            "127.0.0.1:9934".parse::<std::net::SocketAddr>().unwrap()
        );
        assert!(args.listen.ip().is_loopback());
        assert_eq!(args.interval, Duration::from_secs(1));
        let Command::Serve(args) = parse(&["serve", "--listen", "[::]:9000"]).unwrap().command
        else {
            panic!("not serve")
        };
        assert!(!args.listen.ip().is_loopback());
        assert!(parse(&["serve", "--listen", "localhost"]).is_err());
    }

    #[test]
    fn stats_flags() {
        let cli = parse(&["stats", "--duration", "2s", "--pid", "42", "--all-sleeps"]).unwrap();
        let Command::Stats(args) = &cli.command else {
            panic!("not stats")
        };
        assert_eq!(args.duration, Duration::from_secs(2));
        assert_eq!(args.pid, Some(42));
        assert_eq!(cli.probe_config(args.pid, false, false).inter_cutoff, None);
        let cli = parse(&["stats", "--inter-cutoff", "10ms"]).unwrap();
        assert_eq!(
            cli.probe_config(None, false, false).inter_cutoff,
            Some(Duration::from_millis(10))
        );
    }

    /// The command line's defaults are the probe's: a plain `stats` configures what
    /// `ProbeConfig::default` holds (the same constants; the cutoff, spelled `5ms` for clap,
    /// checked here).
    #[test]
    fn defaults_are_the_probes() {
        let cli = parse(&["stats"]).unwrap();
        let from_cli = cli.probe_config(None, true, false);
        let default = ProbeConfig::default();
        assert_eq!(from_cli.inter_cutoff, default.inter_cutoff);
        assert_eq!(
            (
                from_cli.max_tasks,
                from_cli.max_records,
                from_cli.max_stacks,
                from_cli.max_wakers,
                from_cli.max_chains,
                from_cli.max_user_stacks,
                from_cli.stack_depth,
            ),
            (
                default.max_tasks,
                default.max_records,
                default.max_stacks,
                default.max_wakers,
                default.max_chains,
                default.max_user_stacks,
                default.stack_depth,
            )
        );
    }

    /// `top --user-stacks` reaches the probe as `stats` does; top's `--pid` stays a view
    /// filter (the probe sees every process).
    #[test]
    fn top_takes_user_stacks() {
        let cli = parse(&["top", "--user-stacks", "--pid", "42"]).unwrap();
        let Command::Top(args) = &cli.command else {
            panic!("not top")
        };
        assert_eq!(args.pid, Some(42));
        assert!(cli.probe_config(None, true, true).user_stacks);
        assert!(
            !parse(&["top"])
                .unwrap()
                .probe_config(None, true, true)
                .user_stacks
        );
    }

    /// `--chains` implies the wakers; `record` keeps chains, `dump` and `replay` show them
    /// (`--chain-depth`; `dump --chains` picks folded chains); the commands that do not show
    /// them refuse its flags in one line rather than drop what they would collect.
    #[test]
    fn chains_are_for_the_commands_that_show_them() {
        let full =
            |args: &[&str]| parse_from(std::iter::once("latprof").chain(args.iter().copied()));
        let cli = full(&["stats", "--chains", "--chain-depth", "2"]).unwrap();
        assert!(cli.wakers_on());
        let config = cli.probe_config(None, false, false);
        assert!(config.wakers && config.chains);
        assert_eq!(cli.chain_depth, 2);
        assert!(full(&["--chains", "top"]).unwrap().chains);
        assert!(full(&["record", "-o", "f", "--chains"]).unwrap().chains);
        assert!(
            full(&["dump", "f", "--chains", "--format", "folded"])
                .unwrap()
                .chains
        );
        assert_eq!(
            full(&["replay", "f", "--chain-depth", "3"])
                .unwrap()
                .chain_depth,
            3
        );
        assert!(
            full(&["serve", "--chains", "--chain-depth", "3"])
                .unwrap()
                .chains
        );
        for (args, says) in [
            (&["spikes", "--chains"][..], "are for stats, top, record"),
            (
                &["dump", "f", "--max-chains", "10"],
                "is for the commands that probe",
            ),
            (
                &["replay", "f", "--chains"],
                "is for the commands that probe",
            ),
        ] {
            let err = full(args).expect_err("refused").to_string();
            assert!(err.contains(says), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
        assert!(full(&["stats", "--chain-depth", "0"]).is_err());
    }

    /// `dump` and `replay` took the probe's flags and ignored them (`--cgroup` among them: the
    /// output was unfiltered); each is refused, on either side of the command, in one error.
    #[test]
    fn recording_commands_refuse_the_probes_flags() {
        let refused = |args: &[&str]| -> String {
            let args = std::iter::once("latprof").chain(args.iter().copied());
            parse_from(args).expect_err("refused").to_string()
        };
        for args in [
            &["dump", "f", "--mode", "normal"][..],
            &["--mode", "lazy", "dump", "f"],
            &["dump", "f", "--cgroup", "/sys/fs/cgroup/x"],
            &["dump", "f", "--user-stacks"],
            &["dump", "f", "--waker-stacks"],
            &["dump", "f", "--max-tasks", "5"],
            &["dump", "f", "--all-sleeps"],
            &["dump", "f", "--spike", "1ms"],
            &["replay", "f", "--wakers"],
            &["replay", "f", "--max-stacks", "10"],
            &["replay", "f", "--inter-cutoff", "1ms"],
        ] {
            let flag = args.iter().find(|a| a.starts_with("--")).unwrap();
            let err = refused(args);
            assert!(
                err.contains(&format!("{flag} is for the commands that probe")),
                "{args:?}: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
        let err = refused(&["dump", "f", "--mode", "normal", "--include-self"]);
        assert!(err.contains("--mode, --include-self are for"), "{err}");
        assert!(
            err.contains("--stack-depth, --wakers, --chains, --chain-depth and --profile-labels"),
            "{err}"
        );
        let ok = |args: &[&str]| {
            parse_from(std::iter::once("latprof").chain(args.iter().copied())).unwrap()
        };
        assert_eq!(
            ok(&["dump", "f", "--stack-depth", "3"]).stack_depth,
            Some(3)
        );
        assert!(ok(&["--wakers", "dump", "f", "--format", "folded"]).wakers);
        assert!(
            !ok(&["dump", "f", "--profile-labels", "pid"])
                .profile_labels
                .state
        );
        ok(&["replay", "f", "--stack-depth", "3"]);
        // The live commands take them all.
        ok(&[
            "stats",
            "--mode",
            "normal",
            "--cgroup",
            "/x",
            "--user-stacks",
        ]);
    }

    /// `--log FILE` holds the eBPF checks' lines: without `--debug-checks` nothing was written
    /// and nothing said.
    #[test]
    fn log_without_debug_checks_is_refused() {
        let err = parse_from(["latprof", "stats", "--log", "/tmp/x.log"])
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("--log FILE takes the log of --debug-checks"),
            "{err}"
        );
        parse_from(["latprof", "--debug-checks", "stats", "--log", "/dev/null"]).unwrap();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1mb"), Ok(1 << 20));
        assert!(parse_size("10").is_err());
        assert!(parse_size("big").is_err());
        assert!(parse_size("5T").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(parse(&["stats", "--mode=eager"]).is_err());
        assert!(parse(&["stats", "--stack-depth", "128"]).is_err());
        assert!(parse(&["stats", "--stack-depth", "0"]).is_err());
        assert!(parse(&["stats", "--duration", "soon"]).is_err());
        assert!(parse(&["stats", "--max-tasks", "0"]).is_err());
        assert!(parse(&["frobnicate"]).is_err());
        assert!(parse(&["stats", "--format", "xml"]).is_err());
        assert!(parse(&["record"]).is_err());
        assert!(parse(&["record", "-o", "x", "--rotate", "10"]).is_err());
        assert!(parse(&["record", "-o", "x", "--rotate", "1M", "--max-size", "2M"]).is_err());
        // Each rotation renames every kept slot: an unbounded --keep hung the first one.
        assert!(
            parse(&[
                "record",
                "-o",
                "x",
                "--rotate",
                "4K",
                "--keep",
                "4294967295"
            ])
            .is_err()
        );
        assert!(parse(&["record", "-o", "x", "--rotate", "4K", "--keep", "1000"]).is_ok());
        assert!(parse(&["dump", "f", "--at", "end", "--from", "start"]).is_err());
        assert!(parse(&["dump", "f", "--to", "end"]).is_err());
        // Times before the end start with '-'.
        let cli = parse(&["dump", "f", "--from", "-10s"]).unwrap();
        let Command::Dump(args) = &cli.command else {
            panic!("not dump")
        };
        assert_eq!(args.from.as_deref(), Some("-10s"));
        assert!(parse(&[]).is_err());
    }
}

//! The overhead benchmark: each workload under no tracer, latprof (lazy, normal) and the peers
//! that are installed, interleaved round by round, with the kernel's own BPF run-time
//! statistics for every tracer's programs. Prints ratios against the no-tracer runs of the same
//! invocation; never asserts timings.
use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::probe;

#[derive(Debug, clap::Args)]
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
    /// Only these configurations (none, lazy, normal, offcputime, runqlat, bpftrace, perf-sched,
    /// lazy-debug, lazy-walk, lazy+normal, spikes-adaptive, spikes-always).
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
}

/// A tracer configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Config {
    None,
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
}

/// The configurations of the main workloads.
const MAIN_CONFIGS: [Config; 7] = [
    Config::None,
    Config::Lazy,
    Config::Normal,
    Config::Offcputime,
    Config::Runqlat,
    Config::Bpftrace,
    Config::PerfSched,
];

/// Configurations of their own series: the debug checks and the stack cache on the ping-pong,
/// lazy and normal together on the fork storm, and the spikes.
const EXTRA_CONFIGS: [Config; 7] = [
    Config::LazyDebug,
    Config::LazyWalk,
    Config::Paired,
    Config::PairedLazy,
    Config::PairedNormal,
    Config::SpikesAdaptive,
    Config::SpikesAlways,
];

/// bpftrace's off-CPU time keyed by kernel stack, on tracepoints (no kprobes here).
const BPFTRACE_OFFCPU: &str = "tracepoint:sched:sched_switch { \
    @start[args->prev_pid] = nsecs; @stk[args->prev_pid] = kstack; \
    $s = @start[args->next_pid]; \
    if ($s) { @off[@stk[args->next_pid]] = sum(nsecs - $s); \
    delete(@start[args->next_pid]); delete(@stk[args->next_pid]); } }";

impl Config {
    fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lazy => "lazy",
            Self::Normal => "normal",
            Self::Offcputime => "offcputime",
            Self::Runqlat => "runqlat",
            Self::Bpftrace => "bpftrace",
            Self::PerfSched => "perf-sched",
            Self::LazyDebug => "lazy-debug",
            Self::LazyWalk => "lazy-walk",
            Self::Paired => "lazy+normal",
            Self::PairedLazy => "lazy (paired)",
            Self::PairedNormal => "normal (paired)",
            Self::SpikesAdaptive => "spikes-adaptive",
            Self::SpikesAlways => "spikes-always",
        }
    }

    fn command(self, latprof: &Path) -> Option<Command> {
        let mut cmd = match self {
            Self::None | Self::Paired => return None,
            Self::Lazy | Self::Normal | Self::PairedLazy | Self::PairedNormal => {
                let mut c = Command::new(latprof);
                let mode = if matches!(self, Self::Lazy | Self::PairedLazy) {
                    "lazy"
                } else {
                    "normal"
                };
                c.args(["--mode", mode, "stats", "--duration", "1h"]);
                c
            }
            Self::LazyWalk => {
                let mut c = Command::new(latprof);
                c.args(["--no-stack-cache", "stats", "--duration", "1h"]);
                c
            }
            Self::LazyDebug => {
                let mut c = Command::new(latprof);
                c.args([
                    "--debug-checks",
                    "--log",
                    "/dev/null",
                    "stats",
                    "--duration",
                    "1h",
                ]);
                c
            }
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
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Some(cmd)
    }

    /// latprof itself (it says on stderr when it is attached).
    fn is_latprof(self) -> bool {
        matches!(
            self,
            Self::Lazy
                | Self::Normal
                | Self::LazyDebug
                | Self::LazyWalk
                | Self::PairedLazy
                | Self::PairedNormal
                | Self::SpikesAdaptive
                | Self::SpikesAlways
        )
    }

    fn available(self) -> bool {
        match self {
            Self::None
            | Self::Lazy
            | Self::Normal
            | Self::LazyDebug
            | Self::LazyWalk
            | Self::Paired
            | Self::PairedLazy
            | Self::PairedNormal
            | Self::SpikesAdaptive
            | Self::SpikesAlways => true,
            Self::Offcputime => Path::new("/usr/sbin/offcputime").exists(),
            Self::Runqlat => Path::new("/usr/sbin/runqlat").exists(),
            Self::Bpftrace => which("bpftrace"),
            Self::PerfSched => which("perf"),
        }
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// A workload: a command and what one run of it is made of.
struct Workload {
    name: String,
    command: Vec<String>,
    /// Units per run (round trips, forks) for per-unit numbers; 0 for none.
    units: u64,
    unit: &'static str,
    /// Configurations this workload runs under (the contention series uses latprof only).
    configs: Vec<Config>,
}

/// One measurement.
#[derive(Clone, Debug, Default)]
struct Sample {
    wall_ns: u64,
    switches: u64,
    bpf_ns: u64,
    bpf_runs: u64,
    tracer_cpu_ns: u64,
    tracer_rss_kb: u64,
    map_kb: u64,
    /// Per program of the tracer: name -> (run time ns, runs).
    per_program: BTreeMap<String, (u64, u64)>,
}

/// A running tracer.
struct Tracer {
    child: Child,
    programs: HashSet<u32>,
}

/// Every loaded program: id -> (name, run time ns, runs).
fn loaded() -> BTreeMap<u32, (String, u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| {
            let ns = u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
            let name = p.name_as_str().unwrap_or("?").to_owned();
            (p.id(), (name, ns, p.run_count()))
        })
        .collect()
}

fn context_switches() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("ctxt "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Kernel memory of a process's BPF maps (fdinfo memlock), in KiB.
fn map_memory_kb(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let mut bytes = 0;
    for fd in fds.flatten() {
        let is_map =
            std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy().contains("bpf-map"));
        if !is_map {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        bytes += info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    bytes / 1024
}

fn start(config: Config, latprof: &Path) -> Result<Option<Tracer>> {
    let Some(mut cmd) = config.command(latprof) else {
        return Ok(None);
    };
    let before: HashSet<u32> = loaded().into_keys().collect();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", config.name()))?;
    match config {
        _ if config.is_latprof() => {
            // latprof says when it is attached.
            let mut line = String::new();
            let stderr = child.stderr.take().context("latprof stderr")?;
            BufReader::new(stderr).read_line(&mut line)?;
            if !line.contains("attached") {
                bail!("latprof did not attach: {line}");
            }
        }
        Config::PerfSched => std::thread::sleep(Duration::from_secs(1)),
        _ => {
            // A BPF peer is ready once its programs are loaded and stop changing.
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut last = 0;
            let mut stable = 0;
            while stable < 5 {
                if Instant::now() > deadline {
                    bail!("{} loaded no BPF program in 30 s", config.name());
                }
                if let Ok(Some(status)) = child.try_wait() {
                    bail!("{} exited early: {status}", config.name());
                }
                std::thread::sleep(Duration::from_millis(100));
                let now = loaded().keys().filter(|id| !before.contains(id)).count();
                if now > 0 && now == last {
                    stable += 1;
                } else {
                    stable = 0;
                }
                last = now;
            }
        }
    }
    let programs = loaded()
        .into_keys()
        .filter(|id| !before.contains(id))
        .collect();
    Ok(Some(Tracer { child, programs }))
}

/// Stops a tracer with SIGINT and returns its CPU time (ns) and peak RSS (KiB).
fn stop(tracer: Tracer) -> Result<(u64, u64)> {
    let pid = i32::try_from(tracer.child.id())?;
    // SAFETY: signalling and reaping our own child; rusage is a plain out struct.
    unsafe {
        libc::kill(pid, libc::SIGINT);
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::wait4(pid, &raw mut status, 0, &raw mut usage) < 0 {
            return Err(std::io::Error::last_os_error()).context("waiting for a tracer");
        }
        let tv = |t: libc::timeval| {
            u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.tv_usec).unwrap_or(0) * 1000
        };
        Ok((
            tv(usage.ru_utime) + tv(usage.ru_stime),
            u64::try_from(usage.ru_maxrss).unwrap_or(0),
        ))
    }
}

/// Runs the workload once under the tracers of `configs` (started in that order; none for
/// `[Config::None]`) and returns one sample per tracer (one for no tracer).
fn measure(configs: &[Config], work: &Workload, latprof: &Path) -> Result<Vec<Sample>> {
    let mut tracers = Vec::new();
    for &config in configs {
        if let Some(t) = start(config, latprof)? {
            tracers.push(t);
        }
    }
    let name = configs
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join("+");
    let ours = |t: &Tracer, m: &BTreeMap<u32, (String, u64, u64)>| {
        let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for (_, (name, ns, n)) in m.iter().filter(|(id, _)| t.programs.contains(id)) {
            let e = out.entry(name.clone()).or_default();
            e.0 += ns;
            e.1 += n;
        }
        out
    };
    let sum = |m: &BTreeMap<String, (u64, u64)>| {
        m.values().fold((0, 0), |(a, b), (ns, n)| (a + ns, b + n))
    };
    let loaded0 = loaded();
    let before: Vec<_> = tracers.iter().map(|t| ours(t, &loaded0)).collect();
    let ctxt0 = context_switches();
    let t0 = Instant::now();
    let status = Command::new(&work.command[0])
        .args(&work.command[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {}", work.name))?;
    let wall = t0.elapsed();
    let ctxt1 = context_switches();
    let loaded1 = loaded();
    if !status.success() {
        bail!("{} failed under {name}: {status}", work.name);
    }
    let base = Sample {
        wall_ns: u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX),
        switches: ctxt1.saturating_sub(ctxt0),
        ..Sample::default()
    };
    if tracers.is_empty() {
        return Ok(vec![base]);
    }
    let mut out = Vec::new();
    for (tracer, before) in tracers.into_iter().zip(before) {
        let after = ours(&tracer, &loaded1);
        let ((ns0, runs0), (ns1, runs1)) = (sum(&before), sum(&after));
        let per_program = after
            .iter()
            .map(|(name, (ns, n))| {
                let (ns0, n0) = before.get(name).copied().unwrap_or((0, 0));
                (name.clone(), (ns.saturating_sub(ns0), n.saturating_sub(n0)))
            })
            .collect();
        let map_kb = map_memory_kb(tracer.child.id());
        let (cpu, rss) = stop(tracer)?;
        out.push(Sample {
            bpf_ns: ns1.saturating_sub(ns0),
            bpf_runs: runs1.saturating_sub(runs0),
            tracer_cpu_ns: cpu,
            tracer_rss_kb: rss,
            map_kb,
            per_program,
            ..base.clone()
        });
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    }
}

/// Summary of one (workload, configuration) over the rounds.
#[derive(Debug, Default)]
struct Summary {
    wall_ms: f64,
    wall_min_ms: f64,
    wall_max_ms: f64,
    ratio: f64,
    added_ns_per_switch: f64,
    bpf_ns_per_event: f64,
    bpf_ns_per_unit: f64,
    /// BPF ns per unit in the programs whose work depends on the mode (every one but
    /// sched_switch, which runs the same code in lazy and normal mode).
    mode_ns_per_unit: f64,
    bpf_cpu_percent: f64,
    /// Context switches per second on the machine during the run (throughput of the sleepers).
    switches_per_s: f64,
    tracer_cpu_ms: f64,
    tracer_rss_mb: f64,
    map_kb: u64,
}

fn workloads(quick: bool, latprof: &str) -> Vec<Workload> {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let (trips, forks, idle) = if quick {
        (3_000, 200, "1")
    } else {
        (100_000, 2_000, "5")
    };
    let all: Vec<Config> = MAIN_CONFIGS.to_vec();
    let mut out = vec![
        Workload {
            name: "pingpong".into(),
            command: s(&[
                latprof,
                "workload",
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
                .chain([Config::LazyDebug, Config::LazyWalk])
                .collect(),
        },
        Workload {
            name: "forkstorm".into(),
            command: s(&[latprof, "workload", "forks", "--count", &forks.to_string()]),
            units: forks,
            unit: "fork",
            configs: all
                .iter()
                .copied()
                .chain([Config::Paired, Config::PairedLazy, Config::PairedNormal])
                .collect(),
        },
        Workload {
            name: "idle".into(),
            command: s(&["sleep", idle]),
            units: 0,
            unit: "",
            configs: all.clone(),
        },
    ];
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
                configs: all.clone(),
            });
        }
    }
    // 1, 2, 4 ... up to 4 x cores processes sleeping 100 us in a loop, at one backtrace.
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let counts: Vec<usize> = std::iter::successors(Some(1), |n| Some(n * 2))
        .take_while(|n| *n <= cores * 4)
        .collect();
    let sleepers = |name: String, n: usize, time: &str, configs: Vec<Config>| Workload {
        name,
        command: s(&[
            latprof,
            "workload",
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

pub fn run(args: &BenchArgs) -> Result<()> {
    probe::check_privileges()?;
    let latprof = std::env::current_exe().context("latprof's own path")?;
    let latprof_s = latprof.to_string_lossy().into_owned();
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
            args.configs.is_empty() || args.configs.iter().any(|n| n == name)
        })
        .filter(|c| {
            !args.quick
                || matches!(
                    c,
                    Config::None
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
    let works = workloads(args.quick, &latprof_s);
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
    let report = report(&works, &configs, &samples, rounds, &skipped);
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

fn summarize(samples: &[Sample], none: &[Sample], units: u64) -> Summary {
    let ms = |s: &Sample| s.wall_ns as f64 / 1e6;
    let walls: Vec<f64> = samples.iter().map(ms).collect();
    let base = median(none.iter().map(ms).collect());
    let base_switches = median(none.iter().map(|s| s.switches as f64).collect());
    let wall = median(walls.clone());
    Summary {
        wall_ms: wall,
        wall_min_ms: walls.iter().copied().fold(f64::INFINITY, f64::min),
        wall_max_ms: walls.iter().copied().fold(0.0, f64::max),
        ratio: if base > 0.0 { wall / base } else { 0.0 },
        added_ns_per_switch: if base_switches > 0.0 {
            (wall - base) * 1e6 / base_switches
        } else {
            0.0
        },
        bpf_ns_per_event: median(
            samples
                .iter()
                .filter(|s| s.bpf_runs > 0)
                .map(|s| s.bpf_ns as f64 / s.bpf_runs as f64)
                .collect(),
        ),
        bpf_ns_per_unit: if units > 0 {
            median(
                samples
                    .iter()
                    .map(|s| s.bpf_ns as f64 / units as f64)
                    .collect(),
            )
        } else {
            0.0
        },
        mode_ns_per_unit: if units > 0 {
            median(
                samples
                    .iter()
                    .map(|s| {
                        s.per_program
                            .iter()
                            .filter(|(name, _)| !name.starts_with("sched_switch"))
                            .map(|(_, (ns, _))| *ns as f64)
                            .sum::<f64>()
                            / units as f64
                    })
                    .collect(),
            )
        } else {
            0.0
        },
        bpf_cpu_percent: median(
            samples
                .iter()
                .map(|s| s.bpf_ns as f64 * 100.0 / s.wall_ns.max(1) as f64)
                .collect(),
        ),
        switches_per_s: median(
            samples
                .iter()
                .map(|s| s.switches as f64 * 1e9 / s.wall_ns.max(1) as f64)
                .collect(),
        ),
        tracer_cpu_ms: median(
            samples
                .iter()
                .map(|s| s.tracer_cpu_ns as f64 / 1e6)
                .collect(),
        ),
        tracer_rss_mb: samples.iter().map(|s| s.tracer_rss_kb).max().unwrap_or(0) as f64 / 1024.0,
        map_kb: samples.iter().map(|s| s.map_kb).max().unwrap_or(0),
    }
}

/// The markdown table (with the targets' verdicts) and the JSON document.
fn report(
    works: &[Workload],
    configs: &[Config],
    samples: &BTreeMap<(usize, Config), Vec<Sample>>,
    rounds: u32,
    skipped: &[&str],
) -> (String, String) {
    let mut md = String::new();
    let mut json = String::from("{\n  \"rounds\": ");
    let _ = write!(
        json,
        "{rounds},\n  \"machine\": {:?},\n  \"results\": [\n",
        machine()
    );
    let _ = writeln!(md, "# latprof overhead benchmark\n");
    let _ = writeln!(
        md,
        "Machine: {}. Rounds: {rounds}, interleaved; medians, min-max.",
        machine()
    );
    if !skipped.is_empty() {
        let _ = writeln!(md, "Not installed, skipped: {}.", skipped.join(", "));
    }
    let mut summaries: BTreeMap<(usize, Config), Summary> = BTreeMap::new();
    let mut first = true;
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
            if !first {
                json.push_str(",\n");
            }
            first = false;
            let _ = write!(
                json,
                "    {{\"workload\": {:?}, \"config\": {:?}, \"wall_ms\": {:.3}, \"wall_min_ms\": {:.3}, \"wall_max_ms\": {:.3}, \"ratio\": {:.4}, \"added_ns_per_switch\": {:.1}, \"bpf_ns_per_event\": {:.1}, \"bpf_ns_per_{}\": {:.1}, \"bpf_cpu_percent\": {:.4}, \"tracer_cpu_ms\": {:.1}, \"tracer_rss_mb\": {:.2}, \"map_kib\": {}}}",
                work.name,
                config.name(),
                sum.wall_ms,
                sum.wall_min_ms,
                sum.wall_max_ms,
                sum.ratio,
                sum.added_ns_per_switch,
                sum.bpf_ns_per_event,
                if work.units > 0 {
                    work.unit.replace(' ', "_")
                } else {
                    "run".into()
                },
                sum.bpf_ns_per_unit,
                sum.bpf_cpu_percent,
                sum.tracer_cpu_ms,
                sum.tracer_rss_mb,
                sum.map_kb
            );
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
    }
    json.push_str("\n  ],\n  \"targets\": [\n");
    let _ = writeln!(md, "\n## Targets\n");
    let targets = targets(works, &summaries);
    for (i, (name, verdict, detail)) in targets.iter().enumerate() {
        let _ = writeln!(md, "- {verdict}: {name} ({detail})");
        let _ = write!(
            json,
            "{}    {{\"target\": {name:?}, \"verdict\": {verdict:?}, \"detail\": {detail:?}}}",
            if i > 0 { ",\n" } else { "" }
        );
    }
    json.push_str("\n  ]\n}\n");
    (md, json)
}

fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    format!("Linux {}, {cpus} CPUs", kernel.trim())
}

/// The targets, each with a verdict from this run's numbers.
fn targets(
    works: &[Workload],
    s: &BTreeMap<(usize, Config), Summary>,
) -> Vec<(String, &'static str, String)> {
    let find = |name: &str| works.iter().position(|w| w.name == name);
    let get = |name: &str, c: Config| find(name).and_then(|w| s.get(&(w, c)));
    let verdict = |ok: bool| if ok { "MET" } else { "MISSED" };
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
            "lazy near runqlat per round trip (for reference)".to_owned(),
            verdict(lazy.bpf_ns_per_unit <= rq.bpf_ns_per_unit * 1.5),
            format!(
                "{:.0} ns against {:.0} ns",
                lazy.bpf_ns_per_unit, rq.bpf_ns_per_unit
            ),
        ));
    }
    for hb in ["hackbench-process", "hackbench-thread"] {
        if let Some(lazy) = get(hb, Config::Lazy) {
            out.push((
                format!("lazy adds at most 3% to {hb}"),
                verdict(lazy.ratio <= 1.03),
                format!("ratio {:.3}", lazy.ratio),
            ));
        }
    }
    if let Some(lazy) = get("idle", Config::Lazy) {
        out.push((
            "lazy idle cost under 0.1% of one CPU".to_owned(),
            verdict(lazy.bpf_cpu_percent < 0.1),
            format!("{:.3}% in BPF", lazy.bpf_cpu_percent),
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
    out
}

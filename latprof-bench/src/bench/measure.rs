//! Running a workload under a tracer and measuring it: wall time, context switches, the
//! kernel's BPF run-time statistics per program, the tracer's CPU time, memory and maps.
use std::{
    collections::{BTreeMap, HashSet},
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::configs::{Config, Workload};

/// One measurement.
#[derive(Clone, Debug, Default)]
pub(super) struct Sample {
    pub(super) wall_ns: u64,
    pub(super) switches: u64,
    pub(super) bpf_ns: u64,
    pub(super) bpf_runs: u64,
    pub(super) tracer_cpu_ns: u64,
    pub(super) tracer_rss_kb: u64,
    pub(super) map_kb: u64,
    /// Per program of the tracer: name -> (run time ns, runs).
    pub(super) per_program: BTreeMap<String, (u64, u64)>,
}

/// A running tracer.
pub(super) struct Tracer {
    pub(super) child: Child,
    pub(super) programs: HashSet<u32>,
}

/// Every loaded program: id -> (name, run time ns, runs).
pub(super) fn loaded() -> BTreeMap<u32, (String, u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| {
            let ns = u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
            let name = p.name_as_str().unwrap_or("?").to_owned();
            (p.id(), (name, ns, p.run_count()))
        })
        .collect()
}

pub(super) fn context_switches() -> u64 {
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
pub(super) fn map_memory_kb(pid: u32) -> u64 {
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

pub(super) fn start(config: Config, latprof: &Path) -> Result<Option<Tracer>> {
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
            let mut stderr = BufReader::new(stderr);
            stderr.read_line(&mut line)?;
            if !line.contains("attached") {
                bail!("latprof did not attach: {line}");
            }
            // The rest of its stderr is read to the end: a closed pipe would fail its next
            // line (the programs it loaded, its summary) and end it early.
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
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
#[expect(
    clippy::needless_pass_by_value,
    reason = "the tracer ends here: no caller may use it again"
)]
pub(super) fn stop(tracer: Tracer) -> Result<(u64, u64)> {
    let (_, usage) = signal_and_reap(tracer.child.id(), libc::SIGINT)?;
    Ok((
        timeval_ns(usage.ru_utime) + timeval_ns(usage.ru_stime),
        u64::try_from(usage.ru_maxrss).unwrap_or(0),
    ))
}

/// Sends `signal` to child `pid` and reaps it: its wait status and the kernel's account of
/// its resource usage.
pub(super) fn signal_and_reap(pid: u32, signal: libc::c_int) -> Result<(i32, libc::rusage)> {
    let pid = i32::try_from(pid)?;
    let mut status = 0;
    // SAFETY: signalling and reaping our own child; rusage is a plain out struct.
    unsafe {
        libc::kill(pid, signal);
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::wait4(pid, &raw mut status, 0, &raw mut usage) < 0 {
            return Err(std::io::Error::last_os_error()).context("waiting for a tracer");
        }
        Ok((status, usage))
    }
}

/// A `timeval` in ns.
pub(super) fn timeval_ns(t: libc::timeval) -> u64 {
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
        + u64::try_from(t.tv_usec).unwrap_or(0) * 1000
}

/// Runs the workload once under the tracers of `configs` (started in that order; none for
/// `[Config::None]`) and returns one sample per tracer (one for no tracer).
pub(super) fn measure(configs: &[Config], work: &Workload, latprof: &Path) -> Result<Vec<Sample>> {
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

pub(super) fn median(mut v: Vec<f64>) -> f64 {
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

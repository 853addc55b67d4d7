//! The `serve` series: what `latprof serve` costs and how fast it answers. The real binary
//! serves while workloads run and a scraper pulls /metrics (every second under the ping-pong
//! and hackbench; every 15 s under 10,000 sleeps a second, Prometheus' usual interval); its
//! process CPU time (user and system, the kernel programs' time is not in it) is read from
//! /proc. Scrapes of 500 series are timed against the same HTTP server fed with 500 distinct
//! causes (a machine rarely has that many), idle and while hackbench keeps every CPU busy; the
//! report says whether each number is within the budgets.
use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use latprof::{
    collect::Snapshot,
    export::openmetrics::{self, Flavor},
    probe::{KernelFacts, Mode, ProbeConfig},
    reasons::Reasons,
    serve::{self, Server, state::Accumulator},
    symbols::Kallsyms,
};
use latprof_common::{GlobalRecord, HIST_BUCKETS};

use super::configs::which;
use super::measure::median;

/// One GET; returns (status, body length, time to the last byte).
fn get(addr: SocketAddr, path: &str) -> Result<(u16, usize, Duration)> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).context("connect")?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let took = t0.elapsed();
    let status = String::from_utf8_lossy(&raw[..raw.len().min(12)])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, raw.len(), took))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// (median, max) in ms.
fn spread(times: &[Duration]) -> (f64, f64) {
    let v: Vec<f64> = times.iter().map(|d| ms(*d)).collect();
    let max = v.iter().copied().fold(0.0, f64::max);
    (median(v), max)
}

/// User and system CPU of this process (`RUSAGE_SELF`) or thread (`RUSAGE_THREAD`), in ns.
fn rusage_ns(who: libc::c_int) -> u64 {
    // SAFETY: rusage is a plain out struct.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &raw mut usage);
        usage
    };
    super::measure::timeval_ns(usage.ru_utime) + super::measure::timeval_ns(usage.ru_stime)
}

/// A process's CPU time (user + system) from /proc, in ns.
fn cpu_ns(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    Ok(ticks * 1_000_000_000 / hz)
}

/// `latprof serve` on a free loopback port, attached.
struct Served {
    child: Child,
    addr: SocketAddr,
}

impl Served {
    fn start(latprof: &Path) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let mut child = Command::new(latprof)
            .args(["serve", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting latprof serve")?;
        let mut stderr = std::io::BufReader::new(child.stderr.take().context("stderr")?);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stderr, &mut line)?;
        if !line.contains("serving") {
            bail!("latprof serve did not start: {line}");
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Ok(Self { child, addr })
    }

    fn counted(&self) -> Result<u64> {
        let mut s = TcpStream::connect(self.addr)?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("latprof_pipeline_events_total{counter=\"counted\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    }

    fn stop(mut self) -> Result<()> {
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.child.wait()?;
        if !status.success() {
            bail!("latprof serve exited {status}");
        }
        Ok(())
    }
}

/// What one live run measured.
struct Live {
    what: String,
    secs: f64,
    cpu_pct: f64,
    sleeps_per_s: f64,
    scrapes: usize,
    scrape_ms: (f64, f64),
}

/// Serves while `command` runs, again and again until `time` has passed, scraping every
/// `every`.
fn live(
    latprof: &Path,
    what: &str,
    command: &[String],
    time: Duration,
    every: Duration,
) -> Result<Live> {
    let served = Served::start(latprof)?;
    let addr = served.addr;
    let pid = served.child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || -> Result<Vec<Duration>> {
            let mut times = Vec::new();
            let mut next = Instant::now() + every;
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                next += every;
                let (status, _, took) = get(addr, "/metrics")?;
                if status != 200 {
                    bail!("scrape answered {status}");
                }
                times.push(took);
            }
            Ok(times)
        })
    };
    let (cpu0, counted0, t0) = (cpu_ns(pid)?, served.counted()?, Instant::now());
    loop {
        run_quietly(command).with_context(|| format!("{what} failed"))?;
        if t0.elapsed() >= time {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let (cpu1, counted1) = (cpu_ns(pid)?, served.counted()?);
    stop.store(true, Ordering::Relaxed);
    let times = scraper
        .join()
        .map_err(|_| anyhow::anyhow!("scraper panicked"))??;
    served.stop()?;
    Ok(Live {
        what: what.to_owned(),
        secs,
        cpu_pct: (cpu1 - cpu0) as f64 / 1e9 / secs * 100.0,
        sleeps_per_s: counted1.saturating_sub(counted0) as f64 / secs,
        scrapes: times.len(),
        scrape_ms: spread(&times),
    })
}

/// Runs `command` (program and arguments) once, its output discarded; fails unless it
/// succeeds.
pub(super) fn run_quietly(command: &[String]) -> Result<()> {
    let status = Command::new(&command[0])
        .args(&command[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running {}", command[0]))?;
    if !status.success() {
        bail!("{} failed: {status}", command[0]);
    }
    Ok(())
}

/// Times `n` GETs of `path` while `command` runs again and again (hackbench: every CPU busy),
/// one every 100 ms.
fn timed_under_load(
    addr: SocketAddr,
    path: &str,
    n: usize,
    command: &[String],
) -> Result<Vec<Duration>> {
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, command) = (Arc::clone(&stop), command.to_vec());
        std::thread::spawn(move || -> Result<u32> {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                run_quietly(&command)?;
                rounds += 1;
            }
            Ok(rounds)
        })
    };
    // The load gets going first.
    std::thread::sleep(Duration::from_millis(500));
    let mut times = Vec::with_capacity(n);
    let result = (|| -> Result<()> {
        for _ in 0..n {
            let (status, _, took) = get(addr, path)?;
            if status != 200 {
                bail!("{path} answered {status}");
            }
            times.push(took);
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let rounds = load
        .join()
        .map_err(|_| anyhow::anyhow!("load thread panicked"))??;
    result?;
    if rounds == 0 {
        bail!("the load never ran");
    }
    Ok(times)
}

/// The budgets: a scrape of 500 series under 50 ms, and under 0.5% of one CPU at 15 s
/// scrapes with 10,000 sleeps a second.
const SCRAPE_BUDGET_MS: f64 = 50.0;
const CPU_BUDGET_PCT: f64 = 0.5;

fn verdict(within: bool) -> &'static str {
    if within { "within" } else { "**OVER BUDGET**" }
}

/// `latprof serve`'s own server and renderers fed with `n` distinct causes, each with a
/// histogram, and a full profile window.
fn synthetic(n: u64) -> Result<(Server, SocketAddr, openmetrics::Live)> {
    let mut kallsyms = String::from("ffffffff81000000 T _stext\n");
    for i in 0..n {
        let _ = writeln!(
            kallsyms,
            "{:x} T synthetic_wait_{i}",
            0xffff_ffff_8110_0000u64 + i * 0x100
        );
    }
    kallsyms.push_str(
        "ffffffff81300000 T do_syscall_64\n\
         ffffffff81400000 T __sched_text_start\nffffffff81401000 T __sched_text_end\n\
         ffffffff81401000 T __lock_text_start\nffffffff81402000 T __lock_text_end\n",
    );
    let syms = Kallsyms::parse(&kallsyms)?;
    let mut acc = Accumulator::new(Reasons::builtin(), 12, 1000, "lazy");
    let mut published = None;
    for t in 1..=u64::try_from(serve::state::window_reads(Duration::from_secs(1)))? {
        let mut hist = [0u32; HIST_BUCKETS];
        hist[5..15].fill(u32::try_from(t)?);
        let snap = Snapshot {
            mode: Mode::Normal,
            global: (1..=n)
                .map(|i| {
                    (
                        i,
                        GlobalRecord {
                            count: t * i,
                            total_ns: t * i * 1_000_000,
                            max_ns: 2_000_000,
                        },
                    )
                })
                .collect(),
            stacks: (1..=n)
                .map(|i| {
                    (
                        i,
                        vec![
                            0xffff_ffff_8110_0010 + (i - 1) * 0x100,
                            0xffff_ffff_8130_0010,
                        ],
                    )
                })
                .collect(),
            histograms: (1..=n).map(|i| (i, hist)).collect(),
            taken_ns: latprof::time::monotonic_ns(),
            wall_ns: latprof::time::wall_ns(),
            ..Snapshot::default()
        };
        published = Some(acc.update(
            &snap,
            &syms,
            &KernelFacts::default(),
            &ProbeConfig::default(),
        ));
    }
    let published = published.context("no snapshot")?;
    if published.live.series.len() != usize::try_from(n)? {
        bail!("{} series, not {n}", published.live.series.len());
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let live = published.live.clone();
    let (_publisher, shared) = serve::channel(published, Duration::from_secs(3600));
    let server = Server::serve(Server::runtime()?, listener, shared)?;
    Ok((server, addr, live))
}

/// A row of answers: what was asked, how many answers, their bytes, (median, max) ms, and
/// the server's CPU ms per answer where it was measured.
type Answers = (String, usize, usize, (f64, f64), Option<f64>);

/// The series' report section (Markdown).
#[expect(
    clippy::too_many_lines,
    reason = "serve's benchmark as one story: start, scrape under load, stop, measure"
)]
pub(super) fn run(latprof: &Path, workload: &str, quick: bool) -> Result<String> {
    let mut md = String::from("\n## serve: latprof serve scraped\n\n");
    // Scrapes of 500 series.
    let (server, addr, synthetic_live) = synthetic(500)?;
    let mut rows: Vec<Answers> = Vec::new();
    // What a read costs to render, once, for the scrapes until the next read (the scrapes
    // below answer from it but for the first).
    let renders: u32 = if quick { 5 } else { 50 };
    let (cpu0, t0) = (rusage_ns(libc::RUSAGE_THREAD), Instant::now());
    let mut bytes = 0;
    for _ in 0..renders {
        bytes = openmetrics::render_live_body(&synthetic_live, Flavor::Prometheus).len();
    }
    let (cpu, took) = (rusage_ns(libc::RUSAGE_THREAD) - cpu0, t0.elapsed());
    rows.push((
        "/metrics rendered from a read, 500 series (once per read, in-process)".to_owned(),
        renders as usize,
        bytes,
        (ms(took) / f64::from(renders), ms(took) / f64::from(renders)),
        Some(cpu as f64 / 1e6 / f64::from(renders)),
    ));
    for (what, path, n) in [
        ("/metrics, 500 series (Prometheus text)", "/metrics", 200),
        (
            "/debug/pprof/offcpu?seconds=300, 500 backtraces x 300 reads",
            "/debug/pprof/offcpu?seconds=300",
            20,
        ),
    ] {
        let mut times = Vec::new();
        let mut bytes = 0;
        // The server's threads' CPU: this process's, less this (the client's) thread's.
        let (all0, client0) = (rusage_ns(libc::RUSAGE_SELF), rusage_ns(libc::RUSAGE_THREAD));
        for _ in 0..if quick { 5 } else { n } {
            let (status, len, took) = get(addr, path)?;
            if status != 200 {
                bail!("{path} answered {status}");
            }
            bytes = len;
            times.push(took);
        }
        let (all1, client1) = (rusage_ns(libc::RUSAGE_SELF), rusage_ns(libc::RUSAGE_THREAD));
        let server_ns = (all1 - all0).saturating_sub(client1 - client0);
        rows.push((
            what.to_owned(),
            times.len(),
            bytes,
            spread(&times),
            Some(server_ns as f64 / 1e6 / times.len() as f64),
        ));
    }
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let hackbench = s(&[
        "hackbench",
        "-g",
        "8",
        "--process",
        "--pipe",
        "-l",
        "2000",
        "-s",
        "512",
    ]);
    // The same scrape with every CPU busy (what a loaded machine's scrape meets).
    let loaded = if which("hackbench") {
        let times = timed_under_load(addr, "/metrics", if quick { 5 } else { 100 }, &hackbench)?;
        let bytes = get(addr, "/metrics")?.1;
        rows.push((
            "/metrics, 500 series, while hackbench runs (one every 100 ms)".to_owned(),
            times.len(),
            bytes,
            spread(&times),
            None,
        ));
        Some(spread(&times))
    } else {
        None
    };
    server.stop();
    let _ = writeln!(
        md,
        "Answer times, from the request to the last byte, over loopback:\n\n\
         | request | answers | bytes | median ms | max ms | server CPU ms per answer |\n|---|---:|---:|---:|---:|---:|"
    );
    for (what, n, bytes, (med, max), cpu) in &rows {
        let cpu = cpu.map_or("-".to_owned(), |c| format!("{c:.3}"));
        let _ = writeln!(
            md,
            "| {what} | {n} | {bytes} | {med:.2} | {max:.2} | {cpu} |"
        );
    }
    // The live binary under load.
    let trips = if quick { "3000" } else { "100000" };
    let busy = Duration::from_secs(if quick { 3 } else { 30 });
    let mut runs = vec![live(
        latprof,
        &format!(
            "ping-pong ({trips} round trips, again and again for {} s), scraped every 1 s",
            busy.as_secs()
        ),
        &s(&[
            workload,
            "pingpong",
            "--processes",
            "--cpu",
            "0",
            "--count",
            trips,
        ]),
        busy,
        Duration::from_secs(1),
    )?];
    if !quick && which("hackbench") {
        runs.push(live(
            latprof,
            &format!(
                "hackbench -g 8 --process --pipe -l 2000 -s 512 (again and again for {} s), scraped every 1 s",
                busy.as_secs()
            ),
            &hackbench,
            busy,
            Duration::from_secs(1),
        )?);
    }
    // About 10,000 counted sleeps a second: 11 threads sleeping 1 ms in a loop.
    let (secs, every) = if quick { (5, 1) } else { (120, 15) };
    let steady = s(&[
        workload,
        "threads",
        "--count",
        "11",
        "--interval",
        "1ms",
        "--seconds",
        &secs.to_string(),
    ]);
    runs.push(live(
        latprof,
        &format!("11 threads x nanosleep(1 ms) for {secs} s, scraped every {every} s"),
        &steady,
        Duration::ZERO,
        Duration::from_secs(every),
    )?);
    let _ = writeln!(
        md,
        "\nlatprof serve's process CPU time (user + system: its reads of the kernel's tables every \
         second and its answers; the eBPF programs' time is the lazy rows above) over the run:\n\n\
         | run | seconds | counted sleeps/s | latprof CPU, % of one CPU | scrapes | scrape median ms | max ms |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    for r in &runs {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.0} | {:.3} | {} | {:.2} | {:.2} |",
            r.what, r.secs, r.sleeps_per_s, r.cpu_pct, r.scrapes, r.scrape_ms.0, r.scrape_ms.1
        );
    }
    // Against the budgets, worst case first: the max answer, the loaded scrapes.
    let _ = writeln!(md, "\nBudgets:\n");
    // The idle scrapes: the /metrics row (the in-process render is not a scrape).
    let scrapes = rows
        .iter()
        .find(|(what, ..)| what.starts_with("/metrics, 500 series (Prometheus"));
    let idle = scrapes.map_or((0.0, 0.0), |(_, _, _, spread, _)| *spread);
    let (scrape_med, scrape_max) = loaded.unwrap_or(idle);
    let under = if loaded.is_some() {
        "while hackbench runs"
    } else {
        "idle (no hackbench here)"
    };
    let _ = writeln!(
        md,
        "- a scrape of 500 series under {SCRAPE_BUDGET_MS} ms, {under}: median {scrape_med:.2} ms ({}), max {scrape_max:.2} ms ({}); idle: median {:.2}, max {:.2} ms ({})",
        verdict(scrape_med < SCRAPE_BUDGET_MS),
        verdict(scrape_max < SCRAPE_BUDGET_MS),
        idle.0,
        idle.1,
        verdict(idle.1 < SCRAPE_BUDGET_MS),
    );
    // Issue 30: the server's CPU per scrape of 500 series (each read rendered once), and
    // what a scrape costs that is the first of its read, and renders it.
    if let Some(cpu) = scrapes.and_then(|(.., cpu)| *cpu) {
        let render = rows
            .iter()
            .find(|(what, ..)| what.starts_with("/metrics rendered from a read"))
            .and_then(|(.., cpu)| *cpu);
        let first = render.map_or(String::new(), |r| {
            format!(
                "; a scrape that is the first of its read renders it too: {:.3} ms ({}), as every scrape is where one scraper pulls less often than latprof reads",
                cpu + r,
                verdict(cpu + r < 1.0)
            )
        });
        let _ = writeln!(
            md,
            "- the server's CPU per scrape of 500 series under 1 ms, the read rendered already: {cpu:.3} ms ({}){first}",
            verdict(cpu < 1.0)
        );
    }
    if let Some(steady) = runs.last() {
        let load = if steady.sleeps_per_s >= 9_000.0 {
            String::new()
        } else {
            format!(
                " (**only {:.0} counted sleeps/s, not the budget's 10,000**)",
                steady.sleeps_per_s
            )
        };
        let _ = writeln!(
            md,
            "- under {CPU_BUDGET_PCT}% of one CPU with 10,000 sleeps/s scraped every 15 s (here every {every} s): {:.3}% ({}){load}",
            steady.cpu_pct,
            verdict(steady.cpu_pct < CPU_BUDGET_PCT),
        );
    }
    Ok(md)
}

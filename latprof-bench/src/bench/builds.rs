//! The `builds` series: the static binary (`cargo xtask dist`: musl, its libc and its
//! allocator) against the glibc build of the same source, as `stats` and as `serve` (scraped
//! every 200 ms), under the same workloads, alternating which build runs first each round.
//! Each run's user and system CPU and peak RSS come from the kernel's accounting of the
//! latprof process (wait4), so the numbers are user space's alone: the eBPF programs' time is
//! the kernel's, the same for both builds. Prints each build's medians and the static
//! binary's ratios to glibc's; asserts nothing.
use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    measure::{median, signal_and_reap, timeval_ns},
    serve::run_quietly,
};

/// How a latprof ran: user and system CPU (ns) and peak RSS (KiB).
#[derive(Clone, Copy, Default)]
struct Usage {
    user_ns: u64,
    sys_ns: u64,
    rss_kb: u64,
}

/// Stops child `pid` with `signal`; its resource usage. Fails unless it exited 0.
fn reap(pid: u32, signal: libc::c_int) -> Result<Usage> {
    let (status, usage) = signal_and_reap(pid, signal)?;
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("latprof ended with status {status:#x}");
    }
    Ok(Usage {
        user_ns: timeval_ns(usage.ru_utime),
        sys_ns: timeval_ns(usage.ru_stime),
        rss_kb: u64::try_from(usage.ru_maxrss).unwrap_or(0),
    })
}

/// Starts `latprof ARGS` and waits for its first stderr line, which must hold `ready`; the
/// rest of its stderr is drained.
fn start(latprof: &Path, args: &[&str], ready: &str) -> Result<u32> {
    let mut child = Command::new(latprof)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", latprof.display()))?;
    let mut stderr = BufReader::new(child.stderr.take().context("stderr")?);
    let mut line = String::new();
    stderr.read_line(&mut line)?;
    if !line.contains(ready) {
        bail!("{} {args:?} did not start: {line}", latprof.display());
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let pid = child.id();
    // Reaped by `reap` (wait4), not by Child.
    std::mem::forget(child);
    Ok(pid)
}

/// How long latprof runs under a workload: the workload runs again until this has passed
/// (CPU time is counted in ticks: short runs would measure start-up and rounding).
const RUN_FOR: Duration = Duration::from_secs(10);

/// Runs `command` again and again until `RUN_FOR` has passed.
fn run_workload(command: &[String]) -> Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < RUN_FOR {
        run_quietly(command)?;
    }
    Ok(())
}

/// `latprof stats` while `work` runs; stopped with SIGINT, it prints its table.
fn stats(latprof: &Path, work: &[String]) -> Result<Usage> {
    let pid = start(latprof, &["stats"], "attached")?;
    run_workload(work)?;
    reap(pid, libc::SIGINT)
}

/// `latprof serve` while `work` runs, scraped every 200 ms; stopped with SIGTERM.
fn serve(latprof: &Path, work: &[String]) -> Result<Usage> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let pid = start(latprof, &["serve", "--listen", &addr], "serving")?;
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = Arc::clone(&stop);
        let addr = addr.clone();
        std::thread::spawn(move || -> Result<usize> {
            let mut scrapes = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut s = TcpStream::connect(&addr).context("connect")?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                write!(
                    s,
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )?;
                let mut text = String::new();
                s.read_to_string(&mut text)?;
                if !text.starts_with("HTTP/1.1 200") {
                    bail!("scrape answered {}", text.lines().next().unwrap_or(""));
                }
                scrapes += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(scrapes)
        })
    };
    let ran = run_workload(work);
    stop.store(true, Ordering::Relaxed);
    let scraped = scraper
        .join()
        .map_err(|_| anyhow::anyhow!("the scraper panicked"))?;
    let usage = reap(pid, libc::SIGTERM)?;
    ran?;
    scraped?;
    Ok(usage)
}

/// One measured run of a build under a workload.
type Run = fn(&Path, &[String]) -> Result<Usage>;

/// The series: each (command, workload) under both builds, `rounds` times.
pub(super) fn run(
    glibc: &Path,
    musl: &Path,
    workloads: &[(String, Vec<String>)],
    rounds: u32,
) -> Result<String> {
    for (what, bin) in [("glibc", glibc), ("static", musl)] {
        if !bin.is_file() {
            bail!(
                "{} ({what}) is missing: `cargo xtask dist` builds the static binary",
                bin.display()
            );
        }
    }
    let builds: [(&str, PathBuf); 2] = [("glibc", glibc.into()), ("static", musl.into())];
    // (command, workload, build) -> usages.
    let mut runs: Vec<((usize, usize, usize), Vec<Usage>)> = Vec::new();
    let commands: [(&str, Run); 2] = [("stats", stats), ("serve", serve)];
    for round in 0..rounds {
        for (c, (name, command)) in commands.iter().enumerate() {
            for (w, (what, work)) in workloads.iter().enumerate() {
                // Each round the other build first.
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for b in order {
                    eprintln!(
                        "bench: builds round {}/{rounds}: {name} of {} under {what}",
                        round + 1,
                        builds[b].0
                    );
                    let usage = command(&builds[b].1, work)?;
                    match runs.iter_mut().find(|(k, _)| *k == (c, w, b)) {
                        Some((_, v)) => v.push(usage),
                        None => runs.push(((c, w, b), vec![usage])),
                    }
                }
            }
        }
    }
    let med = |c: usize, w: usize, b: usize, f: fn(&Usage) -> u64| -> f64 {
        let v = runs
            .iter()
            .find(|(k, _)| *k == (c, w, b))
            .map(|(_, v)| v.iter().map(|u| f(u) as f64).collect())
            .unwrap_or_default();
        median(v)
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Static (musl) binary against the glibc build\n\n\
         latprof's own process, medians of {rounds} runs each (alternating which build runs \
         first): user and system CPU over the whole run (start-up included: loading and \
         verifying the programs is most of the system time), peak RSS. Each run lasts {} s, \
         the workload repeated; `stats` prints at SIGINT, `serve` is scraped every 200 ms \
         meanwhile. The ratio is static / glibc.\n\n\
         | command | workload | glibc user ms | static user ms | ratio | glibc sys ms | static sys ms | glibc RSS MiB | static RSS MiB | ratio |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        RUN_FOR.as_secs()
    );
    for (c, (name, _)) in commands.iter().enumerate() {
        for (w, (what, _)) in workloads.iter().enumerate() {
            let user = (med(c, w, 0, |u| u.user_ns), med(c, w, 1, |u| u.user_ns));
            let sys = (med(c, w, 0, |u| u.sys_ns), med(c, w, 1, |u| u.sys_ns));
            let rss = (med(c, w, 0, |u| u.rss_kb), med(c, w, 1, |u| u.rss_kb));
            let ratio = |(g, s): (f64, f64)| {
                if g > 0.0 {
                    format!("{:.2}", s / g)
                } else {
                    "-".to_owned()
                }
            };
            let _ = writeln!(
                md,
                "| {name} | {what} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {} |",
                user.0 / 1e6,
                user.1 / 1e6,
                ratio(user),
                sys.0 / 1e6,
                sys.1 / 1e6,
                rss.0 / 1024.0,
                rss.1 / 1024.0,
                ratio(rss),
            );
        }
    }
    Ok(md)
}

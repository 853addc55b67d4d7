//! `latprof stats`: collect for a while, print /proc/latency_stats-compatible text.
use std::{
    io::Write as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use latprof_common::Counter;

use crate::{
    cli::{Cli, StatsArgs},
    collect::Collector,
    duration, export,
    probe::{self, Probe},
    reasons::Reasons,
    symbols::Kallsyms,
};

/// Set by SIGINT and SIGTERM.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("install signal handler")?;
    }
    Ok(stop)
}

pub fn run(cli: &Cli, args: &StatsArgs) -> Result<()> {
    probe::check_privileges()?;
    if let Some(pid) = args.pid
        && std::fs::metadata(format!("/proc/{pid}")).is_err()
    {
        bail!("no process with pid {pid}");
    }
    let stop = stop_flag()?;
    let syms = Kallsyms::load()?;
    let mut probe = Probe::attach(cli.probe_config(args.pid, false, false))?;
    let mut log = crate::debuglog::DebugLog::start(&mut probe, cli, false)?;
    // `--counters` shows latprof's own cost per program run: the kernel counts run time while
    // this fd is open (closed when stats returns).
    let _run_time_stats = if args.counters {
        aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()
    } else {
        None
    };
    eprintln!(
        "latprof: attached ({} mode); collecting for {}, Ctrl-C to stop early",
        cli.mode.as_str(),
        duration::format(args.duration)
    );
    probe.announce();
    let kernel = crate::nohz::kernel_facts(&probe);
    let mut collector = Collector::new();
    // `--counters` rates are over the collection, from this first snapshot.
    let first = if args.counters {
        Some(collector.snapshot(&probe)?)
    } else {
        None
    };
    let deadline = Instant::now() + args.duration;
    while !stop.load(Ordering::Relaxed) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
        log.flush();
    }
    let snap = collector.snapshot(&probe)?;
    log.flush();
    drop(probe);
    let reasons = Reasons::builtin();
    // The probe already kept only --pid's threads: the global table is that process's, and in
    // lazy mode it also holds its threads that exited.
    let scope = export::Scope {
        cur: &snap,
        base: None,
        pid: None,
        syms: &syms,
        reasons: &reasons,
        depth: usize::from(cli.depth()),
        info: None,
        kernel: Some(&kernel),
        spikes: &[],
        reader_sleeps: None,
    };
    let text = if args.counters && args.format == export::Format::Text {
        export::counters::render(&kernel, first.as_ref(), &snap)
    } else {
        export::render(args.format, &scope)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")?;
    let c = &snap.counters;
    eprintln!(
        "latprof: {} sleeps counted ({} interruptible over the cutoff and {} under 1us not counted)",
        c.get(Counter::Counted),
        c.get(Counter::SkippedCutoff),
        c.get(Counter::SkippedZero),
    );
    for loss in c.losses() {
        eprintln!("latprof: warning: {loss}");
    }
    Ok(())
}

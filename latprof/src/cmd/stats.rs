//! `latprof stats`: collect for a while, print /proc/latency_stats-compatible text.
use std::{
    io::Write as _,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use latprof_common::Counter;

use super::session::{Needs, Session};
use crate::{
    cli::{Cli, StatsArgs},
    export,
    reasons::Reasons,
    time,
};

pub fn run(cli: &Cli, args: &StatsArgs) -> Result<()> {
    export::check_wakers_flag(cli.wakers_on(), args.format, args.by)?;
    let reasons = Reasons::load(args.reasons.as_deref())?;
    // `--counters` shows latprof's own cost per program run.
    let mut session = Session::start(
        cli,
        Needs {
            pid: args.pid,
            run_time_stats: args.counters,
            exit_log: args.format == export::Format::Pprof && cli.profile_labels.threads(),
            ..Needs::default()
        },
    )?;
    let mut collector = session.collector(false)?;
    // `--counters` rates are over the collection, from this first snapshot, taken before
    // "attached" is said: whatever happens after that line is in the numbers.
    let first = if args.counters {
        Some(collector.snapshot(&session.probe)?)
    } else {
        None
    };
    eprintln!(
        "latprof: attached ({} mode); collecting for {}, Ctrl-C to stop early",
        cli.mode.as_str(),
        time::format_duration(args.duration)
    );
    session.announce();
    let deadline = Instant::now() + args.duration;
    let mut checked = Instant::now();
    while !session.stop.load(Ordering::Relaxed) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
        session.log.flush();
        // The exited tasks' log holds a few hundred.
        collector.drain_exits(&session.probe);
        if checked.elapsed() >= Duration::from_secs(1) {
            // Drains the hidden-switch log, which holds a few thousand events: a long run on
            // a kernel that hides much would fill it before the end.
            collector.drain_hidden(&session.probe)?;
            // A cgroup made and removed before the end keeps its path.
            collector.look_at_cgroups();
            checked = Instant::now();
        }
    }
    collector.patient();
    let snap = collector.snapshot(&session.probe)?;
    let Session {
        probe,
        mut log,
        syms,
        kernel,
        ..
    } = session;
    log.flush();
    drop(probe);
    // The probe already kept only --pid's threads: the global table is that process's, and in
    // lazy mode it also holds its threads that exited.
    let scope = export::Scope {
        cur: &snap,
        base: None,
        pid: None,
        traced: args.pid,
        syms: &syms,
        reasons: &reasons,
        depth: usize::from(cli.depth()),
        info: None,
        kernel: Some(&kernel),
        chain_depth: usize::from(cli.chain_depth),
        labels: cli.profile_labels,
        spikes: &[],
        reader_sleeps: None,
    };
    let text = if args.counters && args.format == export::Format::Text {
        export::counters::render(&kernel, first.as_ref(), &snap).into_bytes()
    } else if cli.chains && args.format == export::Format::Folded && args.by == export::By::Cause {
        export::chains::render_folded(&scope).into_bytes()
    } else if cli.wakers_on()
        && args.format == export::Format::Folded
        && args.by == export::By::Cause
    {
        export::folded::render_wakers(&scope).into_bytes()
    } else if args.by == export::By::Cgroup {
        export::cgroups::render(args.format, &scope)
    } else {
        export::render(args.format, &scope)
    };
    let mut out = std::io::stdout().lock();
    let hint =
        (args.format == export::Format::Text && !args.counters && args.by == export::By::Cause)
            .then(|| super::first_run::hint(&text, &snap, cli.all_sleeps, cli.inter_cutoff))
            .flatten();
    out.write_all(&text)
        .and_then(|()| super::first_run::say(&mut out, hint))
        .and_then(|()| out.flush())
        .context("writing to stdout")?;
    let c = &snap.counters;
    eprintln!(
        "latprof: {} sleeps counted ({} interruptible over the cutoff and {} under 1us not counted)",
        c.get(Counter::Counted),
        c.get(Counter::SkippedCutoff),
        c.get(Counter::SkippedZero),
    );
    if let Some(line) = snap.hidden.short_by_process() {
        eprintln!("latprof: {line}");
    }
    let (kthreads, no_mm) = (c.get(Counter::KthreadSleeps), c.get(Counter::NoMmSleeps));
    if args.pid.is_none() && kthreads + no_mm > 0 {
        eprintln!(
            "latprof: {kthreads} sleeps of kernel threads and {no_mm} of exiting tasks without a memory map kept out of the global table, as latencytop does"
        );
    }
    for loss in snap.losses() {
        eprintln!("latprof: warning: {loss}");
    }
    Ok(())
}

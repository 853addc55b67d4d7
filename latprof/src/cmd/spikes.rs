//! `latprof spikes`: every sleep or run-queue wait over `--spike`, one line each, as it happens.
use std::{
    collections::HashMap,
    io::Write as _,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::session::{Needs, Session};
use crate::{
    cli::{Cli, SpikesArgs},
    collect::Spike,
    probe::Wakeup,
    reasons::Reasons,
    symbols::Backtrace,
    time,
};

/// One line: time, pid, tid, comm, kind, duration, cpu, waker, reason.
#[must_use]
pub fn line(s: &Spike, at: &str, reason: &str) -> String {
    format!(
        "{at} {:>7} {:>7} {:<16} {} {:>10} cpu{:<3} {:<22} {reason}",
        s.tgid,
        s.tid,
        s.comm,
        s.kind_letter(),
        time::fmt_ns(s.duration_ns),
        s.cpu,
        s.waker_word()
    )
}

pub const HEADER: &str = "TIME                PID     TID COMM             K   DURATION CPU    WAKER                  REASON";

pub fn run(cli: &Cli, args: &SpikesArgs) -> Result<()> {
    let reasons = Reasons::load(args.reasons.as_deref())?;
    let mut session = Session::start(
        cli,
        Needs {
            pid: args.pid,
            spikes: true,
            ..Needs::default()
        },
    )?;
    // Said once the collector runs: with --user-stacks it read the processes there are first.
    let mut collector = session.collector(false)?;
    eprintln!(
        "latprof: attached ({} mode); printing sleeps and run-queue waits of {} or more ({} wakeups), Ctrl-C to stop",
        cli.mode.as_str(),
        time::format_duration(cli.spike),
        match cli.wakeup {
            Wakeup::Adaptive => "adaptive",
            Wakeup::Always => "always",
        }
    );
    session.announce();
    let Session {
        probe,
        spikes: reader,
        mut log,
        syms,
        stop,
        ..
    } = session;
    let mut reader = reader.context("the session has no spike reader")?;
    let mut reason_cache: HashMap<u64, String> = HashMap::new();
    let clock = (time::wall_ns(), time::monotonic_ns());
    let depth = usize::from(cli.depth());
    let end = args.duration.map(|d| Instant::now() + d);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{HEADER}").context("writing to stdout")?;
    let mut total = 0u64;
    let mut spikes = Vec::new();
    let mut last_round = false;
    loop {
        let stopping = stop.load(Ordering::Relaxed) || end.is_some_and(|e| Instant::now() >= e);
        spikes.clear();
        // When stopping, one more look without sleeping: what came after the last read.
        let timeout = if stopping {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        reader.read(timeout, &mut spikes)?;
        log.flush();
        for s in &spikes {
            if let std::collections::hash_map::Entry::Vacant(e) = reason_cache.entry(s.stack_id) {
                let raw = collector.stack(&probe, s.stack_id)?;
                let backtrace = Backtrace::of(s.stack_id, raw.as_deref(), &syms, depth);
                let mut reason = reasons.reason(&backtrace);
                // With --user-stacks: where in the program it waited.
                if let Some(site) = collector
                    .user_of(&probe, s.stack_id)?
                    .and_then(|frames| crate::model::site_of(&frames, depth))
                {
                    reason = format!("{reason} in {site}");
                }
                e.insert(reason);
            }
            let reason = &reason_cache[&s.stack_id];
            writeln!(
                out,
                "{}",
                line(s, &time::local_hms_us(s.end_ns, clock), reason)
            )
            .context("writing to stdout")?;
        }
        out.flush().context("writing to stdout")?;
        total += spikes.len() as u64;
        if last_round {
            break;
        }
        last_round = stopping;
    }
    let last = collector.snapshot(&probe)?;
    log.flush();
    let c = &last.counters;
    let (submitted, woken, suppressed, dropped) = c.spike_pipeline();
    eprintln!(
        "latprof: {total} spikes; submitted {submitted}, reader wakeups sent {woken}, suppressed {suppressed}, dropped {dropped}, reader sleeps {}",
        reader.sleeps
    );
    if let Some(line) = last.hidden.short_by_process() {
        eprintln!("latprof: {line}");
    }
    for loss in last.losses() {
        eprintln!("latprof: warning: {loss}");
    }
    Ok(())
}

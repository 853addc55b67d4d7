//! `latprof serve`: keeps the probes attached and answers HTTP (see `crate::serve`). This
//! thread owns the session and reads the kernel's tables every `--interval`, publishing each
//! result; the HTTP server runs on its own threads and only reads what was published.
use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::session::{self, Needs, Session};
use crate::{
    cli::{Cli, ServeArgs},
    collect::Collector,
    notify::Notifier,
    reasons::Reasons,
    serve::{self, Publisher, Server, state::Accumulator},
};

pub fn run(cli: &Cli, args: &ServeArgs) -> Result<()> {
    if args.interval < Duration::from_millis(100) || args.interval > Duration::from_secs(60) {
        bail!("--interval must be from 100ms to 60s");
    }
    let reasons = Reasons::load(args.reasons.as_deref())?;
    let needs = Needs {
        pid: args.pid,
        details: true,
        run_time_stats: true,
        exit_log: cli.profile_labels.threads(),
        ..Needs::default()
    };
    // What latprof cannot do, and a port it cannot have, are said before anything loads.
    let checked = session::preflight(cli, &needs)?;
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let runtime = Server::runtime()?;
    let mut session = Session::start_checked(cli, needs, checked)?;
    let mut collector = session.collector(true)?;
    let mut acc = Accumulator::new(
        reasons,
        usize::from(cli.depth()),
        args.max_series as usize,
        cli.mode.as_str(),
    )
    .with_max_cgroups(args.max_cgroups as usize)
    .with_labels(cli.profile_labels)
    .with_interval(args.interval);
    if cli.chains {
        acc = acc.with_chains(usize::from(cli.chain_depth));
    }
    let first = acc.update(
        &collector.snapshot(&session.probe)?,
        &session.syms,
        &session.kernel,
        session.probe.config(),
    );
    let (publisher, shared) = serve::channel(first, args.interval);
    let server = Server::serve(runtime, listener, shared)?;
    eprintln!(
        "latprof: attached ({} mode); serving http://{}/ (/metrics, /debug/pprof/offcpu), Ctrl-C or SIGTERM to stop",
        cli.mode.as_str(),
        args.listen
    );
    session.announce();
    // Ready for systemd (Type=notify) only now: the programs are attached, the first read is
    // published and the listener answers with it.
    let mut notifier = Notifier::from_env();
    notifier.ready(&format!("serving http://{}/", args.listen));
    let result = collect(
        args,
        &mut session,
        &mut collector,
        &mut acc,
        &publisher,
        &server,
        &mut notifier,
    );
    notifier.stopping();
    server.stop();
    session.log.flush();
    drop(session);
    if result.is_ok() {
        eprintln!("latprof: stopped");
    }
    result
}

/// Reads the kernel's tables every `--interval` and publishes the result, until a signal.
fn collect(
    args: &ServeArgs,
    session: &mut Session,
    collector: &mut Collector,
    acc: &mut Accumulator,
    publisher: &Publisher,
    server: &Server,
    notifier: &mut Notifier,
) -> Result<()> {
    let mut next = Instant::now() + args.interval;
    let mut losses = crate::serve::losses::Losses::default();
    while !session.stop.load(Ordering::Relaxed) {
        if server.is_finished() {
            bail!("the HTTP server stopped");
        }
        // The watchdog hears from the loop that reads: a stalled read goes quiet.
        notifier.alive();
        session.log.flush();
        let left = next.saturating_duration_since(Instant::now());
        if !left.is_zero() {
            std::thread::sleep(left.min(Duration::from_millis(100)));
            // The exited tasks' log holds a few hundred: a storm of exits between two reads
            // would fill it (its exits then go out without their thread's labels).
            collector.drain_exits(&session.probe);
            continue;
        }
        next += args.interval;
        // After a stall (a stopped process, a suspended machine) the reads do not catch up.
        if next < Instant::now() {
            next = Instant::now() + args.interval;
        }
        let snap = collector.snapshot(&session.probe)?;
        for line in losses.read(&snap.counters, Instant::now()) {
            eprintln!("latprof: warning: {line}");
        }
        publisher.publish(acc.update(
            &snap,
            &session.syms,
            &session.kernel,
            session.probe.config(),
        ));
    }
    Ok(())
}

//! `latprof serve`: keeps the probes attached and answers HTTP (see `crate::serve`). This
//! thread owns the session and reads the kernel's tables every `--interval`, publishing each
//! result; the HTTP server runs on its own threads and only reads what was published.
use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use tokio::sync::watch;

use super::session::{self, Needs, Session};
use crate::{
    cli::{Cli, ServeArgs},
    collect::Collector,
    reasons::Reasons,
    serve::{
        self, Shared,
        state::{Accumulator, Published},
    },
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
        ..Needs::default()
    };
    // What latprof cannot do, and a port it cannot have, are said before anything loads.
    session::preflight(cli, &needs)?;
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    listener
        .set_nonblocking(true)
        .context("set the listener non-blocking")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("latprof-http")
        .enable_io()
        .enable_time()
        .build()
        .context("start the HTTP runtime")?;
    let mut session = Session::start(cli, needs)?;
    let result = serve(cli, args, reasons, &mut session, &runtime, listener);
    // No client keeps latprof up: connections still open are cut.
    runtime.shutdown_timeout(Duration::from_secs(1));
    drop(session);
    result
}

fn serve(
    cli: &Cli,
    args: &ServeArgs,
    reasons: Reasons,
    session: &mut Session,
    runtime: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
) -> Result<()> {
    let mut collector = Collector::with_details();
    let mut acc = Accumulator::new(
        reasons,
        usize::from(cli.depth()),
        args.max_series as usize,
        cli.mode.as_str(),
    );
    let first = acc.update(
        &collector.snapshot(&session.probe)?,
        &session.syms,
        &session.kernel,
        session.probe.config(),
    );
    let (tx, rx) = watch::channel(Arc::new(first));
    let listener = {
        let _runtime = runtime.enter();
        tokio::net::TcpListener::from_std(listener).context("listen")?
    };
    let app = serve::router(Shared {
        latest: rx,
        interval: args.interval,
    });
    let server = runtime.spawn(async move { axum::serve(listener, app).await });
    eprintln!(
        "latprof: attached ({} mode); serving http://{}/ (/metrics, /debug/pprof/offcpu), Ctrl-C or SIGTERM to stop",
        cli.mode.as_str(),
        args.listen
    );
    session.announce();
    let mut next = Instant::now() + args.interval;
    while !session.stop.load(Ordering::Relaxed) {
        if server.is_finished() {
            bail!("the HTTP server stopped");
        }
        session.log.flush();
        let left = next.saturating_duration_since(Instant::now());
        if !left.is_zero() {
            std::thread::sleep(left.min(Duration::from_millis(100)));
            continue;
        }
        next += args.interval;
        // After a stall (a stopped process, a suspended machine) the reads do not catch up.
        if next < Instant::now() {
            next = Instant::now() + args.interval;
        }
        let snap = collector.snapshot(&session.probe)?;
        let published: Published = acc.update(
            &snap,
            &session.syms,
            &session.kernel,
            session.probe.config(),
        );
        tx.send_replace(Arc::new(published));
    }
    session.log.flush();
    eprintln!("latprof: stopped");
    Ok(())
}

//! `latprof top`: the live TUI. A collector thread owns the probe and sends snapshots, the
//! spike reader's thread sends spikes, the terminal's thread sends keys, all as one kind of
//! event on one channel; the UI thread owns the App and draws after each batch of events.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, RecvTimeoutError},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use super::session::{Needs, Session};
use crate::{
    cli::{Cli, TopArgs},
    reasons::Reasons,
    tui::{
        TerminalGuard, app,
        events::{self, Event},
        ui,
    },
};

/// The processes pane's filter at the start: `--pid`, else `--comm`. A view filter: the
/// programs see every process, and the pane shows those whose pid, or one of whose threads'
/// id or name (part of it, any case), matches.
#[must_use]
pub fn initial_filter(args: &TopArgs) -> String {
    match (args.pid, &args.comm) {
        (Some(pid), _) => pid.to_string(),
        (None, Some(comm)) => comm.clone(),
        (None, None) => String::new(),
    }
}

pub fn run(cli: &Cli, args: &TopArgs) -> Result<()> {
    // Before anything loads: what top cannot do says so at once.
    if args.interval < Duration::from_millis(10) {
        bail!("--interval must be at least 10ms");
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        bail!(
            "latprof top needs a terminal (standard output is not one); `latprof stats` or `latprof record` work without"
        );
    }
    let reasons = Reasons::load(args.reasons.as_deref())?;
    let mut session = Session::start(
        cli,
        Needs {
            details: true,
            spikes: true,
            owns_terminal: true,
            run_time_stats: true,
            ..Needs::default()
        },
    )?;
    let mut collector = session.collector(true)?;
    let Session {
        probe,
        spikes: reader,
        mut log,
        kernel,
        syms,
        stop,
        run_time_stats,
        ..
    } = session;
    let mut reader = reader.context("the session has no spike reader")?;
    // Said once, where a terminal user sees it: top never prints to stderr while it runs.
    let no_cgroups = probe.cgroups_unavailable();
    let log_path = log.path.clone();

    // One channel: every source sends its events, the loop handles them in order.
    let (events, inbox) = mpsc::channel();
    let (hangup, hung_up) = mpsc::channel::<()>();
    let interval = args.interval;
    let collector = {
        let events = events.clone();
        std::thread::Builder::new()
            .name("collector".into())
            .spawn(move || {
                loop {
                    log.flush();
                    let (event, failed) = match collector.snapshot(&probe) {
                        Ok(snap) => (Event::Snapshot(Box::new(snap)), false),
                        Err(e) => (Event::Failed(e), true),
                    };
                    if events.send(event).is_err() || failed {
                        break;
                    }
                    match hung_up.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => break,
                    }
                }
                drop(probe);
            })
            .context("starting the collector thread")?
    };
    // The spike reader sleeps in poll; the kernel wakes it (adaptive: only when it waits).
    let done = Arc::new(AtomicBool::new(false));
    let spikes_thread = {
        let (done, events) = (Arc::clone(&done), events.clone());
        std::thread::Builder::new()
            .name("spikes".into())
            .spawn(move || {
                let mut batch = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    batch.clear();
                    if reader.read(Duration::from_millis(200), &mut batch).is_err() {
                        break;
                    }
                    if events
                        .send(Event::Spikes(batch.clone(), reader.sleeps))
                        .is_err()
                    {
                        break;
                    }
                }
            })
            .context("starting the spike reader thread")?
    };
    let keys_thread = events::spawn_input(events, stop, Arc::clone(&done))?;

    let filter = initial_filter(args);
    let mut app = app::App::new(
        app::Settings {
            mode: cli.mode,
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            depth: usize::from(cli.depth()),
            syms,
            reasons,
            kernel,
            spike_ns: u64::try_from(cli.spike.as_nanos()).unwrap_or(u64::MAX),
            wakers: cli.wakers_on(),
            chain_depth: usize::from(cli.chain_depth),
        },
        filter,
    );
    if no_cgroups {
        app.status = Some(crate::probe::NO_CGROUP_VIEWS.to_owned());
    }
    let result = show(&mut app, &inbox);
    drop(hangup);
    done.store(true, Ordering::Relaxed);
    drop(inbox);
    let _ = spikes_thread.join();
    let _ = keys_thread.join();
    let _ = collector.join();
    if let Some(path) = &log_path {
        eprintln!("latprof: the eBPF debug log is in {}", path.display());
    }
    drop(run_time_stats);
    result
}

/// The UI's loop: draws, then blocks until an event comes, handles those queued behind it
/// and draws once; until a key quits, a signal or the terminal's end stops it, or a source
/// fails.
fn show(app: &mut app::App, inbox: &mpsc::Receiver<Event>) -> Result<()> {
    let mut guard = TerminalGuard::new()?;
    guard.terminal.draw(|f| ui::render(f, app))?;
    // Blocks until an event comes; then handles those queued behind it and draws once.
    while let Ok(event) = inbox.recv() {
        let mut next = Some(event);
        while let Some(event) = next {
            match event {
                Event::Keys(keys) => keys.into_iter().for_each(|key| app.handle_key(key)),
                Event::Snapshot(snap) => app.on_snapshot(*snap),
                Event::Spikes(spikes, sleeps) => app.on_spikes(spikes, sleeps),
                Event::Stop => return Ok(()),
                Event::Failed(e) => return Err(e),
            }
            next = inbox.try_recv().ok();
        }
        if app.quit {
            break;
        }
        guard.terminal.draw(|f| ui::render(f, app))?;
    }
    Ok(())
}

//! `latprof top`: the live TUI. A collector thread owns the probe and sends snapshots; the UI
//! thread owns the terminal and the App.
pub mod app;
pub mod replay;
pub mod ui;

use std::{
    io::Stdout,
    sync::{
        atomic::Ordering,
        mpsc::{self, RecvTimeoutError},
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        cursor,
        event::{self, Event},
        execute,
        terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
    },
};

use crate::{
    cli::{Cli, TopArgs},
    collect::Collector,
    probe::{self, Probe},
    reasons::Reasons,
    symbols::Kallsyms,
};

/// Owns the terminal while the TUI runs; gives it back on drop, panics included.
struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen, cursor::Show);
}

impl TerminalGuard {
    fn new() -> Result<Self> {
        terminal::enable_raw_mode().context("the terminal cannot enter raw mode (not a tty?)")?;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        execute!(std::io::stdout(), EnterAlternateScreen, cursor::Hide)
            .context("setting up the terminal")?;
        let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
        Ok(Self { terminal })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

pub fn run(cli: &Cli, args: &TopArgs) -> Result<()> {
    probe::check_privileges()?;
    let reasons = Reasons::load(args.reasons.as_deref())?;
    let syms = Kallsyms::load()?;
    let stop = crate::stats::stop_flag()?;
    let mut probe = Probe::attach(cli.probe_config(None, true, true))?;
    let mut reader = crate::spikes::SpikeReader::take(&mut probe)?;
    let mut log = crate::debuglog::DebugLog::start(&mut probe, cli, true)?;
    let log_path = log.path.clone();
    let kernel = crate::nohz::kernel_facts(&probe);
    // The kernel counts the programs' run time while this fd is open; closing it (at exit, in
    // any way) restores whatever the system had before.
    let run_time_stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();

    let (snapshots, inbox) = mpsc::channel();
    let (hangup, hung_up) = mpsc::channel::<()>();
    let interval = args.interval;
    let collector = std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || {
            let mut collector = Collector::with_details();
            loop {
                log.flush();
                let result = collector.snapshot(&probe);
                let failed = result.is_err();
                if snapshots.send(result).is_err() || failed {
                    break;
                }
                match hung_up.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            }
            drop(probe);
        })
        .context("starting the collector thread")?;
    // The spike reader sleeps in poll; the kernel wakes it (adaptive: only when it waits).
    let (spike_tx, spike_inbox) = mpsc::channel();
    let spikes_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spikes_thread = {
        let done = std::sync::Arc::clone(&spikes_done);
        std::thread::Builder::new()
            .name("spikes".into())
            .spawn(move || {
                let mut batch = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    batch.clear();
                    if reader.read(Duration::from_millis(200), &mut batch).is_err() {
                        break;
                    }
                    if spike_tx.send((batch.clone(), reader.sleeps)).is_err() {
                        break;
                    }
                }
            })
            .context("starting the spike reader thread")?
    };

    let filter = match (args.pid, &args.comm) {
        (Some(pid), _) => pid.to_string(),
        (None, Some(comm)) => comm.clone(),
        (None, None) => String::new(),
    };
    let mut app = app::App::new(
        app::Settings {
            mode: cli.mode,
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            depth: usize::from(cli.depth()),
            syms,
            reasons,
            kernel,
            spike_ns: u64::try_from(cli.spike.as_nanos()).unwrap_or(u64::MAX),
        },
        filter,
    );
    let result = (|| -> Result<()> {
        let mut guard = TerminalGuard::new()?;
        while !app.quit && !stop.load(Ordering::Relaxed) {
            guard.terminal.draw(|f| ui::render(f, &app))?;
            if event::poll(Duration::from_millis(100))? {
                if let Event::Key(key) = event::read()? {
                    app.handle_key(key);
                }
            }
            while let Ok(snapshot) = inbox.try_recv() {
                app.on_snapshot(snapshot?);
            }
            while let Ok((spikes, sleeps)) = spike_inbox.try_recv() {
                app.on_spikes(spikes, sleeps);
            }
        }
        Ok(())
    })();
    drop(hangup);
    spikes_done.store(true, Ordering::Relaxed);
    drop(spike_inbox);
    let _ = spikes_thread.join();
    let _ = collector.join();
    if let Some(path) = &log_path {
        eprintln!("latprof: the eBPF debug log is in {}", path.display());
    }
    drop(run_time_stats);
    result
}

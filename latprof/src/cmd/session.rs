//! A live session, started and stopped the same way for every command that watches the kernel
//! (`stats`, `top`, `record`, `spikes`): privileges first, then the signal flag, the kernel's
//! symbols, the programs loaded and attached, the spike reader, the eBPF debug log, the
//! kernel's facts and, where latprof shows its own cost, the kernel's run-time statistics.
use std::{
    os::fd::OwnedFd,
    sync::{Arc, atomic::AtomicBool},
};

use anyhow::{Result, bail};

use crate::{
    cli::Cli,
    collect::{Collector, SpikeReader},
    probe::{
        self, KernelFacts, Probe, ProbeConfig,
        log::{DebugLog, LogFile},
    },
    symbols::Kallsyms,
};

/// `--pid` must name a process: the filter is on the process (thread group), so a thread's id
/// would match nothing.
fn check_process(pid: u32) -> Result<()> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        bail!("no process with pid {pid}");
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    match tgid {
        Some(tgid) if tgid != pid => {
            bail!(
                "{pid} is a thread of process {tgid}: --pid takes a process id (try --pid {tgid})"
            )
        }
        _ => Ok(()),
    }
}

/// What a command needs from its session.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// Only this process (checked to exist before anything loads).
    pub pid: Option<u32>,
    /// Run-queue latency and histograms.
    pub details: bool,
    /// The spike ring buffer and its reader.
    pub spikes: bool,
    /// The command draws on the terminal, so the debug log goes to a file.
    pub owns_terminal: bool,
    /// latprof's own cost per program run: the kernel counts run time while the session lives.
    pub run_time_stats: bool,
    /// Each exiting task's records sent to user space, for pprof's thread labels (costs at
    /// each exit: only commands that write profiles, or recordings that may, ask for it).
    pub exit_log: bool,
}

/// Everything a live command works with. Dropping it detaches the programs.
pub struct Session {
    pub probe: Probe,
    /// Taken out of the probe when `Needs::spikes`.
    pub spikes: Option<SpikeReader>,
    pub log: DebugLog,
    pub kernel: KernelFacts,
    pub syms: Kallsyms,
    /// Set by SIGINT and SIGTERM.
    pub stop: Arc<AtomicBool>,
    /// Open while the kernel counts the programs' run time; closing it (at exit, in any way)
    /// restores whatever the system had before.
    pub run_time_stats: Option<OwnedFd>,
}

/// A run that passed `preflight`: the probe's settings it checked, which the session then
/// loads (made once a run).
pub struct Checked {
    config: ProbeConfig,
}

/// Everything refused before anything is created or loaded: table sizes the machine cannot
/// hold, missing privileges, a `--pid` that is no process.
pub fn preflight(cli: &Cli, needs: &Needs) -> Result<Checked> {
    let config = cli.probe_config(needs.pid, needs.details, needs.spikes);
    probe::memory::check(&config, cli.debug_mem_available)?;
    probe::check_privileges()?;
    if let Some(pid) = needs.pid {
        check_process(pid)?;
    }
    Ok(Checked { config })
}

impl Session {
    /// `preflight`, then `start_checked`.
    pub fn start(cli: &Cli, needs: Needs) -> Result<Self> {
        let checked = preflight(cli, &needs)?;
        Self::start_checked(cli, needs, checked)
    }

    /// The session of a run `preflight` passed (commands that do more between the two: open
    /// their file or port).
    pub fn start_checked(cli: &Cli, needs: Needs, checked: Checked) -> Result<Self> {
        // Created before the programs load, and removed again if they do not.
        let log = LogFile::create(cli.debug_checks, cli.log.as_deref(), needs.owns_terminal)?;
        let created = log.as_ref().and_then(LogFile::created);
        let session = Self::load(cli, needs, log, checked.config);
        if session.is_err()
            && let Some(created) = created
        {
            created.remove();
        }
        session
    }

    fn load(cli: &Cli, needs: Needs, log: Option<LogFile>, config: ProbeConfig) -> Result<Self> {
        let stop = super::stop_flag()?;
        let syms = Kallsyms::load()?;
        let mut probe = Probe::attach(ProbeConfig {
            percpu: Some(syms.percpu()),
            exits: config.exits && needs.exit_log,
            ..config
        })?;
        let spikes = if needs.spikes {
            Some(SpikeReader::take(&mut probe)?)
        } else {
            None
        };
        let log = DebugLog::start(&mut probe, cli.debug_checks, log)?;
        let kernel = probe::facts::kernel_facts(&probe);
        let run_time_stats = if needs.run_time_stats {
            aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()
        } else {
            None
        };
        Ok(Self {
            probe,
            spikes,
            log,
            kernel,
            syms,
            stop,
            run_time_stats,
        })
    }

    /// The collector that reads this session's probe (one per probe: it drains the
    /// hidden-switch log and, with `--user-stacks`, runs the thread that names user frames);
    /// `details`: with histograms and program statistics (`top`, `record`, `serve`).
    pub fn collector(&mut self, details: bool) -> Result<Collector> {
        let mut collector = if details {
            Collector::with_details()
        } else {
            Collector::new()
        };
        collector.watch_users(&mut self.probe)?;
        Ok(collector)
    }

    /// Says which variant of the programs runs and why better ones did not load; after the
    /// command's own first line, which tests and scripts wait for.
    pub fn announce(&self) {
        self.probe.announce();
    }
}

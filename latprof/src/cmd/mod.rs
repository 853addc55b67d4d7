//! Every subcommand's `run`, and the live session the commands that watch the kernel share.
//! `main.rs` parses the command line and calls one of these.
pub mod dump;
pub mod first_run;
pub mod record;
pub mod replay;
pub mod serve;
pub mod session;
pub mod spikes;
pub mod stalls;
pub mod stats;
pub mod top;

use std::sync::{Arc, atomic::AtomicBool};

use anyhow::{Context as _, Result};

use crate::cli::{Cli, Command};

/// Runs the command the user asked for.
pub fn run(cli: &Cli) -> Result<()> {
    match &cli.command {
        Command::Stats(args) => stats::run(cli, args),
        Command::Top(args) => top::run(cli, args),
        Command::Record(args) => record::run(cli, args),
        Command::Replay(args) => replay::run(cli, args),
        Command::Dump(args) => dump::run(cli, args),
        Command::Spikes(args) => spikes::run(cli, args),
        Command::Serve(args) => serve::run(cli, args),
    }
}

/// Set by SIGINT, SIGTERM and SIGHUP (the terminal went away: `top` restores it on the way
/// out). A SIGHUP ignored when latprof started (`nohup latprof record ...`) stays ignored.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM, SIGHUP] {
        if sig == SIGHUP && ignored(sig) {
            continue;
        }
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("install signal handler")?;
    }
    Ok(stop)
}

/// Whether `sig` is ignored now (inherited from whoever started latprof).
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: all-zero is a valid sigaction; a null new action only reads the current one.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `old` is a live local.
    let read = unsafe { libc::sigaction(sig, std::ptr::null(), &raw mut old) };
    read == 0 && old.sa_sigaction == libc::SIG_IGN
}

//! Every subcommand's `run`, and the live session the commands that watch the kernel share.
//! `main.rs` parses the command line and calls one of these.
pub mod dump;
pub mod record;
pub mod replay;
pub mod session;
pub mod spikes;
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
    }
}

/// Set by SIGINT and SIGTERM.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("install signal handler")?;
    }
    Ok(stop)
}

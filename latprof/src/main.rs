use std::process::ExitCode;

use clap::Parser as _;
use latprof::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Stats(args) => latprof::stats::run(&cli, args),
        Command::Top(args) => latprof::tui::run(&cli, args),
        Command::Record(args) => latprof::record::run(&cli, args),
        Command::Replay(args) => latprof::tui::replay::run(&cli, args),
        Command::Dump(args) => latprof::dump::run(&cli, args),
        Command::Spikes(args) => latprof::spikes::run(&cli, args),
        Command::Bench(args) => latprof::bench::run(args),
        Command::Workload(args) => latprof::workload::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("latprof: error: {err:#}");
            match err.downcast_ref::<latprof::Error>() {
                Some(latprof::Error::Privileges) => ExitCode::from(2),
                None => ExitCode::FAILURE,
            }
        }
    }
}

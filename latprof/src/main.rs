use std::process::ExitCode;

use clap::Parser as _;
use latprof::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match latprof::cmd::run(&cli) {
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

//! `latprof-bench`: latprof's overhead benchmark (`cargo xtask bench` runs it as root).
use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args = latprof_bench::bench::BenchArgs::parse();
    latprof_bench::exit("latprof-bench", latprof_bench::bench::run(&args))
}

//! `latprof-workload`: deterministic workloads for latprof's tests, benchmark and VM scripts.
use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args = latprof_bench::workload::WorkloadArgs::parse();
    latprof_bench::exit("latprof-workload", latprof_bench::workload::run(&args))
}

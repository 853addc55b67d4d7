//! What measures latprof and what its tests watch, kept out of the shipped binary: the overhead
//! benchmark (`latprof-bench`, run by `cargo xtask bench`) and the deterministic workloads
//! (`latprof-workload`) that the tests, the benchmark and the VM scripts spawn.
pub mod bench;
pub mod workload;

use std::{path::PathBuf, process::ExitCode};

/// The path of a binary built beside this one (same target directory and profile).
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    anyhow::ensure!(
        path.is_file(),
        "{} not found beside {}: build it first (cargo build -p {})",
        path.display(),
        me.display(),
        if name == "latprof" {
            "latprof"
        } else {
            "latprof-bench"
        }
    );
    Ok(path)
}

/// One clear line and a non-zero exit for an error, as latprof itself does.
#[must_use]
pub fn exit(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{program}: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

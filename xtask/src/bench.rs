//! `cargo xtask bench`: the overhead benchmark, with its peers installed where root may.
use anyhow::Result;

use std::process::Command;

use crate::{as_root, cargo, dist, is_root, missing_packages, root_dir, run_cmd, setup};

/// Peers the benchmark compares latprof with, from Debian.
pub(crate) const BENCH_PACKAGES: [&str; 4] = ["libbpf-tools", "bpftrace", "linux-perf", "rt-tests"];

/// `cargo xtask bench -- ARGS`: install the peers (when root), build latprof, run its benchmark
/// (as root, with sudo when not). The report lands in target/bench/bench.{md,json}.
pub(crate) fn bench(args: &[String]) -> Result<()> {
    setup()?;
    let missing = missing_packages(&BENCH_PACKAGES);
    if !missing.is_empty() {
        if is_root() {
            run_cmd(
                Command::new("apt-get")
                    .args(["install", "-y", "-q"])
                    .args(&missing),
            )?;
        } else {
            eprintln!(
                "xtask: peers not installed (the report skips them): sudo apt-get install {}",
                missing.join(" ")
            );
        }
    }
    let args = args.strip_prefix(&["--".to_owned()]).unwrap_or(args);
    // The static binary its `builds` series compares with the glibc build.
    dist::dist(&[&dist::X86_64])?;
    // The harness runs latprof and latprof-workload from beside itself.
    run_cmd(cargo().args([
        "build",
        "--release",
        "--package",
        "latprof",
        "--package",
        "latprof-bench",
    ]))?;
    let mut cmd = as_root(&root_dir().join("target/release/latprof-bench"));
    cmd.args(["--out", &root_dir().join("target/bench").to_string_lossy()])
        .args(args);
    run_cmd(&mut cmd)
}

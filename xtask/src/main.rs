//! `cargo xtask setup | run [-- ARGS] | test | mutants | bench | notices | dist | deb | image |
//! house`: latprof's developer commands, one file each (setup.rs, suite.rs, mutants.rs,
//! bench.rs, notices.rs, dist.rs, house.rs); here the command line, `run`, and the helpers they share.
//!
//! Builds with the default stable toolchain (no dependency on aya), so it can install the pinned
//! toolchains that latprof itself needs before anything else is compiled.
use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail};

mod bench;
mod circles;
mod dist;
mod house;
mod links;
mod mutants;
mod notices;
mod setup;
mod suite;

use bench::bench;
use notices::{licenses_check_bites, notices};
use setup::{STABLE, install, install_missing, missing_packages, setup, setup_for_tests};

/// Nightly for the eBPF build; its LLVM (22) must match bpf-linker's. The one pin, which
/// latprof/build.rs reads too.
const NIGHTLY: &str = include_str!("../../latprof-ebpf/NIGHTLY").trim_ascii();

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("run") => run(&args[1..]),
        Some("test") => suite::test(&args[1..]),
        Some("mutants") => mutants::mutants(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("notices") => setup_for_tests().and_then(|()| notices(true)),
        Some("dist") => dist::targets(&args[1..]).and_then(|t| dist::dist(&t)),
        Some("deb") => dist::targets(&args[1..]).and_then(|t| dist::deb(&t).map(|_| ())),
        Some("image") => dist::targets(&args[1..]).and_then(|t| dist::image(&t)),
        Some("house") => house::check(&root_dir()),
        _ => {
            eprintln!(
                "usage: cargo xtask setup | run [-- LATPROF ARGS] | test [-- TEST ARGS] | mutants [--list | --rotate | [--only TARGETS] DEFECT...] | bench [-- BENCH ARGS] | notices | dist | deb | image [--target x86_64|aarch64] | house"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn root_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

fn output(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// The git commit being built, 12 hex digits (as `latprof --version` says it).
fn revision() -> String {
    output(
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(root_dir()),
    )
    .trim()
    .to_owned()
}

fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{STABLE}")).current_dir(root_dir());
    cmd
}

/// Builds latprof (release) and returns the command that runs it: directly as root, through
/// sudo otherwise (it loads eBPF programs).
fn latprof() -> Result<Command> {
    run_cmd(cargo().args(["build", "--release", "--package", "latprof"]))?;
    Ok(as_root(&root_dir().join("target/release/latprof")))
}

/// A command that runs `bin` as root: directly when root, through sudo otherwise.
fn as_root(bin: &Path) -> Command {
    if is_root() {
        Command::new(bin)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg(bin);
        sudo
    }
}

/// `cargo xtask run -- ARGS`: build latprof (release) and run it, with sudo when not root.
fn run(args: &[String]) -> Result<()> {
    setup()?;
    let args = args.strip_prefix(&["--".to_owned()]).unwrap_or(args);
    let status = latprof()?.args(args).status().context("running latprof")?;
    if !status.success() {
        bail!("latprof exited with {status}");
    }
    Ok(())
}

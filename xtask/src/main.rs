//! `cargo xtask setup | run [-- ARGS] | test`: latprof's developer commands; house.rs checks
//! the house's plan (import floors, the README's map).
//!
//! Builds with the default stable toolchain (no dependency on aya), so it can install the pinned
//! toolchains that latprof itself needs before anything else is compiled.
use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail};

mod circles;
mod dist;
mod house;
mod links;
mod suite;

/// Nightly for the eBPF build; its LLVM (22) must match bpf-linker's. The one pin, which
/// latprof/build.rs reads too.
const NIGHTLY: &str = include_str!("../../latprof-ebpf/NIGHTLY").trim_ascii();
/// Stable for latprof itself (aya 0.16 needs >= 1.98).
const STABLE: &str = "1.99.1";
const BPF_LINKER: &str = "0.13.0";
/// cargo-deny: the license check of the test command and the third-party notices.
const CARGO_DENY: &str = "0.20.2";
/// Debian packages: LLVM 22 for bpf-linker, tmux for the terminal tests, Prometheus' Python
/// client whose OpenMetrics parser checks `--format openmetrics`, Prometheus itself (and its
/// promtool) that the serve tests run against `latprof serve`, and Go, whose `go tool pprof`
/// reads its profiles. The package may start a system Prometheus on :9090; the tests start
/// their own on a free port and never use that one. gcc and util-linux's unshare: the user
/// stack tests build a C workload and run it in a mount namespace of its own. binutils'
/// objcopy, python3 and zstd make the hardening tests' hostile binaries and recordings;
/// debootstrap the Debian 11 and 12 roots the package tests install latprof's package in.
const DEBIAN_PACKAGES: [&str; 14] = [
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "tmux",
    "python3-prometheus-client",
    "prometheus",
    "golang-go",
    "gcc",
    "util-linux",
    "binutils",
    "python3",
    "zstd",
    "debootstrap",
];

/// The runtimes the user stack tests run (tests/runtimes.rs): Node (Debian's, or a newer one
/// already installed under the same package name) and OpenJDK 17 with javac and jcmd.
const RUNTIME_PACKAGES: [&str; 2] = ["nodejs", "openjdk-17-jdk-headless"];

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("run") => run(&args[1..]),
        Some("test") => suite::test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("notices") => setup_for_tests().and_then(|()| notices(true)),
        Some("dist") => dist::targets(&args[1..]).and_then(|t| dist::dist(&t)),
        Some("deb") => dist::targets(&args[1..]).and_then(|t| dist::deb(&t).map(|_| ())),
        Some("image") => dist::targets(&args[1..]).and_then(|t| dist::image(&t)),
        Some("house") => house::check(&root_dir()),
        _ => {
            eprintln!(
                "usage: cargo xtask setup | run [-- LATPROF ARGS] | test [-- TEST ARGS] | bench [-- BENCH ARGS] | notices | dist | deb | image [--target x86_64|aarch64] | house"
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

fn toolchain_has(toolchain: &str, components: &[&str]) -> bool {
    if !succeeds(Command::new("rustup").args(["run", toolchain, "rustc", "--version"])) {
        return false;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        toolchain,
    ]));
    components
        .iter()
        .all(|c| installed.lines().any(|l| l.starts_with(c)))
}

/// The packages of `packages` that dpkg does not have installed.
fn missing_packages(packages: &[&'static str]) -> Vec<&'static str> {
    packages
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .contains("install ok installed")
        })
        .collect()
}

fn has_bpf_linker() -> bool {
    output(Command::new("bpf-linker").arg("--version")).contains(BPF_LINKER)
}

fn has_cargo_deny() -> bool {
    output(Command::new("cargo-deny").arg("--version")).contains(CARGO_DENY)
}

/// What is missing, as the commands that install it; `for_tests`: what the test command
/// needs on top (cargo-deny).
fn missing_steps(for_tests: bool) -> Vec<(String, Command)> {
    let mut steps = Vec::new();
    let mut wanted = DEBIAN_PACKAGES.to_vec();
    if for_tests {
        // What the test command's dist, deb and image steps need: installed here, after
        // `apt-get update`, on a fresh machine.
        wanted.extend(["lintian", "dpkg-dev"]);
        wanted.extend(dist::TARGETS.map(|t| t.cc_package));
        wanted.extend(RUNTIME_PACKAGES);
        wanted.extend(dist::CONTAINER_PACKAGES);
        wanted.extend(VM_PACKAGES);
    }
    let packages = missing_packages(&wanted);
    if !packages.is_empty() {
        let mut update = Command::new("apt-get");
        update.args(["update", "-q"]);
        steps.push(("apt-get update".to_owned(), update));
        let mut install = Command::new("apt-get");
        install
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive");
        steps.push((
            format!("apt-get install -y {}", packages.join(" ")),
            install,
        ));
    }
    // rust-src to build core for BPF; clippy to lint the eBPF crate.
    if !toolchain_has(NIGHTLY, &["rust-src", "clippy"]) {
        let mut cmd = Command::new("rustup");
        cmd.args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src,clippy",
        ]);
        steps.push((
            format!(
                "rustup toolchain install {NIGHTLY} --profile minimal --component rust-src,clippy"
            ),
            cmd,
        ));
    }
    if !toolchain_has(STABLE, &["clippy", "rustfmt"]) {
        let mut cmd = Command::new("rustup");
        cmd.args([
            "toolchain",
            "install",
            STABLE,
            "--profile",
            "minimal",
            "--component",
            "clippy,rustfmt",
        ]);
        steps.push((
            format!(
                "rustup toolchain install {STABLE} --profile minimal --component clippy,rustfmt"
            ),
            cmd,
        ));
    }
    if !has_bpf_linker() {
        let mut cmd = Command::new("cargo");
        cmd.args([
            &format!("+{STABLE}"),
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER,
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ])
        .env("LLVM_PREFIX", "/usr/lib/llvm-22");
        steps.push((
            format!(
                "LLVM_PREFIX=/usr/lib/llvm-22 cargo +{STABLE} install bpf-linker --version {BPF_LINKER} --locked --no-default-features --features llvm-22"
            ),
            cmd,
        ));
    }
    if for_tests {
        for target in dist::TARGETS {
            steps.extend(target.steps());
        }
    }
    if for_tests && !has_cargo_deny() {
        let mut cmd = Command::new("cargo");
        cmd.args([
            &format!("+{STABLE}"),
            "install",
            "cargo-deny",
            "--version",
            CARGO_DENY,
            "--locked",
        ]);
        steps.push((
            format!("cargo +{STABLE} install cargo-deny --version {CARGO_DENY} --locked"),
            cmd,
        ));
    }
    steps
}

/// The Debian packages of `packages` not installed yet, installed (`install`: or the command
/// to run, without root).
fn install_missing(packages: &[&'static str]) -> Result<()> {
    let missing = missing_packages(packages);
    if missing.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    install(vec![(
        format!("apt-get install -y {}", missing.join(" ")),
        cmd,
    )])
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

/// What `../shared/vm/run.sh` and tests/vm/arm64.sh boot their guests with (they install
/// them where they are missing, but the VM tests boot several guests at once, and their
/// installs then race for apt's lock: a fresh machine's first suite failed on it): qemu for
/// both architectures, the initramfs' cpio, the x86 guests' busybox, the scratch disk's
/// mke2fs, `file`, kmod's depmod and xz, which order and unpack the arm64 kernel's modules, and
/// the arm64 C library the arm64 guests' C server is linked with (static).
const VM_PACKAGES: [&str; 9] = [
    "qemu-system-x86",
    "qemu-system-arm",
    "cpio",
    "busybox-static",
    "e2fsprogs",
    "file",
    "kmod",
    "xz-utils",
    "libc6-dev-arm64-cross",
];

/// Installs whatever is missing; idempotent. Without root (for apt) or off Debian it prints the
/// exact commands instead and fails.
fn setup() -> Result<()> {
    install(missing_steps(false))
}

/// `setup`, and what the tests need on top.
fn setup_for_tests() -> Result<()> {
    install(missing_steps(true))
}

fn install(steps: Vec<(String, Command)>) -> Result<()> {
    if steps.is_empty() {
        eprintln!("xtask: setup: everything is installed");
        return Ok(());
    }
    let needs_apt = steps.iter().any(|(text, _)| text.starts_with("apt-get"));
    let debian = Path::new("/etc/debian_version").exists();
    if needs_apt && (!is_root() || !debian) {
        eprintln!(
            "xtask: setup needs {} to install packages. Run these, then try again:",
            if debian { "root" } else { "Debian" }
        );
        for (text, _) in &steps {
            let sudo = if text.starts_with("apt-get") {
                "sudo "
            } else {
                ""
            };
            eprintln!("    {sudo}{text}");
        }
        bail!("prerequisites missing");
    }
    for (_, mut cmd) in steps {
        run_cmd(&mut cmd)?;
    }
    Ok(())
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

/// Peers the benchmark compares latprof with, from Debian.
const BENCH_PACKAGES: [&str; 4] = ["libbpf-tools", "bpftrace", "linux-perf", "rt-tests"];

/// `cargo xtask bench -- ARGS`: install the peers (when root), build latprof, run its benchmark
/// (as root, with sudo when not). The report lands in target/bench/bench.{md,json}.
fn bench(args: &[String]) -> Result<()> {
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

/// The license check can fail: with the Apache and BSD licenses taken off the allowed list,
/// cargo-deny must refuse the dependencies that have only those.
fn licenses_check_bites() -> Result<()> {
    let allowed = std::fs::read_to_string(root_dir().join("deny.toml")).context("deny.toml")?;
    let narrowed = allowed
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("\"Apache") && !l.starts_with("\"BSD")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = root_dir().join("target/deny-narrowed.toml");
    std::fs::create_dir_all(root_dir().join("target"))?;
    std::fs::write(&path, narrowed)?;
    let refused = !Command::new("cargo-deny")
        .args(["--all-features", "--config"])
        .arg(&path)
        .args(["check", "licenses"])
        .current_dir(root_dir())
        .output()
        .context("running cargo-deny")?
        .status
        .success();
    if !refused {
        bail!(
            "the license check passed with Apache-2.0 and BSD licenses not allowed: it checks nothing"
        );
    }
    eprintln!("xtask: the license check refuses what deny.toml does not allow");
    Ok(())
}

/// The third-party notices: every crate latprof builds with (the eBPF object's included),
/// by license, as `cargo deny list` reads them from Cargo's metadata. `write`: (re)writes
/// THIRD-PARTY-NOTICES (`cargo xtask notices`); otherwise fails when the file is not current.
fn notices(write: bool) -> Result<()> {
    let path = root_dir().join("THIRD-PARTY-NOTICES");
    let listed = Command::new("cargo-deny")
        .args([
            "--all-features",
            "list",
            "--layout",
            "license",
            "--format",
            "human",
        ])
        .current_dir(root_dir())
        .output()
        .context("running cargo-deny (cargo xtask setup installs it)")?;
    if !listed.status.success() {
        bail!(
            "cargo deny list failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let text = format!(
        "Third-party software in latprof\n\
         \n\
         latprof (the binary, and the eBPF object embedded in it) is built from these crates,\n\
         listed by license as their Cargo metadata declares it (made by `cargo xtask notices`\n\
         with cargo-deny {CARGO_DENY}; `cargo xtask test` checks that it is current and that every\n\
         license is on the list allowed in deny.toml). Each crate's license text ships in its\n\
         source on crates.io.\n\
         \n{}",
        strip_ansi(&String::from_utf8_lossy(&listed.stdout))
    );
    if write {
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: wrote {}", path.display());
        return Ok(());
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != text {
        bail!(
            "{} is not current (a dependency or its license changed): run `cargo xtask notices` and commit it",
            path.display()
        );
    }
    Ok(())
}

/// `text` without terminal color sequences.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

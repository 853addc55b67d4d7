//! `cargo xtask setup`: the toolchains, bpf-linker, cargo-deny and the Debian packages latprof
//! and its tests need, each installed where it is missing, or, without root, the exact
//! commands printed instead.
use std::{path::Path, process::Command};

use anyhow::{Result, bail};

use crate::{NIGHTLY, dist, is_root, output, run_cmd, succeeds};

/// Stable for latprof itself (aya 0.16 needs >= 1.98).
pub(crate) const STABLE: &str = "1.99.1";

pub(crate) const BPF_LINKER: &str = "0.13.0";

/// cargo-deny: the license check of the test command and the third-party notices.
pub(crate) const CARGO_DENY: &str = "0.20.2";

/// Debian packages: LLVM 22 for bpf-linker, tmux for the terminal tests, Prometheus' Python
/// client whose OpenMetrics parser checks `--format openmetrics`, Prometheus itself (and its
/// promtool) that the serve tests run against `latprof serve`, and Go, whose `go tool pprof`
/// reads its profiles. The package may start a system Prometheus on :9090; the tests start
/// their own on a free port and never use that one. gcc and util-linux's unshare: the user
/// stack tests build a C workload and run it in a mount namespace of its own. binutils'
/// objcopy, python3 and zstd make the hardening tests' hostile binaries and recordings;
/// debootstrap the Debian 11 and 12 roots the package tests install latprof's package in.
pub(crate) const DEBIAN_PACKAGES: [&str; 14] = [
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
pub(crate) const RUNTIME_PACKAGES: [&str; 2] = ["nodejs", "openjdk-17-jdk-headless"];

pub(crate) fn toolchain_has(toolchain: &str, components: &[&str]) -> bool {
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
pub(crate) fn missing_packages(packages: &[&'static str]) -> Vec<&'static str> {
    packages
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .contains("install ok installed")
        })
        .collect()
}

pub(crate) fn has_bpf_linker() -> bool {
    output(Command::new("bpf-linker").arg("--version")).contains(BPF_LINKER)
}

pub(crate) fn has_cargo_deny() -> bool {
    output(Command::new("cargo-deny").arg("--version")).contains(CARGO_DENY)
}

/// What is missing, as the commands that install it; `for_tests`: what the test command
/// needs on top (cargo-deny).
pub(crate) fn missing_steps(for_tests: bool) -> Vec<(String, Command)> {
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
pub(crate) fn install_missing(packages: &[&'static str]) -> Result<()> {
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

/// What `../shared/vm/run.sh` and tests/vm/arm64.sh boot their guests with (they install
/// them where they are missing, but the VM tests boot several guests at once, and their
/// installs then race for apt's lock: a fresh machine's first suite failed on it): qemu for
/// both architectures, the initramfs' cpio, the x86 guests' busybox, the scratch disk's
/// mke2fs, `file`, kmod's depmod and xz, which order and unpack the arm64 kernel's modules, and
/// the arm64 C library the arm64 guests' C server is linked with (static).
pub(crate) const VM_PACKAGES: [&str; 9] = [
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
pub(crate) fn setup() -> Result<()> {
    install(missing_steps(false))
}

/// `setup`, and what the tests need on top.
pub(crate) fn setup_for_tests() -> Result<()> {
    install(missing_steps(true))
}

pub(crate) fn install(steps: Vec<(String, Command)>) -> Result<()> {
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

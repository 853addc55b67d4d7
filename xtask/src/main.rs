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

mod house;
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
        Some("dist") => dist(),
        Some("deb") => deb().map(|_| ()),
        Some("image") => image(),
        Some("house") => house::check(&root_dir()),
        _ => {
            eprintln!(
                "usage: cargo xtask setup | run [-- LATPROF ARGS] | test [-- TEST ARGS] | bench [-- BENCH ARGS] | notices | dist | deb | image | house"
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
        wanted.extend(["musl-tools", "lintian", "dpkg-dev"]);
        wanted.extend(RUNTIME_PACKAGES);
        wanted.extend(CONTAINER_PACKAGES);
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
        steps.extend(musl_steps());
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

/// The static binary's target: x86-64 Linux with musl, no dynamic libc.
const MUSL: &str = "x86_64-unknown-linux-musl";

/// What building the static binary needs: Debian's musl-tools (musl-gcc, for the C in zstd)
/// and the Rust target.
fn musl_steps() -> Vec<(String, Command)> {
    let mut steps = Vec::new();
    if !missing_packages(&["musl-tools"]).is_empty() {
        let mut install = Command::new("apt-get");
        install
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "musl-tools",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive");
        steps.push(("apt-get install -y musl-tools".to_owned(), install));
    }
    let installed = output(Command::new("rustup").args([
        "target",
        "list",
        "--installed",
        "--toolchain",
        STABLE,
    ]));
    if !installed.lines().any(|l| l.trim() == MUSL) {
        let mut cmd = Command::new("rustup");
        cmd.args(["target", "add", "--toolchain", STABLE, MUSL]);
        steps.push((
            format!("rustup target add --toolchain {STABLE} {MUSL}"),
            cmd,
        ));
    }
    steps
}

/// `cargo xtask dist`: one static x86-64 binary (musl, the eBPF object embedded) in
/// target/dist/latprof, and the tests' workload beside it in target/dist/test/ (the VM checks
/// run both, with no library copied into the guest). Fails if either links anything
/// dynamically.
fn dist() -> Result<()> {
    setup()?;
    install(musl_steps())?;
    run_cmd(
        cargo()
            .args([
                "build",
                "--release",
                "--target",
                MUSL,
                "--package",
                "latprof",
                "--package",
                "latprof-bench",
            ])
            // Target filters apply to every package named: each binary is named.
            .args(["--bin", "latprof", "--bin", "latprof-workload"])
            .env("CC_x86_64_unknown_linux_musl", "musl-gcc"),
    )?;
    let built = root_dir().join("target").join(MUSL).join("release");
    let dist = root_dir().join("target/dist");
    std::fs::create_dir_all(dist.join("test"))?;
    for (name, to) in [
        ("latprof", dist.join("latprof")),
        ("latprof-workload", dist.join("test/latprof-workload")),
    ] {
        let from = built.join(name);
        // A new inode: a running copy (a test's) keeps its own.
        let _ = std::fs::remove_file(&to);
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        let ldd = Command::new("ldd")
            .arg(&to)
            .output()
            .context("running ldd")?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&ldd.stdout),
            String::from_utf8_lossy(&ldd.stderr)
        );
        if !said.contains("statically linked") && !said.contains("not a dynamic executable") {
            bail!("{} links dynamically: {said}", to.display());
        }
        eprintln!("xtask: {} ({})", to.display(), said.trim());
    }
    Ok(())
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

/// `cargo xtask image`: the container image of the static binary
/// (contrib/container/Containerfile, `FROM scratch`), built offline with podman as
/// localhost/latprof:VERSION, and saved as target/dist/latprof-VERSION.oci.tar for
/// `podman load` (or `docker load`).
fn image() -> Result<()> {
    dist()?;
    install_missing(&CONTAINER_PACKAGES)?;
    let context = root_dir().join("target/image");
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(&context)?;
    for (from, name) in [
        ("target/dist/latprof", "latprof"),
        ("LICENSE-MIT", "LICENSE-MIT"),
        ("LICENSE-APACHE", "LICENSE-APACHE"),
        ("latprof-ebpf/LICENSE-GPL-2.0", "LICENSE-GPL-2.0"),
        ("THIRD-PARTY-NOTICES", "THIRD-PARTY-NOTICES"),
    ] {
        let from = root_dir().join(from);
        std::fs::copy(&from, context.join(name))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    let version = env!("CARGO_PKG_VERSION");
    let revision = revision();
    let tag = format!("localhost/latprof:{version}");
    // Offline: FROM scratch pulls nothing, and the build runs nothing.
    run_cmd(
        Command::new("podman")
            .args(["build", "--network=none", "--pull=never", "--quiet"])
            .arg(format!("--build-arg=VERSION={version}"))
            .arg(format!("--build-arg=REVISION={revision}"))
            .args(["--tag", &tag, "--file"])
            .arg(root_dir().join("contrib/container/Containerfile"))
            .arg(&context),
    )?;
    let archive = root_dir().join(format!("target/dist/latprof-{version}.oci.tar"));
    let _ = std::fs::remove_file(&archive);
    run_cmd(
        Command::new("podman")
            .args(["save", "--quiet", "--format", "oci-archive", "--output"])
            .arg(&archive)
            .arg(&tag),
    )?;
    eprintln!("xtask: image {tag}, saved as {}", archive.display());
    Ok(())
}

/// What `cargo xtask image` builds and the container test runs the image with: podman, runc
/// (crun refuses a host whose cgroups are hybrid, v1 controllers beside cgroup2), and the
/// pod network the test gives the DaemonSet's container: podman's bridge network, whose CNI
/// plugins set its firewall rules with iptables.
const CONTAINER_PACKAGES: [&str; 4] = ["podman", "runc", "containernetworking-plugins", "iptables"];

/// What `../shared/vm/run.sh` boots its guests with (it installs them where they are missing,
/// but the VM tests boot several guests at once, and their installs then race for apt's
/// lock: a fresh machine's first suite failed on it).
const VM_PACKAGES: [&str; 5] = [
    "qemu-system-x86",
    "cpio",
    "busybox-static",
    "e2fsprogs",
    "file",
];

/// `cargo xtask deb`: the Debian package of the static binary, target/dist/latprof_VERSION_amd64.deb:
/// /usr/bin/latprof, man pages and bash/zsh/fish completions made from the command line
/// (latprof-docs), the systemd unit (installed, not enabled), README, licenses and notices;
/// then lintian, which must find no error. Returns the package's path.
#[expect(
    clippy::too_many_lines,
    reason = "the Debian package's steps in the order dpkg-deb and lintian need them"
)]
fn deb() -> Result<PathBuf> {
    dist()?;
    install_missing(&["lintian", "dpkg-dev"])?;
    // The debug build: the tests build the same crates so (a release build of them all, only
    // to write man pages, cost minutes of every test run).
    run_cmd(cargo().args([
        "build",
        "--package",
        "latprof-bench",
        "--bin",
        "latprof-docs",
    ]))?;
    let work = root_dir().join("target/deb");
    let _ = std::fs::remove_dir_all(&work);
    let generated = work.join("generated");
    run_cmd(Command::new(root_dir().join("target/debug/latprof-docs")).arg(&generated))?;
    let root = work.join("root");
    let version = env!("CARGO_PKG_VERSION");
    let revision = revision();
    let put = |to: &str, bytes: &[u8], mode: u32| -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let path = root.join(to);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    let gz = |bytes: &[u8]| -> Result<Vec<u8>> {
        let mut child = Command::new("gzip")
            .args(["-9", "-n", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("gzip")?;
        std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, bytes)?;
        let out = child.wait_with_output()?;
        Ok(out.stdout)
    };
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    put(
        "usr/bin/latprof",
        &read(&root_dir().join("target/dist/latprof"))?,
        0o755,
    )?;
    // As Debian ships binaries: without symbols (the build id stays).
    run_cmd(
        Command::new("strip")
            .args(["--strip-unneeded", "--remove-section=.comment"])
            .arg(root.join("usr/bin/latprof")),
    )?;
    for entry in std::fs::read_dir(generated.join("man"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        put(
            &format!("usr/share/man/man1/{name}.gz"),
            &gz(&read(&entry.path())?)?,
            0o644,
        )?;
    }
    let completions = generated.join("completions");
    for (from, to) in [
        (
            "latprof.bash",
            "usr/share/bash-completion/completions/latprof",
        ),
        ("_latprof", "usr/share/zsh/vendor-completions/_latprof"),
        (
            "latprof.fish",
            "usr/share/fish/vendor_completions.d/latprof.fish",
        ),
    ] {
        put(to, &read(&completions.join(from))?, 0o644)?;
    }
    let unit = std::fs::read_to_string(root_dir().join("contrib/latprof.service"))?
        .replace("/usr/local/bin/latprof", "/usr/bin/latprof");
    put("lib/systemd/system/latprof.service", unit.as_bytes(), 0o644)?;
    let debian = root_dir().join("contrib/debian");
    let doc = "usr/share/doc/latprof";
    put(
        &format!("{doc}/copyright"),
        &read(&debian.join("copyright"))?,
        0o644,
    )?;
    let date = output(Command::new("date").args(["-R", "-u"]));
    let changelog = std::fs::read_to_string(debian.join("changelog"))?
        .replace("@VERSION@", version)
        .replace("@REVISION@", &revision)
        .replace("@DATE@", date.trim());
    put(
        &format!("{doc}/changelog.gz"),
        &gz(changelog.as_bytes())?,
        0o644,
    )?;
    for file in ["README.md", "THIRD-PARTY-NOTICES"] {
        put(
            &format!("{doc}/{file}.gz"),
            &gz(&read(&root_dir().join(file))?)?,
            0o644,
        )?;
    }
    put(
        "usr/share/lintian/overrides/latprof",
        &read(&debian.join("lintian-overrides"))?,
        0o644,
    )?;
    // The control file, with the installed size in KiB, and the files' sums.
    let size_kib = output(Command::new("du").args(["-sk"]).arg(&root));
    let size_kib = size_kib.split_whitespace().next().unwrap_or("0");
    let control = std::fs::read_to_string(debian.join("control"))?
        .replace("@VERSION@", version)
        .replace("@SIZE@", size_kib);
    put("DEBIAN/control", control.as_bytes(), 0o644)?;
    let sums = output(
        Command::new("sh")
            .arg("-c")
            .arg("find usr lib -type f | LC_ALL=C sort | xargs md5sum")
            .current_dir(&root),
    );
    put("DEBIAN/md5sums", sums.as_bytes(), 0o644)?;
    let deb = root_dir().join(format!("target/dist/latprof_{version}_amd64.deb"));
    run_cmd(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&root)
            .arg(&deb),
    )?;
    run_cmd(
        Command::new("lintian")
            .args(["--fail-on", "error"])
            .arg(&deb),
    )?;
    eprintln!("xtask: {} (lintian: no errors)", deb.display());
    Ok(deb)
}

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
    dist()?;
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

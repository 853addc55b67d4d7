//! `cargo xtask dist | deb | image`: what users install, for each architecture latprof ships
//! (x86-64 and arm64): the static binaries, the Debian packages and the container image index.
//!
//! Both binaries are built on this x86-64 machine, static with musl. Rust's musl targets carry
//! their own C library and start files, so what the cross build needs from outside is a C
//! compiler for zstd's C and a linker: Debian's `musl-gcc` (musl-tools) for x86-64 and Debian's
//! `gcc-aarch64-linux-gnu` for arm64. The latter is a glibc cross compiler, but zstd's C uses
//! only the freestanding parts of the C library's headers, and the link takes musl's own libc.a
//! and crt files from the Rust target (self-contained), so nothing of glibc ends up in the
//! binary (`file`: statically linked). Chosen over cargo-zigbuild (a Python wheel of zig
//! outside Debian's archive) and rust-lld alone (which would still need a C compiler for zstd):
//! every piece comes from apt, as the rest of the toolchain does.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    STABLE, cargo, install, install_missing, missing_packages, output, revision, root_dir, run_cmd,
    setup,
};

/// One architecture latprof ships for.
pub(crate) struct Target {
    /// As `--target` names it, and the folder under target/dist (x86-64's is target/dist
    /// itself).
    pub(crate) name: &'static str,
    triple: &'static str,
    /// Debian's name for it (the package's Architecture) and the OCI platform's.
    deb_arch: &'static str,
    /// What the package's description says it runs on.
    cpu: &'static str,
    /// The C compiler for zstd, and the Debian package that has it.
    cc: &'static str,
    pub(crate) cc_package: &'static str,
    /// The linker, where rustc's default (`cc`, this machine's) cannot link for it. The x86-64
    /// link keeps it: musl-gcc as the linker would make a dynamic executable of it.
    linker: Option<&'static str>,
    strip: &'static str,
    /// What `file` says of a binary for it.
    file_says: &'static str,
}

pub(crate) const X86_64: Target = Target {
    name: "x86_64",
    triple: "x86_64-unknown-linux-musl",
    deb_arch: "amd64",
    cpu: "x86-64",
    cc: "musl-gcc",
    cc_package: "musl-tools",
    linker: None,
    strip: "strip",
    file_says: "x86-64",
};

pub(crate) const AARCH64: Target = Target {
    name: "aarch64",
    triple: "aarch64-unknown-linux-musl",
    deb_arch: "arm64",
    cpu: "arm64 (AArch64)",
    cc: "aarch64-linux-gnu-gcc",
    cc_package: "gcc-aarch64-linux-gnu",
    linker: Some("aarch64-linux-gnu-gcc"),
    strip: "aarch64-linux-gnu-strip",
    file_says: "ARM aarch64",
};

pub(crate) const TARGETS: [&Target; 2] = [&X86_64, &AARCH64];

impl Target {
    /// Where `dist` puts its binaries: target/dist for x86-64 (what the x86 tests run),
    /// target/dist/NAME for the others.
    pub(crate) fn dist_dir(&self) -> PathBuf {
        let dist = root_dir().join("target/dist");
        if self.name == X86_64.name {
            dist
        } else {
            dist.join(self.name)
        }
    }

    /// What building for it needs: the C compiler's Debian package and the Rust target.
    pub(crate) fn steps(&self) -> Vec<(String, Command)> {
        let mut steps = Vec::new();
        if !missing_packages(&[self.cc_package]).is_empty() {
            let mut install = Command::new("apt-get");
            install
                .args([
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    self.cc_package,
                ])
                .env("DEBIAN_FRONTEND", "noninteractive");
            steps.push((format!("apt-get install -y {}", self.cc_package), install));
        }
        let installed = output(Command::new("rustup").args([
            "target",
            "list",
            "--installed",
            "--toolchain",
            STABLE,
        ]));
        if !installed.lines().any(|l| l.trim() == self.triple) {
            let mut cmd = Command::new("rustup");
            cmd.args(["target", "add", "--toolchain", STABLE, self.triple]);
            steps.push((
                format!("rustup target add --toolchain {STABLE} {}", self.triple),
                cmd,
            ));
        }
        steps
    }
}

/// The targets `--target NAME` picks (all when absent).
pub(crate) fn targets(args: &[String]) -> Result<Vec<&'static Target>> {
    match args {
        [] => Ok(TARGETS.to_vec()),
        [flag, name] if flag == "--target" => TARGETS
            .iter()
            .find(|t| t.name == name.as_str())
            .map(|t| vec![*t])
            .with_context(|| format!("no target {name:?} (x86_64, aarch64)")),
        _ => bail!("usage: cargo xtask dist|deb|image [--target x86_64|aarch64]"),
    }
}

/// `cargo xtask dist [--target x86_64|aarch64]`: for each target, one static binary (musl,
/// the eBPF object for that architecture embedded) in its dist folder (`Target::dist_dir`),
/// and the tests' workload beside it in test/ (the VM checks run both, with no library
/// copied into the guest). Fails if `file` does not say statically linked for the target's
/// machine.
pub(crate) fn dist(targets: &[&Target]) -> Result<()> {
    setup()?;
    for target in targets {
        install(target.steps())?;
        let env_name = |prefix: &str| format!("{prefix}{}", target.triple.replace('-', "_"));
        let mut build = cargo();
        if let Some(linker) = target.linker {
            build.env(env_name("CARGO_TARGET_").to_uppercase() + "_LINKER", linker);
        }
        run_cmd(
            build
                .args([
                    "build",
                    "--release",
                    "--target",
                    target.triple,
                    "--package",
                    "latprof",
                    "--package",
                    "latprof-bench",
                ])
                // Target filters apply to every package named: each binary is named.
                .args(["--bin", "latprof", "--bin", "latprof-workload"])
                .env(env_name("CC_"), target.cc),
        )?;
        let built = root_dir()
            .join("target")
            .join(target.triple)
            .join("release");
        let dist = target.dist_dir();
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
            let said = output(Command::new("file").arg("-b").arg(&to));
            let linked = said.contains("statically linked") || said.contains("static-pie linked");
            if !said.contains(target.file_says) || !linked {
                bail!(
                    "{} is not a static {} executable: {said}",
                    to.display(),
                    target.name
                );
            }
            eprintln!("xtask: {} ({})", to.display(), said.trim());
        }
    }
    Ok(())
}

/// `cargo xtask image [--target x86_64|aarch64]`: the container image of each target's static
/// binary (contrib/container/Containerfile, `FROM scratch`, built offline with podman for that
/// platform as localhost/latprof:VERSION-ARCH: only COPY steps, so no emulator runs), and the
/// OCI image index localhost/latprof:VERSION (`podman manifest`) naming them by platform, so one
/// name runs on x86-64 and arm64 nodes alike (the DaemonSet's); saved with both images as
/// target/dist/latprof-VERSION.oci.tar (`podman load`, `skopeo copy oci-archive:...`).
pub(crate) fn image(targets: &[&Target]) -> Result<()> {
    dist(targets)?;
    install_missing(&CONTAINER_PACKAGES)?;
    let version = env!("CARGO_PKG_VERSION");
    let revision = revision();
    let index = format!("localhost/latprof:{version}");
    // A name holds either an image or an index: whatever this name held before goes.
    let _ = output(Command::new("podman").args(["manifest", "rm", &index]));
    let _ = output(Command::new("podman").args(["rmi", "--force", &index]));
    run_cmd(Command::new("podman").args(["manifest", "create", &index]))?;
    for target in targets {
        let context = root_dir().join("target/image").join(target.name);
        let _ = std::fs::remove_dir_all(&context);
        std::fs::create_dir_all(&context)?;
        let binary = target.dist_dir().join("latprof");
        for (from, name) in [
            (binary.as_path(), "latprof"),
            (&root_dir().join("LICENSE-MIT"), "LICENSE-MIT"),
            (&root_dir().join("LICENSE-APACHE"), "LICENSE-APACHE"),
            (
                &root_dir().join("latprof-ebpf/LICENSE-GPL-2.0"),
                "LICENSE-GPL-2.0",
            ),
            (
                &root_dir().join("THIRD-PARTY-NOTICES"),
                "THIRD-PARTY-NOTICES",
            ),
        ] {
            std::fs::copy(from, context.join(name))
                .with_context(|| format!("copying {}", from.display()))?;
        }
        let tag = format!("{index}-{}", target.deb_arch);
        // Offline: FROM scratch pulls nothing, and the build runs nothing.
        run_cmd(
            Command::new("podman")
                .args(["build", "--network=none", "--pull=never", "--quiet"])
                .arg(format!("--platform=linux/{}", target.deb_arch))
                .arg(format!("--build-arg=VERSION={version}"))
                .arg(format!("--build-arg=REVISION={revision}"))
                .args(["--tag", &tag, "--file"])
                .arg(root_dir().join("contrib/container/Containerfile"))
                .arg(&context),
        )?;
        run_cmd(Command::new("podman").args([
            "manifest",
            "add",
            &index,
            &format!("containers-storage:{tag}"),
        ]))?;
    }
    let archive = root_dir().join(format!("target/dist/latprof-{version}.oci.tar"));
    let _ = std::fs::remove_file(&archive);
    run_cmd(
        Command::new("podman")
            .args(["manifest", "push", "--quiet", "--all", &index])
            .arg(format!("oci-archive:{}", archive.display())),
    )?;
    eprintln!("xtask: image index {index}, saved as {}", archive.display());
    Ok(())
}

/// What `cargo xtask image` builds and the container test runs the image with: podman, runc
/// (crun refuses a host whose cgroups are hybrid, v1 controllers beside cgroup2), and the
/// pod network the test gives the DaemonSet's container: podman's bridge network, whose CNI
/// plugins set its firewall rules with iptables.
pub(crate) const CONTAINER_PACKAGES: [&str; 4] =
    ["podman", "runc", "containernetworking-plugins", "iptables"];

/// `cargo xtask deb [--target x86_64|aarch64]`: the Debian package of each target's static
/// binary, target/dist/latprof_VERSION_ARCH.deb (amd64, arm64): /usr/bin/latprof, man pages and
/// bash/zsh/fish completions made from the command line (latprof-docs), the systemd unit
/// (installed, not enabled), README, licenses and notices; then lintian, which must find no
/// error. Returns the packages' paths.
pub(crate) fn deb(targets: &[&Target]) -> Result<Vec<PathBuf>> {
    dist(targets)?;
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
    let generated = root_dir().join("target/deb/generated");
    let _ = std::fs::remove_dir_all(&generated);
    run_cmd(Command::new(root_dir().join("target/debug/latprof-docs")).arg(&generated))?;
    targets
        .iter()
        .map(|target| deb_of(target, &generated))
        .collect()
}

/// The package of one target, with the pages and completions in `generated`.
#[expect(
    clippy::too_many_lines,
    reason = "the Debian package's steps in the order dpkg-deb and lintian need them"
)]
fn deb_of(target: &Target, generated: &Path) -> Result<PathBuf> {
    let work = root_dir().join("target/deb").join(target.deb_arch);
    let _ = std::fs::remove_dir_all(&work);
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
        &read(&target.dist_dir().join("latprof"))?,
        0o755,
    )?;
    // As Debian ships binaries: without symbols (the build id stays).
    run_cmd(
        Command::new(target.strip)
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
        .replace("@SIZE@", size_kib)
        .replace("@ARCH@", target.deb_arch)
        .replace("@CPU@", target.cpu);
    put("DEBIAN/control", control.as_bytes(), 0o644)?;
    let sums = output(
        Command::new("sh")
            .arg("-c")
            .arg("find usr lib -type f | LC_ALL=C sort | xargs md5sum")
            .current_dir(&root),
    );
    put("DEBIAN/md5sums", sums.as_bytes(), 0o644)?;
    let deb = root_dir().join(format!(
        "target/dist/latprof_{version}_{}.deb",
        target.deb_arch
    ));
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

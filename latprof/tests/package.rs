//! The Debian package where users are: minimal Debian 11 (bullseye) and Debian 12 (bookworm)
//! roots, bootstrapped from Debian's archive with debootstrap (kept in
//! /var/cache/latprof-tests/roots between runs), each install it with `dpkg -i`, run
//! `latprof --version`, find its man page with `man -w`, count a workload's sleeps exactly
//! with the installed latprof, and purge it, leaving none of its files.
//!
//! Needs root, debootstrap and the package (`cargo xtask deb`; `cargo xtask test` builds both
//! and runs this).
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

mod common;

use common::roots;

/// The package `cargo xtask deb` made (`LATPROF_DEB` names another).
fn package() -> PathBuf {
    let deb = std::env::var_os("LATPROF_DEB").map_or_else(
        || {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/dist"))
                .join(format!("latprof_{}_amd64.deb", env!("CARGO_PKG_VERSION")))
        },
        PathBuf::from,
    );
    assert!(
        deb.is_file(),
        "{} is missing: `cargo xtask deb` builds it (`cargo xtask test` does)",
        deb.display()
    );
    deb
}

/// A copy of `suite`'s root for one run (the kept one stays as bootstrapped).
fn fresh_root(suite: &str, dir: &Path) -> PathBuf {
    let root = dir.join(suite);
    let status = Command::new("cp")
        .arg("-a")
        .arg(roots::bootstrapped(suite, suite, &["man-db"]))
        .arg(&root)
        .status()
        .expect("cp");
    assert!(status.success(), "copying the {suite} root");
    root
}

/// Runs `command` in `root`; it must succeed. Returns its stdout.
fn run_in(root: &Path, command: &[&str]) -> String {
    let out = roots::in_root(root, command)
        .output()
        .expect("run in the root");
    assert!(
        out.status.success(),
        "{command:?} in {}: {}\n{}",
        root.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn installs_runs_and_purges(suite: &str) {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let dir = common::TempDir::new(&format!("package-{suite}"));
    let root = fresh_root(suite, &dir.0);
    std::fs::copy(package(), root.join("tmp/latprof.deb")).expect("copy the package in");
    run_in(&root, &["dpkg", "-i", "/tmp/latprof.deb"]);
    let files = run_in(&root, &["dpkg", "-L", "latprof"]);

    let version = run_in(&root, &["latprof", "--version"]);
    assert!(
        version.starts_with(&format!("latprof {} (", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let page = run_in(&root, &["man", "-w", "latprof"]);
    assert_eq!(page.trim(), "/usr/share/man/man1/latprof.1.gz");
    let page = run_in(&root, &["man", "-w", "latprof-stats"]);
    assert_eq!(page.trim(), "/usr/share/man/man1/latprof-stats.1.gz");

    // The installed latprof counts a workload on the host (one pid namespace) exactly:
    // every sleep, however long a loaded machine makes it.
    let run = common::count_nanosleeps("100", "2ms", |pid| {
        roots::in_root(
            &root,
            &[
                "latprof",
                "stats",
                "--all-sleeps",
                "--pid",
                pid,
                "--format",
                "json",
            ],
        )
    });
    if let Err(why) = common::exact_count(run.counted, run.slept, run.missing) {
        panic!("{suite}: {why}\n{}", run.stderr);
    }

    run_in(&root, &["dpkg", "--purge", "latprof"]);
    let left: Vec<&str> = files
        .lines()
        .filter(|f| {
            let path = root.join(f.trim_start_matches('/'));
            // Directories the system had before stay (/lib is a link to one there); the
            // package's files must all go.
            path.metadata().is_ok_and(|m| !m.is_dir())
        })
        .collect();
    assert!(left.is_empty(), "{suite}: left after purge: {left:?}");
    let status = roots::in_root(&root, &["dpkg", "-s", "latprof"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "{suite}: dpkg still knows latprof");
}

#[test]
#[ignore = "needs root and debootstrap: run `cargo xtask test`"]
fn debian_11_installs_runs_and_purges() {
    installs_runs_and_purges("bullseye");
}

#[test]
#[ignore = "needs root and debootstrap: run `cargo xtask test`"]
fn debian_12_installs_runs_and_purges() {
    installs_runs_and_purges("bookworm");
}

/// The arm64 package beside it (`cargo xtask deb` builds both; lintian checked each there):
/// the same files, `Architecture: arm64`, and /usr/bin/latprof an AArch64 binary (the ELF
/// header's machine 0xb7), static, so it installs and runs on any arm64 Debian.
#[test]
#[ignore = "needs the packages: run `cargo xtask test`"]
fn the_arm64_package_holds_the_arm64_binary_and_the_same_files() {
    let amd64 = package();
    let arm64 = amd64.with_file_name(format!("latprof_{}_arm64.deb", env!("CARGO_PKG_VERSION")));
    assert!(
        arm64.is_file(),
        "{} is missing: `cargo xtask deb` builds it",
        arm64.display()
    );
    let field = |deb: &Path, name: &str| {
        let out = Command::new("dpkg-deb")
            .arg("-f")
            .arg(deb)
            .arg(name)
            .output()
            .expect("dpkg-deb");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(field(&arm64, "Architecture"), "arm64");
    assert_eq!(field(&amd64, "Architecture"), "amd64");
    assert!(field(&arm64, "Description").contains("arm64"));
    let files = |deb: &Path| {
        let out = Command::new("dpkg-deb")
            .arg("-c")
            .arg(deb)
            .output()
            .expect("dpkg-deb");
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
            .collect();
        names.sort();
        names
    };
    assert_eq!(files(&arm64), files(&amd64));
    let dir = std::env::temp_dir().join(format!("latprof-arm64-deb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&arm64)
        .arg(&dir)
        .status()
        .expect("dpkg-deb");
    assert!(status.success());
    let binary = std::fs::read(dir.join("usr/bin/latprof")).expect("/usr/bin/latprof");
    assert_eq!(
        u16::from_le_bytes([binary[18], binary[19]]),
        0xb7,
        "not an AArch64 binary"
    );
    let said = Command::new("file")
        .arg("-b")
        .arg(dir.join("usr/bin/latprof"))
        .output()
        .expect("file");
    assert!(
        String::from_utf8_lossy(&said.stdout).contains("statically linked"),
        "{}",
        String::from_utf8_lossy(&said.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

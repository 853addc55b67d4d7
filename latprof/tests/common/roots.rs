//! Minimal Debian roots made by debootstrap from Debian's archive, kept between runs on this
//! machine, and commands run inside them as a user's process would (the package tests install
//! latprof's package in Debian 11's and 12's; the runtime tests run Debian 13's Python 3.13).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// Where bootstrapped roots are kept: a run on the same machine reuses them.
const CACHE: &str = "/var/cache/latprof-tests/roots";

/// A minimal root of Debian `suite` with the packages `include`, kept as `name`: bootstrapped
/// the first time, reused after.
pub fn bootstrapped(name: &str, suite: &str, include: &[&str]) -> PathBuf {
    let root = Path::new(CACHE).join(name);
    if root.join("usr/bin/dpkg").is_file() {
        return root;
    }
    std::fs::create_dir_all(CACHE).expect("create the roots' cache");
    let tmp = Path::new(CACHE).join(format!("{name}.tmp"));
    // An interrupted debootstrap leaves its root's /proc mounted: the half-made root could not
    // be removed, and the next debootstrap failed on its files.
    unmount_under(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    let out = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", include.join(",")))
        .arg(suite)
        .arg(&tmp)
        .output()
        .expect("debootstrap (cargo xtask test installs it)");
    assert!(
        out.status.success(),
        "debootstrap {suite}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &root).expect("keep the root");
    root
}

/// Unmounts whatever is mounted at or below `dir`, the deepest first (lazily: nothing in it
/// is in use any more).
fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    // The fifth field is the mount point (no space in these paths to be escaped).
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").args(["-l", p]).status();
    }
}

/// `command` run in `root`, with the host's /proc, /sys (BTF, tracefs) and /dev bound in, in
/// a mount namespace of its own (nothing stays mounted). The returned Command execs into the
/// chroot: its pid is the command's.
pub fn in_root(root: &Path, command: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            r#"set -e; r=$1; shift
for d in proc sys dev; do mount --rbind /$d "$r/$d"; done
exec chroot "$r" "$@""#,
        )
        .arg("sh")
        .arg(root)
        .args(command);
    cmd
}

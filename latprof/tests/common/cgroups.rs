//! Cgroups a test makes below the host's cgroup2 mount (read from /proc/mounts), and moving
//! a waiting workload into one.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::Workload;

/// Cgroups made for one test below the cgroup2 mount; removed when dropped.
pub struct Cgroups {
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    /// Makes `names` (paths relative to the mount, parents first).
    pub fn make(names: &[&str]) -> Self {
        let root = latprof::cgroups::mount_point()
            .expect("this host mounts no cgroup2 file system: the cgroup tests cannot run");
        let mut dirs = Vec::new();
        for name in names {
            let dir = root.join(name);
            if dir.exists() {
                remove_dir(&dir);
            }
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            dirs.push(dir);
        }
        Self { dirs }
    }

    pub fn path(&self, i: usize) -> &Path {
        &self.dirs[i]
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.dirs.iter().rev() {
            remove_dir(dir);
        }
    }
}

/// Removes a cgroup whose tasks exited; an exiting task holds it for a moment.
pub fn remove_dir(dir: &Path) {
    for _ in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Moves a (waiting) workload into `cgroup`.
pub fn move_into(work: &Workload, cgroup: &Path) {
    move_pid(work.pid(), cgroup);
}

/// Moves process `pid` into `cgroup`.
pub fn move_pid(pid: u32, cgroup: &Path) {
    std::fs::write(cgroup.join("cgroup.procs"), pid.to_string())
        .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", cgroup.display()));
}

/// A shell script that unmounts every cgroup2 mount /proc/mounts lists (in the mount namespace
/// it runs in: `unshare -m --propagation private sh -c SCRIPT sh CMD ARGS...`), checks that none
/// is left, then runs its arguments: a host with the legacy hierarchy only.
pub const NO_CGROUP2: &str = r#"for m in $(awk '$3 == "cgroup2" {print $2}' /proc/mounts); do umount -l "$m" || exit 99; done
grep -q ' cgroup2 ' /proc/mounts && exit 98
exec "$@""#;

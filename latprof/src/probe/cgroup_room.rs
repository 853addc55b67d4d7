//! The memory the cgroup latprof runs in leaves it. Its kernel maps are charged there (Linux
//! 5.11 on), so tables sized for the machine's free memory but over a unit's `MemoryMax=` or
//! a pod's limit ended in the kernel refusing a map, or in an OOM kill, instead of in
//! `memory::check`'s one line that names the flag to lower.

use std::path::PathBuf;

/// What the cgroup (and each one above it) still lets latprof take, in bytes; `None` where
/// none limits it or the files cannot be read.
#[must_use]
pub fn room() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (mount, rel, limit, usage) = if let Some((mount, rel)) = v2(&own) {
        (mount, rel, "memory.max", "memory.current")
    } else {
        let (mount, rel) = v1(&own)?;
        (mount, rel, "memory.limit_in_bytes", "memory.usage_in_bytes")
    };
    let dir = mount.join(rel.trim_start_matches('/'));
    // The tightest of its own limit and its ancestors', below the mount.
    dir.ancestors()
        .take_while(|d| d.starts_with(&mount))
        .filter_map(|d| {
            let read = |f: &str| std::fs::read_to_string(d.join(f)).ok();
            // cgroup2 writes "max" for no limit, v1 the largest page-aligned number.
            let max: u64 = read(limit)?.trim().parse().ok()?;
            if max >= 1 << 62 {
                return None;
            }
            let used: u64 = read(usage)?.trim().parse().ok()?;
            Some(max.saturating_sub(used))
        })
        .min()
}

/// The cgroup2 mount and latprof's cgroup there, where cgroup2 has the memory controller.
fn v2(own: &str) -> Option<(PathBuf, String)> {
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mount = crate::cgroups::mount_point()?;
    let controllers = std::fs::read_to_string(mount.join("cgroup.controllers")).ok()?;
    controllers
        .split_whitespace()
        .any(|c| c == "memory")
        .then(|| (mount, rel.to_owned()))
}

/// The v1 memory hierarchy's mount and latprof's cgroup there (hosts whose cgroups are
/// hybrid keep the controllers in v1).
fn v1(own: &str) -> Option<(PathBuf, String)> {
    let rel = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers) = (f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| f.next())?
    })?;
    Some((crate::cgroups::v1_mount_point("memory")?, rel.to_owned()))
}

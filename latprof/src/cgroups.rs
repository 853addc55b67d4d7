//! cgroup v2 ids to paths and readable names.
//!
//! The kernel attributes each sleep to the sleeper's cgroup v2 id, the inode number of the
//! cgroup's directory in the cgroup2 file system. latprof finds where that file system is
//! mounted (`/proc/mounts`; hybrid hosts mount it at /sys/fs/cgroup/unified, pure v2 hosts at
//! /sys/fs/cgroup), walks it to map ids to paths, and names each path as people know it: the
//! systemd unit or slice, the container (docker, containerd, cri-o, podman: runtime and short
//! id), the Kubernetes pod. A cgroup removed while latprof runs keeps the name it had.

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// `statfs::f_type` of cgroup2 (`CGROUP2_SUPER_MAGIC`).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Where the cgroup2 file system is mounted, if it is.
#[must_use]
pub fn mount_point() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let (_, dir, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(unescape_mount(dir)))
    })
}

/// Where the v1 hierarchy that holds `controller` (`memory`, `pids`: one of its mount
/// options) is mounted, if one does (hosts whose cgroups are hybrid keep the controllers there).
#[must_use]
pub fn v1_mount_point(controller: &str) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let f: Vec<&str> = line.split(' ').collect();
        (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == controller))
            .then(|| PathBuf::from(unescape_mount(f[1])))
    })
}

/// A mount point as /proc/mounts writes it: space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4);
        if let Some(b) = code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            out.push(char::from(b));
            rest = &rest[i + 4..];
        } else {
            out.push('\\');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// Whether `dir` is a directory of a cgroup2 file system.
#[must_use]
pub fn is_cgroup2_dir(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs filled by the call; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::statfs(c.as_ptr(), &raw mut st) } == 0;
    #[allow(
        clippy::unnecessary_cast,
        reason = "f_type's type differs between libcs"
    )]
    let magic = st.f_type as i64;
    ok && magic == CGROUP2_SUPER_MAGIC && dir.is_dir()
}

/// The cgroup v2 id of a cgroup directory (its inode number).
pub fn id_of(dir: &Path) -> std::io::Result<u64> {
    Ok(std::fs::metadata(dir)?.ino())
}

/// The processes among `tgids` whose cgroup v2 (`/proc/PID/cgroup`'s `0::` line) is one of
/// `dirs` (cgroup2 directories, as `--cgroup` names them) or below one: those a `--cgroup`
/// run traces. None without a cgroup2 mount.
#[must_use]
pub fn processes_under(dirs: &[PathBuf], tgids: Vec<u32>) -> Vec<u32> {
    let Some(mount) = mount_point() else {
        return Vec::new();
    };
    let under: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| Some(Path::new("/").join(d.strip_prefix(&mount).ok()?)))
        .collect();
    tgids
        .into_iter()
        .filter(|tgid| {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/cgroup")) else {
                return false;
            };
            text.lines()
                .find_map(|l| l.strip_prefix("0::"))
                .is_some_and(|own| under.iter().any(|u| Path::new(own).starts_with(u)))
        })
        .collect()
}

/// Where a cgroup is (was) in the cgroup2 file system.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupPath {
    /// Below the cgroup2 mount; `None`: never seen in the file system (made and removed
    /// between two looks).
    pub path: Option<String>,
    pub removed: bool,
}

/// Ids to paths, from walks of the cgroup2 file system; names kept after removal.
///
/// A walk reads every directory of the hierarchy, thousands on a container host, so it runs
/// only when a snapshot names an id it has not placed yet, or a referenced cgroup's directory
/// is no longer where it was (one `stat` per referenced cgroup and snapshot finds that). An id
/// known removed, or one no walk found (a cgroup made and removed between two walks), never
/// causes another.
#[derive(Debug, Default)]
pub struct CgroupNames {
    root: Option<PathBuf>,
    /// Every id seen in any walk, with its path.
    paths: HashMap<u64, String>,
    /// Ids present in the last walk and still at their path at the last refresh.
    present: HashSet<u64>,
    /// Ids referenced that a walk made after they were referenced did not find.
    unseen: HashSet<u64>,
    /// Walks so far (for the tests: a refresh walks only when it must).
    walks: u64,
}

impl CgroupNames {
    /// Names from the cgroup2 file system where it is mounted; `None` without one (a host
    /// with the legacy hierarchy only: cgroup views are not available).
    #[must_use]
    pub fn new() -> Option<Self> {
        Some(Self::at(mount_point()?))
    }

    /// Names from a cgroup2 file system (or, in tests, any directory tree) at `root`.
    #[must_use]
    pub fn at(root: PathBuf) -> Self {
        let mut names = Self {
            root: Some(root),
            ..Self::default()
        };
        names.walk();
        names
    }

    /// Brings the names of `ids` up to date: a cgroup whose directory is gone from its path
    /// (or is another directory now) is marked removed, or found where it was renamed to; an
    /// id never placed is looked for. Either walks the file system once; nothing else does.
    pub fn refresh(&mut self, ids: impl IntoIterator<Item = u64>) {
        let Some(root) = self.root.clone() else {
            return;
        };
        let ids: Vec<u64> = ids.into_iter().collect();
        let mut walk = false;
        for &id in &ids {
            if self.present.contains(&id) {
                let path = self
                    .paths
                    .get(&id)
                    .map(|p| root.join(p.trim_start_matches('/')));
                if path.is_none_or(|p| id_of(&p).ok() != Some(id)) {
                    self.present.remove(&id);
                    walk = true;
                }
            } else if !self.paths.contains_key(&id) && !self.unseen.contains(&id) {
                walk = true;
            }
        }
        if walk {
            self.walk();
            self.unseen
                .extend(ids.iter().filter(|id| !self.paths.contains_key(id)));
        }
    }

    /// Walks the file system: every cgroup there now is present, with its path.
    pub fn walk(&mut self) {
        let Some(root) = self.root.clone() else {
            return;
        };
        self.walks += 1;
        self.present.clear();
        let mut stack = vec![(root, String::from("/"))];
        while let Some((dir, rel)) = stack.pop() {
            if let Ok(id) = id_of(&dir) {
                self.paths.insert(id, rel.clone());
                self.present.insert(id);
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    // Anyone with a delegated subtree names its cgroups: made printable
                    // here, where the name enters.
                    let name =
                        crate::text::printable(&entry.file_name().to_string_lossy()).into_owned();
                    let child = if rel == "/" {
                        format!("/{name}")
                    } else {
                        format!("{rel}/{name}")
                    };
                    stack.push((entry.path(), child));
                }
            }
        }
    }

    /// Forgets the paths of removed cgroups that `referenced` does not name, so that a host
    /// whose containers come and go for days does not grow this map without bound.
    pub fn forget_unreferenced(&mut self, referenced: &std::collections::BTreeSet<u64>) {
        let present = &self.present;
        self.paths
            .retain(|id, _| present.contains(id) || referenced.contains(id));
        self.unseen.retain(|id| referenced.contains(id));
    }

    /// Where `id` is (was) below the mount, and whether it is gone since; the name is
    /// [`readable_name`] of the path.
    #[must_use]
    pub fn place(&self, id: u64) -> CgroupPath {
        CgroupPath {
            path: self.paths.get(&id).cloned(),
            removed: !self.present.contains(&id),
        }
    }
}

/// Units systemd names cgroups after.
const UNIT_SUFFIXES: [&str; 6] = [".service", ".scope", ".slice", ".socket", ".mount", ".swap"];

/// A cgroup's readable name from its path below the cgroup2 mount.
///
/// systemd's units nest only where one hands its subtree to someone else (`Delegate=`: a
/// user's `user@UID.service`, a machine's or a container's scope, a service that makes
/// cgroups below itself). Whoever owns that subtree names what is in it, so the name keeps
/// the delegating units in front: a user's `nginx.service` is
/// `user@1000.service/nginx.service`, never the system's `nginx.service`, and a cgroup a user
/// names like a container is that user's.
#[must_use]
pub fn readable_name(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some(last) = parts.last() else {
        return "/".to_owned();
    };
    let container = parts.iter().enumerate().rev().find_map(|(i, p)| {
        let (runtime, id, what) = container_of(p)?;
        let id = format!("{}{what}", &id[..12]);
        // A bare id (cgroupfs drivers): docker's below `docker`, containerd's (`ctr`,
        // nerdctl) below its namespace (`/default/<id>`, `/k8s.io/<id>`); below a pod the
        // runtime is not in the path.
        let runtime = match (runtime, i) {
            ("container", _) if parts.contains(&"docker") => "docker",
            ("container", 1) if !parts[0].starts_with("kubepods") => "containerd",
            _ => runtime,
        };
        Some((i, runtime, id))
    });
    let pod = parts
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, p)| Some((i, pod_of(p)?)));
    let (start, name) = match (pod, container) {
        (Some((i, pod)), Some((_, runtime, id))) => (i, format!("pod {pod}/{runtime}:{id}")),
        (Some((i, pod)), None) => (i, format!("pod {pod}")),
        (None, Some((i, runtime, id))) => (i, format!("{runtime}:{id}")),
        (None, None) => {
            // The innermost systemd unit and what is below it, else the last component.
            match parts
                .iter()
                .rposition(|p| UNIT_SUFFIXES.iter().any(|s| p.ends_with(s)))
            {
                Some(unit) => (unit, parts[unit..].join("/")),
                None => (parts.len() - 1, (*last).to_owned()),
            }
        }
    };
    let delegating = delegating(&parts[..start]);
    if delegating.is_empty() {
        name
    } else {
        format!("{}/{name}", delegating.join("/"))
    }
}

/// The full (64 hex digits) id of the innermost container in a cgroup's path below the
/// cgroup2 mount, as other tools give it (OpenTelemetry's `container.id`, cAdvisor); `None`
/// where the path has none, or where it is in a delegated subtree (see [`readable_name`]:
/// whoever owns that subtree names what is in it, and could name a cgroup after any
/// container). The readable name shows its first 12.
#[must_use]
pub fn container_id(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (at, id) = parts
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, p)| Some((i, container_of(p)?.1)))?;
    delegating(&parts[..at]).is_empty().then_some(id)
}

/// The units in `parts` that delegate what is below them: systemd nests units only where one
/// hands its subtree on (`Delegate=`), so any unit but a slice is one.
fn delegating<'a>(parts: &[&'a str]) -> Vec<&'a str> {
    parts
        .iter()
        .copied()
        .filter(|p| {
            UNIT_SUFFIXES
                .iter()
                .any(|s| *s != ".slice" && p.ends_with(s))
        })
        .collect()
}

/// A container runtime, its full id and what the component is of it (`" (conmon)"`, or
/// nothing) from one path component: `docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope` (systemd driver) or a bare
/// 64-hex id (cgroupfs driver, under `docker/`, a containerd namespace or a pod). The monitor
/// cri-o and podman run beside each container (`crio-conmon-<id>.scope`) is that container's,
/// marked `(conmon)`.
fn container_of(part: &str) -> Option<(&'static str, String, &'static str)> {
    const PREFIXES: [(&str, &str, &str); 8] = [
        ("docker-", "docker", ""),
        ("cri-containerd-", "containerd", ""),
        ("nerdctl-", "containerd", ""),
        ("crio-conmon-", "cri-o", " (conmon)"),
        ("crio-", "cri-o", ""),
        ("libpod-conmon-", "podman", " (conmon)"),
        ("libpod-", "podman", ""),
        ("", "container", ""),
    ];
    let base = part.strip_suffix(".scope").unwrap_or(part);
    for (prefix, runtime, what) in PREFIXES {
        if let Some(id) = base.strip_prefix(prefix)
            && is_container_id(id)
        {
            return Some((runtime, id.to_owned(), what));
        }
    }
    None
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A Kubernetes pod uid from one path component: `kubepods-<qos>-pod<uid_with_underscores>.slice`
/// (systemd driver) or `pod<uid>` (cgroupfs driver).
fn pod_of(part: &str) -> Option<String> {
    let base = part.strip_suffix(".slice").unwrap_or(part);
    let at = base.rfind("pod")?;
    if at > 0 && !base[..at].ends_with('-') {
        return None;
    }
    if at > 0 && !base.starts_with("kubepods") {
        return None;
    }
    let uid = base[at + 3..].replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    ok.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    const UID: &str = "0f7c5a1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn the_full_container_id_is_found() {
        assert_eq!(
            container_id(&format!("/system.slice/docker-{ID}.scope")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id(&format!(
                "/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope",
                UID.replace('-', "_")
            ))
            .as_deref(),
            Some(ID)
        );
        assert_eq!(container_id(&format!("/docker/{ID}")).as_deref(), Some(ID));
        assert_eq!(container_id("/system.slice/nginx.service"), None);
        assert_eq!(container_id(&format!("/docker-{}.scope", &ID[..63])), None);
    }

    #[test]
    fn systemd_units_and_slices() {
        assert_eq!(
            readable_name("/system.slice/nginx.service"),
            "nginx.service"
        );
        assert_eq!(
            readable_name("/user.slice/user-1000.slice"),
            "user-1000.slice"
        );
        assert_eq!(
            readable_name("/user.slice/user-1000.slice/session-3.scope"),
            "session-3.scope"
        );
        // A cgroup a service made below itself is named after the service.
        assert_eq!(
            readable_name("/system.slice/postgresql.service/workers"),
            "postgresql.service/workers"
        );
        assert_eq!(readable_name("/"), "/");
        assert_eq!(readable_name("/mine/deeper"), "deeper");
    }

    /// R9 (issue 53): a delegated user's cgroups never share a name with the system's.
    #[test]
    fn delegated_subtrees_keep_their_delegating_units() {
        assert_eq!(
            readable_name("/user.slice/user-1000.slice/user@1000.service/app.slice/nginx.service"),
            "user@1000.service/nginx.service"
        );
        assert_eq!(
            readable_name("/user.slice/user-1000.slice/user@1000.service/app.slice"),
            "user@1000.service/app.slice"
        );
        // A service's own cgroup that a unit's name would not make the system's unit.
        assert_eq!(
            readable_name("/system.slice/postgresql.service/workers/nginx.service"),
            "postgresql.service/nginx.service"
        );
        // A user's cgroup named like a container, and a rootless podman container.
        let short = &ID[..12];
        let forged = format!("/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope");
        assert_eq!(
            readable_name(&forged),
            format!("user@1000.service/docker:{short}")
        );
        // Nor does it carry the container's id into labels.
        assert_eq!(container_id(&forged), None);
        assert_eq!(
            readable_name(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
            )),
            format!("user@1000.service/podman:{short}")
        );
        // Machines' units, and those of a user inside a machine.
        assert_eq!(
            readable_name(
                "/machine.slice/systemd-nspawn@web.service/payload/system.slice/nginx.service"
            ),
            "systemd-nspawn@web.service/nginx.service"
        );
        assert_eq!(
            readable_name(
                "/machine.slice/systemd-nspawn@web.service/payload/user.slice/user@1000.service/app.slice/nginx.service"
            ),
            "systemd-nspawn@web.service/user@1000.service/nginx.service"
        );
    }

    #[test]
    fn containers() {
        let short = &ID[..12];
        assert_eq!(
            readable_name(&format!("/system.slice/docker-{ID}.scope")),
            format!("docker:{short}")
        );
        assert_eq!(
            readable_name(&format!("/docker/{ID}")),
            format!("docker:{short}")
        );
        assert_eq!(
            readable_name(&format!("/system.slice/crio-{ID}.scope")),
            format!("cri-o:{short}")
        );
        assert_eq!(
            readable_name(&format!("/machine.slice/libpod-{ID}.scope/container")),
            format!("podman:{short}")
        );
        assert_eq!(
            readable_name(&format!("/system.slice/nerdctl-{ID}.scope")),
            format!("containerd:{short}")
        );
        // containerd's own cgroupfs layout (`ctr run`): the namespace, then the id.
        assert_eq!(
            readable_name(&format!("/default/{ID}")),
            format!("containerd:{short}")
        );
        // The monitors beside cri-o's and podman's containers are theirs.
        assert_eq!(
            readable_name(&format!("/system.slice/crio-conmon-{ID}.scope")),
            format!("cri-o:{short} (conmon)")
        );
        assert_eq!(
            readable_name(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            format!("podman:{short} (conmon)")
        );
        // Not an id: too short.
        assert_eq!(
            readable_name("/system.slice/docker-abc.scope"),
            "docker-abc.scope"
        );
    }

    #[test]
    fn kubernetes_pods() {
        let under = UID.replace('-', "_");
        let short = &ID[..12];
        assert_eq!(
            readable_name(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/cri-containerd-{ID}.scope"
            )),
            format!("pod {UID}/containerd:{short}")
        );
        assert_eq!(
            readable_name(&format!("/kubepods.slice/kubepods-pod{under}.slice")),
            format!("pod {UID}")
        );
        assert_eq!(
            readable_name(&format!("/kubepods/besteffort/pod{UID}/{ID}")),
            format!("pod {UID}/container:{short}")
        );
        assert_eq!(
            readable_name(&format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{under}.slice/crio-{ID}.scope"
            )),
            format!("pod {UID}/cri-o:{short}")
        );
        // A slice that only looks like a pod.
        assert_eq!(readable_name("/system.slice/ipod.service"), "ipod.service");
    }

    #[test]
    fn mount_points_unescape() {
        assert_eq!(
            unescape_mount("/sys/fs/cgroup/unified"),
            "/sys/fs/cgroup/unified"
        );
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
        assert_eq!(unescape_mount("/a\\x"), "/a\\x");
    }

    /// A directory tree stands in for the cgroup2 file system: ids are inode numbers there
    /// too. Walks happen only where an id is new or its directory moved; a removal is found
    /// by the next refresh and costs one walk, not one per snapshot after.
    #[test]
    fn walks_only_when_something_changed() {
        let root = std::env::temp_dir().join(format!("latprof-cgtree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in [
            "system.slice/nginx.service",
            "system.slice/gone.service",
            "kept",
        ] {
            std::fs::create_dir_all(root.join(dir)).expect("mkdir");
        }
        let ino = |rel: &str| id_of(&root.join(rel)).expect("stat");
        let (nginx, gone, kept) = (
            ino("system.slice/nginx.service"),
            ino("system.slice/gone.service"),
            ino("kept"),
        );
        let mut names = CgroupNames::at(root.clone());
        assert_eq!(names.walks, 1);
        let place = names.place(nginx);
        assert_eq!(place.path.as_deref(), Some("/system.slice/nginx.service"));
        assert!(!place.removed);
        assert_eq!(names.place(ino("")).path.as_deref(), Some("/"));
        // Nothing changed: one stat each, no walk.
        names.refresh([nginx, gone, kept]);
        names.refresh([nginx, gone, kept]);
        assert_eq!(names.walks, 1);
        // Made since: one walk finds it.
        std::fs::create_dir(root.join("kept/new.scope")).expect("mkdir");
        let new = ino("kept/new.scope");
        names.refresh([nginx, new]);
        assert_eq!(names.walks, 2);
        assert_eq!(names.place(new).path.as_deref(), Some("/kept/new.scope"));
        // Removed: marked at the next refresh (one walk), and no walk after for it.
        std::fs::remove_dir(root.join("system.slice/gone.service")).expect("rmdir");
        names.refresh([nginx, gone, kept]);
        assert_eq!(names.walks, 3);
        let place = names.place(gone);
        assert!(place.removed);
        assert_eq!(place.path.as_deref(), Some("/system.slice/gone.service"));
        names.refresh([nginx, gone, kept]);
        assert_eq!(names.walks, 3);
        // Renamed: found at its new path, not removed.
        std::fs::rename(root.join("kept"), root.join("moved")).expect("rename");
        names.refresh([kept, new]);
        assert_eq!(names.walks, 4);
        assert_eq!(names.place(kept).path.as_deref(), Some("/moved"));
        assert!(!names.place(kept).removed);
        assert_eq!(names.place(new).path.as_deref(), Some("/moved/new.scope"));
        // An id no walk finds (made and removed between walks): looked for once.
        names.refresh([u64::MAX]);
        names.refresh([u64::MAX, nginx]);
        assert_eq!(names.walks, 5);
        assert!(names.place(u64::MAX).removed);
        assert_eq!(names.place(u64::MAX).path, None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_removed_cgroup_keeps_its_path() {
        // Seen in a walk, gone from the last one.
        let mut names = CgroupNames {
            paths: [(7, "/system.slice/gone.service".to_owned())].into(),
            ..CgroupNames::default()
        };
        let gone = names.place(7);
        assert_eq!(gone.path.as_deref(), Some("/system.slice/gone.service"));
        assert!(gone.removed);
        // Kept while something names it, forgotten after.
        names.forget_unreferenced(&[7].into_iter().collect());
        assert!(names.place(7).path.is_some());
        names.forget_unreferenced(&std::collections::BTreeSet::new());
        assert_eq!(names.place(7).path, None);
        assert_eq!(names.place(8).path, None);
    }
}

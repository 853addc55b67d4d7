//! A memory and task ceiling for a process, as a unit's `MemoryMax=` and `TasksMax=` set one:
//! a cgroup of the memory and pids controllers wherever /proc/mounts puts them (one cgroup2
//! directory where the cgroup2 root offers both, else one in each v1 hierarchy, as on hosts
//! whose cgroups are hybrid).
use std::path::{Path, PathBuf};

use super::cgroups::remove_dir;

pub struct Ceiling {
    memory: PathBuf,
    /// The same directory as `memory` on cgroup2.
    pids: PathBuf,
    v2: bool,
}

impl Ceiling {
    /// Makes the cgroup(s) `name` with `memory` bytes and `tasks` tasks at most.
    pub fn new(name: &str, memory: u64, tasks: u64) -> Self {
        let ceiling = if let Some(root) = v2_root() {
            let dir = root.join(name);
            Self {
                memory: dir.clone(),
                pids: dir,
                v2: true,
            }
        } else {
            let v1 = |controller: &str| {
                latprof::cgroups::v1_mount_point(controller)
                    .unwrap_or_else(|| {
                        panic!("no cgroup hierarchy with the {controller} controller")
                    })
                    .join(name)
            };
            Self {
                memory: v1("memory"),
                pids: v1("pids"),
                v2: false,
            }
        };
        let dirs = if ceiling.v2 {
            vec![&ceiling.memory]
        } else {
            vec![&ceiling.memory, &ceiling.pids]
        };
        for dir in dirs {
            if dir.exists() {
                remove_dir(dir);
            }
            // One of an earlier run that still holds a process would bring its counts.
            assert!(
                !dir.exists(),
                "{} is left from an earlier run, with processes in it",
                dir.display()
            );
            std::fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        let (memory_file, pids_file) = if ceiling.v2 {
            ("memory.max", "pids.max")
        } else {
            ("memory.limit_in_bytes", "pids.max")
        };
        write(&ceiling.memory.join(memory_file), &memory.to_string());
        write(&ceiling.pids.join(pids_file), &tasks.to_string());
        ceiling
    }

    /// A shell command line that moves the shell into the ceiling, then `exec`s its arguments
    /// (`sh -c SCRIPT sh CMD ARGS...`): the command is under it from its first instruction.
    pub fn enter_script(&self) -> String {
        let mut dirs = vec![&self.memory];
        if !self.v2 {
            dirs.push(&self.pids);
        }
        let moves: Vec<String> = dirs
            .iter()
            .map(|d| format!("echo $$ > '{}/cgroup.procs'", d.display()))
            .collect();
        format!("{} && exec \"$@\"", moves.join(" && "))
    }

    /// The most memory the cgroup has held, in bytes (cgroup2's `memory.peak`: Linux 5.19 on).
    pub fn peak_memory(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        read(&self.memory.join(file))
            .trim()
            .parse()
            .expect("a byte count")
    }

    /// How often a task could not be made for the task ceiling (`max` of pids.events).
    pub fn tasks_refused(&self) -> u64 {
        event(&read(&self.pids.join("pids.events")), "max")
    }

    /// How often the memory ceiling was hit (`max` of memory.events on cgroup2, the v1
    /// `memory.failcnt`).
    pub fn memory_hits(&self) -> u64 {
        if self.v2 {
            event(&read(&self.memory.join("memory.events")), "max")
        } else {
            read(&self.memory.join("memory.failcnt"))
                .trim()
                .parse()
                .expect("a count")
        }
    }
}

impl Drop for Ceiling {
    fn drop(&mut self) {
        remove_dir(&self.memory);
        if !self.v2 {
            remove_dir(&self.pids);
        }
    }
}

/// The cgroup2 mount whose root offers both controllers (none on a hybrid host: v1 holds
/// them there), with them enabled for its children.
fn v2_root() -> Option<PathBuf> {
    let root = latprof::cgroups::mount_point()?;
    let offered = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    let has = |c: &str| offered.split_whitespace().any(|o| o == c);
    if !(has("memory") && has("pids")) {
        return None;
    }
    write(&root.join("cgroup.subtree_control"), "+memory +pids");
    Some(root)
}

/// A size with a binary unit (`512M`, `1Gi`, `4096`) in bytes, `units` naming the unit of
/// each power of 1024 from KiB on (systemd's `K M G T`, Kubernetes' `Ki Mi Gi Ti`).
pub fn bytes(text: &str, units: [&str; 4]) -> u64 {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let shift = if unit.is_empty() {
        0
    } else {
        let at = units
            .iter()
            .position(|u| *u == unit)
            .unwrap_or_else(|| panic!("{text}: not a size in {units:?}"));
        10 * (at + 1)
    };
    digits.parse::<u64>().expect("a size") << shift
}

/// The count of `key` in a `key count` file (memory.events, pids.events).
fn event(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

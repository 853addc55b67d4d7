//! Issue 15: sleeps attributed to the sleeper's cgroup v2, on the real kernel: cgroups made
//! by the test below the host's cgroup2 mount (read from /proc/mounts, never assumed),
//! workloads moved into them before they start, `stats --by cgroup` and `--cgroup` as a user
//! runs them. Needs root (`cargo xtask test` runs these).
use std::{
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

mod common;

use common::{
    LATPROF, Workload,
    cgroups::{Cgroups, move_into, remove_dir},
};

/// A test's unique prefix: the test binary's pid.
fn prefix() -> String {
    format!("latprof-test-{}", std::process::id())
}

/// One cgroup's section of `stats --by cgroup`: its heading and cause lines.
#[derive(Debug)]
struct Section {
    name: String,
    place: String,
    count: u64,
    lines: Vec<String>,
}

impl Section {
    /// The count of the nanosleep cause.
    fn nanosleeps(&self) -> u64 {
        self.lines
            .iter()
            .find(|l| l.contains(" hrtimer_nanosleep "))
            .and_then(|l| l.split_whitespace().next())
            .map_or(0, |n| n.parse().expect("count"))
    }

    /// The count recovered without a backtrace (where the kernel hid the wakeup).
    fn recovered_blind(&self) -> u64 {
        self.lines
            .iter()
            .find(|l| l.contains("[wakeup hidden from tracing]"))
            .and_then(|l| l.split_whitespace().next())
            .map_or(0, |n| n.parse().expect("count"))
    }
}

fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cgroup ") {
            let (name, rest) = rest.split_once(" (").expect("cgroup heading");
            let (place, rest) = rest.split_once("): ").expect("cgroup heading");
            let count = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .expect("cgroup count");
            out.push(Section {
                name: name.to_owned(),
                place: place.to_owned(),
                count,
                lines: Vec::new(),
            });
        } else if let Some(cause) = line.strip_prefix("  ") {
            out.last_mut()
                .expect("a cause before any cgroup")
                .lines
                .push(cause.to_owned());
        }
    }
    out
}

/// What `run` gives: latprof's stdout and stderr, and each workload's pid, sleeps really
/// slept, and every sleep it slept in its cgroup that ended while latprof watched.
struct Ran {
    out: String,
    err: String,
    pids: Vec<u32>,
    slept: Vec<u64>,
    /// Each workload's voluntary switches (the kernel's count of its sleeps) from its wait for
    /// `go` to its wait for the release, both left out: the wait for `go` began before it was
    /// moved into its cgroup, the wait for the release ends after latprof stops
    /// (`End::Alive`). Every other sleep of it began in its cgroup (where latprof counts a
    /// sleep: its cgroup when it began) and ended while latprof watched.
    in_cgroup: Vec<u64>,
}

impl Ran {
    /// Judges workload `i`'s `counted` nanosleeps: every one it slept, counted once, short
    /// only by its own sleeps lost or recovered without a backtrace (`blind`: its cgroup's,
    /// which holds only it) where the kernel hid the wakeup, and its own under 1 us.
    fn judge(&self, i: usize, counted: u64, blind: u64) {
        let pid = self.pids[i];
        let missing = common::own_lost(&self.err, pid) + common::own_short(&self.err, pid) + blind;
        if let Err(why) = common::exact_count(counted, self.slept[i], missing) {
            panic!("workload {i}: {why}\n{}\n{}", self.out, self.err);
        }
    }

    /// Judges workload `i`'s cgroup's `counted` sleeps, all causes (its cgroup holds only it):
    /// each of its sleeps there (`in_cgroup`), counted once, short only by its own lost where
    /// the kernel hid the wakeup and its own under 1 us (those recovered are counted, under
    /// their own cause).
    fn judge_all(&self, i: usize, counted: u64) {
        let pid = self.pids[i];
        let missing = common::own_lost(&self.err, pid) + common::own_short(&self.err, pid);
        if let Err(why) = common::exact_count(counted, self.in_cgroup[i], missing) {
            panic!(
                "workload {i}, all its sleeps: {why}\n{}\n{}",
                self.out, self.err
            );
        }
    }
}

/// Who opened a directory (fanotify, which names the process): latprof's walk of the cgroup
/// tree opens each cgroup's directory after it noted the cgroup's path, so a test waits for
/// that walk, not for a time it guesses. Other tests' latprof walk the same tree: only the
/// process the test waits for counts.
struct Opens(OwnedFd);

impl Opens {
    /// Notes every open of `dir` from now on.
    fn of(dir: &Path) -> Self {
        // SAFETY: plain system calls; the new descriptor is owned from here.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                u32::try_from(libc::O_RDONLY | libc::O_CLOEXEC).expect("flags"),
            )
        };
        assert!(
            fd >= 0,
            "fanotify_init (needs CAP_SYS_ADMIN, as root has): {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fanotify_init returned this descriptor, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).expect("a path");
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let rc = unsafe {
            libc::fanotify_mark(
                fd.as_raw_fd(),
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN | libc::FAN_ONDIR,
                libc::AT_FDCWD,
                path.as_ptr(),
            )
        };
        assert_eq!(
            rc,
            0,
            "fanotify_mark {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        Self(fd)
    }

    /// Waits until process `pid` has opened the directory (at most 20 s).
    fn wait_for(&self, pid: u32) {
        const META: usize = size_of::<libc::fanotify_event_metadata>();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut buf = vec![0u8; 64 * META];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "process {pid} never opened the directory");
            let mut poll = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&raw mut poll, 1, ms) };
            // SAFETY: reads into a buffer of that length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else {
                let err = std::io::Error::last_os_error();
                assert!(
                    matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ),
                    "reading fanotify events: {err}"
                );
                continue;
            };
            let mut seen = false;
            let mut at = 0;
            while at + META <= n {
                // SAFETY: the kernel wrote a whole event's metadata here.
                let event: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                if event.fd >= 0 {
                    // SAFETY: the event's descriptor is ours to close.
                    drop(unsafe { OwnedFd::from_raw_fd(event.fd) });
                }
                seen |= u32::try_from(event.pid).ok() == Some(pid);
                at += (event.event_len as usize).max(META);
            }
            if seen {
                return;
            }
        }
    }
}

/// How `run_as` ends.
enum End<'a> {
    /// latprof stopped first, the workloads alive, each in its wait for the release.
    Alive,
    /// The workloads released (exited), then `dir` (their cgroup) removed once latprof's walk
    /// of the cgroup tree found it (its opens), then latprof stopped.
    Removed(&'a Path, &'a Opens),
}

/// Runs `latprof ARGS stats --by cgroup` in `format` around workloads of `counts` 2 ms
/// nanosleeps, each moved into its cgroup first.
fn run_as(format: &str, args: &[&str], work: &[(&Path, u32)], end: &End<'_>) -> Ran {
    let mut cmd = Command::new(LATPROF);
    cmd.args(args)
        .args([
            "stats",
            "--by",
            "cgroup",
            "--format",
            format,
            "--all-sleeps",
            "--duration",
            "120s",
        ])
        .stdout(Stdio::piped());
    let (stats, stderr) = common::start(&mut cmd, "attached");
    let mut loads: Vec<(Workload, u64)> = work
        .iter()
        .map(|(cgroup, count)| {
            let w = Workload::spawn(&["sleep", "--count", &count.to_string(), "--interval", "2ms"]);
            // In its wait for `go` (begun in our cgroup) before it moves: every later sleep
            // begins in its own.
            w.wait_blocked();
            let before = common::voluntary_switches(w.pid());
            move_into(&w, cgroup);
            (w, before)
        })
        .collect();
    for (w, _) in &mut loads {
        w.go();
    }
    let slept: Vec<u64> = loads
        .iter_mut()
        .map(|(w, _)| w.wait_fact("slept"))
        .collect();
    // Each in its wait for the release: begun (and counted by the kernel), not ended.
    let in_cgroup = loads
        .iter()
        .map(|(w, before)| {
            w.wait_blocked();
            common::voluntary_switches(w.pid()) - before - 1
        })
        .collect();
    let pids = loads.iter().map(|(w, _)| w.pid()).collect();
    let (out, err) = match end {
        End::Alive => {
            let stopped = common::interrupt(stats, stderr);
            for (w, _) in loads {
                w.release();
            }
            stopped
        }
        End::Removed(dir, opens) => {
            // latprof's walk noted the cgroup's path while it was there; its last snapshot
            // finds it gone.
            opens.wait_for(stats.id());
            for (w, _) in loads {
                w.release();
            }
            remove_dir(dir);
            assert!(!dir.exists(), "{} still there", dir.display());
            common::interrupt(stats, stderr)
        }
    };
    Ran {
        out: String::from_utf8(out.stdout).expect("utf-8"),
        err,
        pids,
        slept,
        in_cgroup,
    }
}

/// The JSON document's cgroup with id `id`, if any.
fn json_cgroup(doc: &serde_json::Value, id: u64) -> Option<&serde_json::Value> {
    doc["cgroups"]
        .as_array()
        .expect("cgroups")
        .iter()
        .find(|c| c["id"] == id)
}

fn find<'a>(all: &'a [Section], name: &str, text: &str) -> &'a Section {
    all.iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no cgroup {name}:\n{text}"))
}

/// Two cgroups (one with a child), a nanosleep workload in each with its own count: each
/// cgroup shows exactly its workload's sleeps, less what latprof reports lost. The first one
/// is named like a systemd service and is shown by that name.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn each_cgroup_shows_exactly_its_sleeps() {
    let p = prefix();
    let (a, child, b) = (
        format!("{p}-a.service"),
        format!("{p}-a.service/inner"),
        format!("{p}-b"),
    );
    let groups = Cgroups::make(&[&a, &child, &b]);
    let ran = run_as(
        "text",
        &[],
        &[
            (groups.path(0), 90),
            (groups.path(1), 30),
            (groups.path(2), 60),
        ],
        &End::Alive,
    );
    let (all, text) = (sections(&ran.out), &ran.out);
    // A cgroup below a service is named after it.
    let inner = format!("{a}/inner");
    for (i, name) in [a.as_str(), inner.as_str(), b.as_str()]
        .into_iter()
        .enumerate()
    {
        let section = find(&all, name, text);
        let n = section.nanosleeps();
        ran.judge(i, n, section.recovered_blind());
        assert!(!section.place.contains("removed"), "{text}");
        // The heading counts its causes' sleeps, no more, no fewer.
        let causes: u64 = section
            .lines
            .iter()
            .map(|l| {
                l.split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no count in {l:?}:\n{text}"))
            })
            .sum();
        assert_eq!(section.count, causes, "{name}:\n{text}");
        // And those are every sleep of its workload there: its nanosleeps and the rest (the
        // workload's own other waits: its first steps after `go`, its report).
        ran.judge_all(i, section.count);
    }
    assert_eq!(find(&all, &a, text).place, format!("/{a}"), "{text}");
}

/// `--cgroup A` traces A's workload and its child cgroup's, and nothing of B's.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn the_cgroup_filter_keeps_one_subtree() {
    let p = prefix();
    let (a, child, b) = (
        format!("{p}-fa"),
        format!("{p}-fa/inner"),
        format!("{p}-fb"),
    );
    let groups = Cgroups::make(&[&a, &child, &b]);
    let filter = groups.path(0).to_str().expect("utf-8").to_owned();
    let id = |i: usize| latprof::cgroups::id_of(groups.path(i)).expect("cgroup id");
    let ran = run_as(
        "json",
        &["--cgroup", &filter],
        &[
            (groups.path(0), 40),
            (groups.path(1), 20),
            (groups.path(2), 50),
        ],
        &End::Alive,
    );
    let doc: serde_json::Value = serde_json::from_str(&ran.out).expect("json");
    let text = format!("{}\n{}", ran.out, ran.err);
    for (i, name) in [(0, a.as_str()), (1, "inner")] {
        let cgroup = json_cgroup(&doc, id(i)).unwrap_or_else(|| panic!("no {name}:\n{text}"));
        assert_eq!(cgroup["name"], name, "{text}");
        ran.judge(
            i,
            common::nanosleeps_of(cgroup),
            common::recovered_blind(cgroup),
        );
        // Its count is its causes', and every sleep of its workload there.
        let count = cgroup["count"].as_u64().expect("count");
        assert_eq!(count, common::counted_of(cgroup), "{name}:\n{text}");
        ran.judge_all(i, count);
    }
    // B's workload slept too (all of its 50 nanosleeps but those whose 2 ms timer expired
    // before the task slept), and none of it was counted: an explicit zero.
    assert!(ran.slept[2] > 0, "{text}");
    let b_count = json_cgroup(&doc, id(2)).map_or(0, |c| c["count"].as_u64().expect("count"));
    assert_eq!(b_count, 0, "B counted under --cgroup A:\n{text}");
    // Nor anything else on the machine: only A's subtree.
    let others: u64 = doc["cgroups"]
        .as_array()
        .expect("cgroups")
        .iter()
        .filter(|c| c["id"] != id(0) && c["id"] != id(1))
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(others, 0, "only A's subtree:\n{text}");
}

/// A cgroup removed while latprof runs keeps its numbers and is marked removed.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_removed_cgroup_keeps_its_numbers() {
    let p = prefix();
    let gone = format!("{p}-gone");
    let groups = Cgroups::make(&[&gone]);
    let dir = groups.path(0).to_owned();
    // Watched from before latprof starts: its first walk is seen.
    let opens = Opens::of(&dir);
    let ran = run_as("text", &[], &[(&dir, 40)], &End::Removed(&dir, &opens));
    let all = sections(&ran.out);
    let s = find(&all, &gone, &ran.out);
    ran.judge(0, s.nanosleeps(), s.recovered_blind());
    assert_eq!(s.place, format!("/{gone}, removed"), "{}", ran.out);
}

/// A path that is not a cgroup v2 directory: one line, exit 2, nothing loaded.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_bad_cgroup_path_is_one_line_and_exit_2() {
    for path in ["/nonexistent/cgroup", "/tmp"] {
        let out = Command::new(LATPROF)
            .args(["--cgroup", path, "stats", "--duration", "1s"])
            .output()
            .expect("run latprof");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(path), "{err}");
    }
}

/// JSON and folded carry the same attribution: the cgroup's name as the folded root frame.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn json_and_folded_name_the_cgroup() {
    let p = prefix();
    let name = format!("{p}-fmt.service");
    let groups = Cgroups::make(&[&name]);
    for format in ["json", "folded"] {
        let mut cmd = Command::new(LATPROF);
        // Every sleep counts: a 1 ms nanosleep late past the 5 ms cutoff on a busy machine
        // would leave latencytop's count (one CI run lost one so).
        cmd.args([
            "stats",
            "--all-sleeps",
            "--by",
            "cgroup",
            "--format",
            format,
            "--duration",
            "60s",
        ])
        .stdout(Stdio::piped());
        let (stats, stderr) = common::start(&mut cmd, "attached");
        let mut w = Workload::spawn(&["sleep", "--count", "50", "--interval", "1ms"]);
        move_into(&w, groups.path(0));
        w.go();
        let slept = w.wait_fact("slept");
        let pid = w.pid();
        w.release();
        let (out, err) = common::interrupt(stats, stderr);
        let text = String::from_utf8(out.stdout).expect("utf-8");
        if format == "json" {
            let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
            let ours = doc["cgroups"]
                .as_array()
                .expect("cgroups")
                .iter()
                .find(|c| c["name"] == name.as_str())
                .unwrap_or_else(|| panic!("no {name}: {text}"));
            assert_eq!(ours["path"], format!("/{name}"));
            assert_eq!(ours["removed"], false);
            // Each of its 50 nanosleeps that slept, counted once.
            let missing = common::own_lost(&err, pid)
                + common::own_short(&err, pid)
                + common::recovered_blind(ours);
            if let Err(why) = common::exact_count(common::nanosleeps_of(ours), slept, missing) {
                panic!("{why}: {text}\n{err}");
            }
        } else {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name};")) && l.contains("hrtimer_nanosleep")),
                "{text}"
            );
        }
    }
}

/// A recording keeps its cgroups after they are gone: a workload recorded in a cgroup that is
/// removed before the recording ends shows, in `dump --by cgroup` (text and JSON), under its
/// name and path, marked removed, with its sleeps.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recording_keeps_a_removed_cgroup() {
    let p = prefix();
    let name = format!("{p}-rec.service");
    let groups = Cgroups::make(&[&name]);
    let dir = groups.path(0).to_owned();
    let file = std::env::temp_dir().join(format!("{p}-cgroups.lpr"));
    let path = file.to_str().expect("utf-8").to_owned();
    let mut cmd = Command::new(LATPROF);
    cmd.args([
        "record",
        "--all-sleeps",
        "--duration",
        "120s",
        "--interval",
        "100ms",
        "--force",
        "-o",
        &path,
    ])
    .stdout(Stdio::null());
    let (recorder, stderr) = common::start(&mut cmd, "recording to");
    let mut work = Workload::spawn(&["sleep", "--count", "50", "--interval", "2ms"]);
    move_into(&work, &dir);
    work.go();
    let slept = work.wait_fact("slept");
    let work_pid = work.pid();
    // Seen present by a snapshot taken after the work (its sleeps there, its cgroup's path
    // found by that snapshot's look at the tree), then gone by the last, which the recorder
    // takes as it stops.
    let written = snapshots_in(&file);
    wait_for_snapshots(&file, written + 2);
    work.release();
    remove_dir(&dir);
    assert!(!dir.exists(), "{} still there", dir.display());
    let (_, rest) = common::interrupt(recorder, stderr);
    let own_missing = common::own_lost(&rest, work_pid) + common::own_short(&rest, work_pid);

    let dump = |format: &str| {
        let out = Command::new(LATPROF)
            .args(["dump", &path, "--by", "cgroup", "--format", format])
            .output()
            .expect("latprof dump");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let text = dump("text");
    let all = sections(&text);
    let s = find(&all, &name, &text);
    assert_eq!(s.place, format!("/{name}, removed"), "{text}");
    let n = s.nanosleeps();
    // Each of its sleeps, counted once; short only by its own lost or recovered without a
    // backtrace (its cgroup's) where the kernel hid the wakeup, or under 1 us.
    if let Err(why) = common::exact_count(n, slept, own_missing + s.recovered_blind()) {
        panic!("{why}\n{text}\n{rest}");
    }

    let json = dump("json");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("json");
    let c = doc["cgroups"]
        .as_array()
        .expect("cgroups")
        .iter()
        .find(|c| c["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no {name}:\n{json}"));
    assert_eq!(c["path"], format!("/{name}"), "{json}");
    assert_eq!(c["removed"], true, "{json}");
    assert_eq!(common::nanosleeps_of(c), n, "{json}");
    let _ = std::fs::remove_file(&file);
}

/// The whole snapshots in a recording still being written (`dump --info`); 0 before the first.
fn snapshots_in(file: &Path) -> u64 {
    let out = Command::new(LATPROF)
        .arg("dump")
        .arg(file)
        .arg("--info")
        .stdout(Stdio::null())
        .output()
        .expect("latprof dump");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            let (before, _) = l.split_once(" snapshots, ")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// Waits until the recording holds `n` snapshots (at most 20 s): the snapshot that ends a
/// frame being written when `snapshots_in` last looked is whole only after it, so `n` two
/// more than that count holds one begun after the look.
fn wait_for_snapshots(file: &Path, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let have = snapshots_in(file);
        if have >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} holds {have} snapshots, not {n}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A host with the legacy hierarchy only (cgroup2 unmounted in a mount namespace of its own,
/// wherever /proc/mounts says it is): latprof says once that cgroup views are not available
/// and counts as before.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_host_without_cgroup_v2_says_so_once() {
    // Every cgroup2 mount unmounted in the namespace, checked, then latprof in its place.
    use common::cgroups::NO_CGROUP2;
    let legacy = |args: &[&str]| {
        let mut cmd = Command::new("unshare");
        cmd.args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            NO_CGROUP2,
            "sh",
        ])
        .arg(LATPROF)
        .args(args)
        .stdout(Stdio::piped());
        cmd
    };
    let mut w = Workload::spawn(&["sleep", "--count", "50", "--interval", "2ms"]);
    let pid = w.pid().to_string();
    let (stats, stderr) = common::start(
        &mut legacy(&["stats", "--all-sleeps", "--pid", &pid, "--duration", "120s"]),
        "attached",
    );
    w.go();
    let slept = w.wait_fact("slept");
    w.release();
    let (out, rest) = common::interrupt(stats, stderr);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let notices: Vec<&str> = rest.lines().filter(|l| l.contains("cgroup")).collect();
    assert_eq!(
        notices,
        [latprof::probe::NO_CGROUP_VIEWS].map(|n| format!("latprof: {n}")),
        "{rest}"
    );
    // The stats as ever: the workload's nanosleeps, each once (only its own traced: --pid),
    // but those under 1 us, which latencytop does not count.
    let missing = common::reported_missing(&rest) + common::under_1us(&rest).unwrap_or(0);
    let n: u64 = text
        .lines()
        .filter(|l| l.contains(" hrtimer_nanosleep "))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    if let Err(why) = common::exact_count(n, slept, missing) {
        panic!("{why}\n{text}\n{rest}");
    }
    // `--by cgroup` has nothing to show, and says why.
    let out = legacy(&["stats", "--by", "cgroup", "--duration", "1s"])
        .output()
        .expect("unshare (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("cgroup v2 not mounted"), "{text}");
}

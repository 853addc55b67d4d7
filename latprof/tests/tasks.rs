//! Privileged tests (they load latprof's real eBPF object into the running kernel and run
//! workloads they spawn themselves; root or CAP_BPF + CAP_PERFMON, so `#[ignore]`d for a plain
//! `cargo test`: `cargo xtask test` runs them; without privileges they fail).
//!
//! Which tasks count, under which name: kernel threads out of the global table (and said),
//! `--pid` and `--comm` as latencytop takes them in, latprof's own threads, a task's current
//! name, a task first seen exiting.
use std::{
    collections::HashSet,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use latprof::{
    collect::{Collector, Snapshot},
    model::{self},
    probe::{DebugConfig, Mode, Probe, ProbeConfig},
    symbols::Kallsyms,
};
use latprof_common::Counter;

mod common;

use common::{
    LATPROF, Workload,
    probe::{accounted, attach, defaults, frames_with, serial, total},
};

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn kernel_threads_stay_out_of_the_global_table() {
    let _guard = serial();
    let probe = attach(Mode::Normal, None);
    let mut work = Workload::spawn(&[
        "fsync",
        "--count",
        "20",
        "--dir",
        env!("CARGO_TARGET_TMPDIR"),
    ]);
    let work_pid = work.pid();
    work.go();
    work.wait_done();
    let snap = Collector::new().snapshot(&probe).expect("snapshot");
    work.release();
    let kthreads: Vec<_> = snap.tasks.iter().filter(|t| t.kthread).collect();
    assert!(
        kthreads.iter().any(|t| t.comm.starts_with("kworker")),
        "no kworker seen among {:?}",
        snap.tasks
            .iter()
            .map(|t| (&t.comm, t.kthread))
            .collect::<Vec<_>>()
    );
    let workload = snap.tasks.iter().find(|t| t.tgid == work_pid);
    assert!(
        workload.is_some_and(|t| !t.kthread),
        "the workload is not a kernel thread"
    );
    let user_stacks: HashSet<u64> = snap
        .tasks
        .iter()
        .filter(|t| !t.kthread)
        .flat_map(|t| t.records.iter().map(|r| r.stack_id))
        .collect();
    let kthread_only: HashSet<u64> = kthreads
        .iter()
        .flat_map(|t| t.records.iter().map(|r| r.stack_id))
        .filter(|s| !user_stacks.contains(s))
        .collect();
    assert!(!kthread_only.is_empty(), "kernel threads recorded nothing");
    let leaked: Vec<_> = snap
        .global
        .iter()
        .filter(|(s, _)| kthread_only.contains(s))
        .collect();
    assert!(
        leaked.is_empty(),
        "kernel-thread causes in the global table: {leaked:?}"
    );
}

/// Runs a system command as root; it must succeed. Returns its stdout.
fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small ext4 filesystem on a loop device, mounted for one test. Its journal thread
/// (`jbd2/loopN-8`) is a kernel thread that the test can make sleep (an fsync there commits
/// the journal: the thread wakes, waits for its writes, sleeps again) and exit (unmount):
/// a kernel thread with a known pid, known causes and a known end.
struct Ext4 {
    image: std::path::PathBuf,
    dir: std::path::PathBuf,
    dev: String,
    mounted: bool,
}

impl Ext4 {
    fn mount(name: &str) -> Self {
        let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("latprof-ext4-{name}-{}", std::process::id()));
        let (image, dir) = (base.with_extension("img"), base.with_extension("mnt"));
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(32 << 20))
            .expect("image file");
        let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
        sh("mkfs.ext4", &["-q", "-F", &path(&image)]);
        let dev = sh("losetup", &["-f", "--show", &path(&image)])
            .trim()
            .to_owned();
        let mut fs = Self {
            image,
            dir,
            dev,
            mounted: false,
        };
        std::fs::create_dir_all(&fs.dir).expect("mount point");
        sh("mount", &[&fs.dev, &path(&fs.dir)]);
        fs.mounted = true;
        fs
    }

    fn dir(&self) -> &str {
        self.dir.to_str().expect("utf-8 path")
    }

    /// The pid of the filesystem's journal thread.
    fn journal_thread(&self) -> u32 {
        let dev = self.dev.rsplit('/').next().expect("device name");
        let comm = format!("jbd2/{dev}-8");
        std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == comm)
            })
            .unwrap_or_else(|| panic!("no journal thread {comm}"))
    }

    /// Unmounts: the journal thread exits.
    fn unmount(&mut self) {
        sh("umount", &[self.dir()]);
        self.mounted = false;
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Issue 12 section 4: a kernel thread, the journal thread of an ext4 filesystem the test
/// mounts, made to sleep by fsyncs there and to exit by the unmount.
///
/// With `--pid` of it, latencytop's rule is that the process asked for is counted whatever it
/// is (/proc/PID/latency has a kernel thread's records too): its sleeps are counted, they are
/// its table and the global table of that run, with no kernel thread's sleep kept out; in lazy
/// mode its exit merges them. `latprof stats --pid` takes its pid and prints them.
///
/// Without `--pid` (lazy mode, system-wide) kernel threads are kept out of the global table:
/// the thread's records are its own while it lives, and its exit merges none of them (the
/// `--debug-checks` counter of such exits says it had records).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_kernel_thread_counts_under_its_pid_and_stays_out_of_the_global_table_otherwise() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let mut fs = Ext4::mount("kthread");
    let jbd = fs.journal_thread();
    let jbd_arg = jbd.to_string();
    let normal = Probe::attach(ProbeConfig {
        mode: Mode::Normal,
        pid: Some(jbd),
        inter_cutoff: None,
        ..defaults()
    })
    .expect("attach latprof on the journal thread");
    let everyone = Probe::attach(ProbeConfig {
        mode: Mode::Lazy,
        inter_cutoff: None,
        debug: DebugConfig {
            checks: true,
            ..defaults().debug
        },
        ..defaults()
    })
    .expect("attach latprof");
    let (stats, stats_err) = common::start(
        Command::new(LATPROF)
            .args([
                "stats",
                "--all-sleeps",
                "--duration",
                "60s",
                "--pid",
                &jbd_arg,
            ])
            .stdout(Stdio::piped()),
        "attached",
    );
    let mut work = Workload::spawn(&["fsync", "--count", "20", "--dir", fs.dir()]);
    work.go();
    work.wait_done();
    work.release();
    let kjournald = |snap: &Snapshot| -> u64 {
        frames_with(&model::global_causes(snap, &syms, 12), "kjournald2")
            .iter()
            .map(|c| c.count)
            .sum()
    };

    // Under --pid: the thread is tracked, as a kernel thread, and everything it accounted is
    // in the global table.
    let snap = Collector::new().snapshot(&normal).expect("snapshot");
    let task = snap
        .tasks
        .iter()
        .find(|t| t.tid == jbd)
        .unwrap_or_else(|| panic!("journal thread not tracked: {:?}", snap.tasks));
    assert!(task.kthread, "{task:?}");
    assert!(!task.records.is_empty(), "{task:?}");
    assert!(kjournald(&snap) > 0, "no journal causes under --pid");
    assert_eq!(total(&snap.global_records()), accounted(&snap));
    assert_eq!(snap.counters.get(Counter::KthreadSleeps), 0);

    // System-wide: its records are its own, none global.
    let mut everyone_reader = Collector::new();
    let live = everyone_reader.snapshot(&everyone).expect("snapshot");
    let task = live
        .tasks
        .iter()
        .find(|t| t.tid == jbd)
        .unwrap_or_else(|| panic!("journal thread not tracked system-wide"));
    assert!(task.kthread, "{task:?}");
    assert!(!task.records.is_empty(), "{task:?}");
    assert!(live.counters.get(Counter::KthreadSleeps) > 0);
    assert_eq!(
        kjournald(&live),
        0,
        "a kernel thread's causes in the global view"
    );

    // The thread exits.
    fs.unmount();
    let (out, rest) = common::interrupt(stats, stats_err);
    let after = everyone_reader.snapshot(&everyone).expect("snapshot");
    assert!(
        after.tasks.iter().all(|t| t.tid != jbd),
        "journal thread still tracked"
    );
    assert_eq!(
        kjournald(&after),
        0,
        "the exit merged a kernel thread's records into the global table"
    );
    assert!(after.counters.get(Counter::DebugExitWithRecords) > 0);

    // latprof stats --pid (lazy): the exit merged its records; all it counted is printed.
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let counted: u64 = rest
        .lines()
        .find_map(|l| l.strip_prefix("latprof: ")?.split_once(" sleeps counted"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of sleeps:\n{rest}"));
    let printed: u64 = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .expect("count")
        })
        .sum();
    assert!(counted > 0, "{rest}");
    assert_eq!(printed, counted, "{text}\n{rest}");
    assert!(text.contains(" kjournald2 "), "{text}");
    assert!(!rest.contains("kernel threads"), "{rest}");
}

/// The parent process of `pid`, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

/// The workload sleeping 1 ms in a loop under another name, `other-NAME` (a task's name is its
/// program's: a link to the workload); killed when dropped, even by a failing test.
struct OtherCommand {
    child: std::process::Child,
    link: std::path::PathBuf,
}

impl OtherCommand {
    fn start(name: &str) -> Self {
        let link = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("other-{name}"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(common::workload_bin(), &link).expect("symlink");
        let child = Command::new(&link)
            .args(["sleep", "--count", "1000000", "--interval", "1ms"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the other command");
        Self { child, link }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for OtherCommand {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.link);
    }
}

/// `latprof top ARGS`'s App (what its processes pane shows), fed by `probe`'s snapshots.
fn top_app(args: &[&str], probe: &Probe, syms: &Kallsyms) -> latprof::tui::app::App {
    use clap::Parser as _;
    let cli = latprof::cli::Cli::try_parse_from(
        std::iter::once("latprof")
            .chain(["top"])
            .chain(args.iter().copied()),
    )
    .expect("top's flags");
    let latprof::cli::Command::Top(top) = &cli.command else {
        panic!("not top");
    };
    latprof::tui::app::App::new(
        latprof::tui::app::Settings {
            mode: Mode::Lazy,
            interval_ms: 100,
            depth: 12,
            syms: syms.clone(),
            reasons: latprof::reasons::Reasons::builtin(),
            kernel: latprof::probe::facts::kernel_facts(probe),
            spike_ns: u64::MAX,
            wakers: true,
            chain_depth: 0,
        },
        latprof::cmd::top::initial_filter(top),
    )
}

/// Issue 12 section 4: who `--pid` and `--comm` take in, with a parent whose two forked
/// children sleep 1 ms in a loop for 1.5 s, and another command sleeping, whose name holds the
/// parent's pid (`other-PID`).
///
/// `--pid P` filters in the kernel on the thread group: P's threads, no other process, and
/// not P's children, which are processes of their own (their own tgid) from their first
/// instruction. That is latencytop's rule: /proc/P/latency holds P's own records, a child's
/// start empty at fork and are in /proc/CHILD/latency. (Where latprof differs on purpose:
/// /proc/P/latency is P's main thread alone, `--pid P` all its threads, as its help says.)
/// So `stats --pid P` prints the parent's waits for its children and none of their thousands
/// of nanosleeps, nor the other command's.
///
/// `top --comm NAME` is a view filter: the processes pane shows every process one of whose
/// threads' names contains NAME. Forked children keep their parent's name, so they are in;
/// the other command is not. `top --pid P` shows P alone: not its children, and not a
/// command whose name holds the digits of P (it did: the pid was matched as part of a name).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn pid_and_comm_take_in_what_latencytop_would() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    let mut parent = Workload::spawn(&[
        "sleepers",
        "--procs",
        "2",
        "--interval",
        "1ms",
        "--time",
        "1500ms",
    ]);
    let pid = parent.pid();
    // Another command: the workload under another name (a task's name is its program's).
    let other = OtherCommand::start(&pid.to_string());
    let probe = attach(Mode::Lazy, None);
    let (stats, stats_err) = common::start(
        Command::new(LATPROF)
            .args([
                "stats",
                "--all-sleeps",
                "--duration",
                "60s",
                "--pid",
                &pid.to_string(),
            ])
            .stdout(Stdio::piped()),
        "attached",
    );
    let mut everyone = top_app(&[], &probe, &syms);
    let mut by_comm = top_app(&["--comm", "LATPROF-WORKLOA"], &probe, &syms);
    let mut by_pid = top_app(&["--pid", &pid.to_string()], &probe, &syms);
    parent.go();
    // Until the unfiltered pane shows both children and the other command (each sleeps every
    // millisecond once started).
    let mut collector = Collector::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let children = loop {
        let snap = collector.snapshot(&probe).expect("snapshot");
        for app in [&mut everyone, &mut by_comm, &mut by_pid] {
            app.on_snapshot(snap.clone());
        }
        let shown: HashSet<u32> = everyone.procs.iter().map(|p| p.tgid).collect();
        let children: HashSet<u32> = shown
            .iter()
            .copied()
            .filter(|&t| parent_of(t) == Some(pid))
            .collect();
        if children.len() == 2 && shown.contains(&other.pid()) {
            break children;
        }
        assert!(
            Instant::now() < deadline,
            "children or the other command not shown: {:?}",
            everyone.procs
        );
    };
    let tgids = |app: &latprof::tui::app::App| -> HashSet<u32> {
        app.procs.iter().map(|p| p.tgid).collect()
    };
    let comm = tgids(&by_comm);
    assert!(comm.is_superset(&children), "--comm: {:?}", by_comm.procs);
    assert!(!comm.contains(&other.pid()), "--comm: {:?}", by_comm.procs);
    assert!(
        by_comm
            .procs
            .iter()
            .all(|p| p.comm == common::WORKLOAD_COMM),
        "--comm: {:?}",
        by_comm.procs
    );
    assert!(
        tgids(&by_pid).iter().all(|&t| t == pid),
        "--pid shows another process: {:?}",
        by_pid.procs
    );
    parent.wait_done();
    drop(other);
    let (out, rest) = common::interrupt(stats, stats_err);
    parent.release();
    let text = String::from_utf8(out.stdout).expect("utf-8");
    // The parent waited for its children; their sleeps and the other command's are not its.
    assert!(
        text.lines().any(|l| l.contains(" do_wait ")),
        "no wait for the children:\n{text}\n{rest}"
    );
    assert!(!text.contains("nanosleep"), "{text}");
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn own_threads_only_with_include_self() {
    let _guard = serial();
    let me = std::process::id();
    for include_self in [false, true] {
        let probe = Probe::attach(ProbeConfig {
            include_self,
            ..defaults()
        })
        .expect("attach");
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let snap = Collector::new().snapshot(&probe).expect("snapshot");
        let mine = snap.tasks.iter().any(|t| t.tgid == me);
        assert_eq!(mine, include_self, "own threads tracked = {mine}");
    }
}

/// D11: a task's name is the one it has now, not the one of its first sleep: a shell child
/// sleeps (waiting for `sleep`) as `sh`, then execs the workload, whose name every line shows;
/// a process that renames itself shows its new name at once (escaped).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn the_name_is_the_current_one() {
    let _guard = serial();
    let probe = attach(Mode::Lazy, None);
    let mut child = Command::new("sh")
        .args([
            "-c",
            &format!(
                "sleep 0.05; exec {} --hold sleep --count 50 --interval 2ms",
                common::workload_bin().display()
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(line.starts_with("done"), "{line}");
    // The nanosleeps that really slept (a 2 ms timer can expire before the task leaves the
    // CPU on a stalled machine).
    let slept: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("slept="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no slept= in {line}"));
    let mut collector = Collector::new();
    let snap = collector.snapshot(&probe).expect("snapshot");
    drop(child.stdin.take());
    let _ = child.wait();
    // A process that sleeps, then renames itself (prctl) and waits on stdin: the snapshot
    // after the rename has the new name, escaped.
    let mut renamer = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import ctypes, sys, time\n\
             for _ in range(5): time.sleep(0.002)\n\
             ctypes.CDLL(None).prctl(15, b'renamed\\x1b[2J', 0, 0, 0)\n\
             print('done', flush=True)\n\
             sys.stdin.read()",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let renamer_pid = renamer.id();
    let mut line = String::new();
    BufReader::new(renamer.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(line.starts_with("done"), "{line}");
    let renamed = collector.snapshot(&probe).expect("snapshot");
    drop(renamer.stdin.take());
    let _ = renamer.wait();
    let comm = renamed
        .tasks
        .iter()
        .find(|t| t.tid == renamer_pid)
        .map(|t| t.comm.as_str());
    assert_eq!(comm, Some("renamed\\x1b[2J"));
    let task = snap
        .tasks
        .iter()
        .find(|t| t.tid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not tracked"));
    // It slept as sh first (waiting for sleep), then as the workload (its nanosleeps, less
    // any this host hid the wakeup of and latprof reported lost).
    let sleeps: u64 = task
        .records
        .iter()
        .filter(|r| r.stack_id != latprof_common::RUNQ_STACK)
        .map(|r| r.count)
        .sum();
    let lost = common::lost_where_hidden(&snap);
    assert!(
        sleeps + lost > slept && slept >= 9,
        "slept {slept}, lost {lost}: {task:?}"
    );
    assert_eq!(task.comm, common::WORKLOAD_COMM, "{task:?}");
}

/// D16: the global table leaves kernel threads out, as latencytop does, and `stats` says how
/// many of their sleeps it left out instead of counting them with no word.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn stats_says_what_it_left_out() {
    let _guard = serial();
    let (mut stats, mut stderr) = common::start(
        Command::new(LATPROF)
            .args(["stats", "--duration", "3s"])
            .stdout(Stdio::null()),
        "attached",
    );
    // Writeback wakes kernel threads (kworkers, the journal) that sleep again.
    let mut work = Workload::spawn(&[
        "fsync",
        "--count",
        "20",
        "--dir",
        env!("CARGO_TARGET_TMPDIR"),
    ]);
    work.go();
    work.wait_done();
    work.release();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).expect("stderr");
    assert!(stats.wait().expect("wait").success(), "{rest}");
    let note = rest
        .lines()
        .find(|l| l.contains("sleeps of kernel threads and"))
        .unwrap_or_else(|| panic!("no word of kernel threads:\n{rest}"));
    let kthreads: u64 = note
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{note}"));
    assert!(kthreads > 0, "{note}");
}

/// A task latprof first sees already exiting (its first sleep is exit_aio's wait, after
/// exit_mm) is tracked as the kernel does, not refused: its sleeps count for the task and stay
/// out of the global table (no memory map), and its entry does not outlive the task. The
/// workload and its children run in a cgroup of their own, the only one traced, so the
/// counters are theirs.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_task_first_seen_exiting_is_tracked_and_freed() {
    let _guard = serial();
    let syms = Kallsyms::load().expect("kallsyms");
    // Direct I/O needs a real disk (not tmpfs).
    let dir = common::disk_dir();
    let name = format!("latprof-exiting-{}", std::process::id());
    let groups = common::cgroups::Cgroups::make(&[&name]);
    let mut work = Workload::spawn(&[
        "exit-aio",
        "--count",
        "20",
        "--dir",
        &dir,
        "--no-first-sleep",
    ]);
    common::cgroups::move_into(&work, groups.path(0));
    let probe = Probe::attach(ProbeConfig {
        mode: Mode::Lazy,
        cgroup_filter: vec![groups.path(0).to_path_buf()],
        ..defaults()
    })
    .expect("attach latprof");
    let mut collector = Collector::new();
    work.go();
    work.wait_done();
    let parent = work.pid();
    // Every child has exited and been reaped; each is freed a grace period later.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (snap, leaked) = loop {
        let snap = collector.snapshot(&probe).expect("snapshot");
        let leaked: Vec<u32> = snap
            .tasks
            .iter()
            .filter(|t| t.tgid != parent)
            .filter(|t| !std::path::Path::new(&format!("/proc/{}", t.tid)).exists())
            .map(|t| t.tid)
            .collect();
        if leaked.is_empty() || Instant::now() > deadline {
            break (snap, leaked);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    work.release();
    // No entry outlived its task.
    assert!(leaked.is_empty(), "entries of freed tasks: {leaked:?}");
    let counter = |c: Counter| snap.counters.get(c);
    // Each child's first traced sleep came after its exit began: tracked, not refused (all 20
    // here, a direct read of 8 MiB from disk still in flight; half, should a disk answer
    // sooner).
    let first_seen = counter(Counter::ExitingFirstSeen);
    assert!(
        (10..=20).contains(&first_seen),
        "{first_seen} first seen exiting"
    );
    // Their exit_aio waits counted as their own (no memory map), none in the global table.
    let no_mm = counter(Counter::NoMmSleeps);
    assert!(no_mm >= 10, "{no_mm} sleeps without a memory map");
    let global = model::global_causes(&snap, &syms, 12);
    assert!(
        frames_with(&global, "exit_aio").is_empty(),
        "exit_aio in the global table: {global:#?}"
    );
    drop(probe);
}

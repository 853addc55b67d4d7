//! Bad input on the command line: one clear line on stderr and a non-zero exit, before anything
//! is loaded into the kernel.
use std::process::{Command, Output, Stdio};

mod common;

use common::LATPROF;

fn latprof(args: &[&str]) -> Output {
    Command::new(LATPROF)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run latprof")
}

/// Exit 1 with exactly one stderr line, which contains `says`.
fn refused(out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// A value clap refuses (here `serve --listen`'s) is one line too, in latprof's words, exit 2
/// (clap's own message had three, without latprof's prefix); help still prints in full.
#[test]
fn unparsable_flags_are_one_line() {
    for args in [
        &["serve", "--listen", "localhost"][..],
        &["serve", "--no-such-flag"][..],
        &["stats", "--duration", "soon"][..],
    ] {
        let out = latprof(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("latprof: error: "), "{stderr}");
        assert!(stderr.contains(args[args.len() - 1]), "{stderr}");
    }
    let help = latprof(&["serve", "--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--listen"));
}

/// `top --interval 0` redrew as fast as it could (106% of a CPU); it is refused like
/// `record`'s.
#[test]
fn top_refuses_an_interval_under_10ms() {
    refused(
        &latprof(&["top", "--interval", "0"]),
        "--interval must be at least 10ms",
    );
}

/// Without a terminal `top` loaded its programs and only then failed; now it says so first
/// (nothing attached, no privileges needed to be told).
#[test]
fn top_without_a_terminal_says_so_first() {
    refused(&latprof(&["top"]), "latprof top needs a terminal");
}

/// `--pid` filters on the process: a thread's id matched nothing and gave an empty table
/// without a word.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn pid_of_a_thread_is_refused_with_its_process() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let mut work = Command::new(common::workload_bin())
        .args([
            "threads",
            "--count",
            "2",
            "--interval",
            "10ms",
            "--seconds",
            "20",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn workload");
    let pid = work.id();
    let tid = (0..100)
        .find_map(|_| {
            let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
                .ok()?
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .find(|&t| t != pid);
            if tid.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            tid
        })
        .expect("a thread of the workload");
    let out = latprof(&["stats", "--duration", "1s", "--pid", &tid.to_string()]);
    let _ = work.kill();
    let _ = work.wait();
    refused(&out, &format!("{tid} is a thread of process {pid}"));
}

/// A directory of its own for a test, removed at the end.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("latprof-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `--rotate` deleted and replaced existing FILE.1 ... FILE.K without `--force`, though
/// `record` refuses to replace FILE itself; now they are listed up front.
#[test]
fn record_refuses_to_rotate_over_existing_files() {
    let dir = TempDir::new("rotate");
    let file = dir.0.join("run.lpr");
    for n in [1, 3] {
        std::fs::write(dir.0.join(format!("run.lpr.{n}")), b"older\n").expect("write");
    }
    let path = file.to_str().expect("utf-8 path");
    refused(
        &latprof(&["record", "--rotate", "4K", "--duration", "1s", "-o", path]),
        &format!(
            "{path}.1, {path}.3 exist and --rotate would replace them; choose another name or pass --force"
        ),
    );
    assert!(!file.exists(), "nothing is created");
    assert_eq!(
        std::fs::read(dir.0.join("run.lpr.3")).expect("read"),
        b"older\n"
    );
}

/// `--max-tasks 4194304` was taken as asked: 8.6 GiB of kernel memory pinned (6.3 before
/// each record carried its cgroup, 7.3 before each task noted its waker, 7.6 before each kept
/// its last sleeps for `--chains`, 8.3 before each kept its pending waker, 8.5 before each
/// kept how far its last user walk read its stack). Table sizes over half of the memory available are refused, with the estimate, before anything is
/// created or loaded (and before the privileges are checked). The memory available is given
/// here, so that the test does not depend on this machine's.
#[test]
fn table_sizes_beyond_memory_are_refused_before_anything_loads() {
    // The total depends on the number of CPUs (per-CPU tables), the task table on the size of
    // a task's state (about 2 KiB): the message names each table with its share.
    let says = "(--max-tasks 1048576: 2.";
    let over = ["--max-tasks", "1048576", "--debug-mem-available", "2G"];
    let stats: Vec<&str> = ["stats", "--duration", "1s"]
        .iter()
        .chain(&over)
        .copied()
        .collect();
    let out = latprof(&stats);
    refused(&out, says);
    refused(&out, "the kernel tables would pin about ");
    refused(&out, " GiB, --max-records 16384: ");
    refused(
        &out,
        "over half of the 2.0 GiB available; lower --max-tasks",
    );
    let dir = TempDir::new("memory");
    let file = dir.0.join("run.lpr");
    let record: Vec<&str> = ["record", "--duration", "1s", "-o"]
        .iter()
        .copied()
        .chain([file.to_str().expect("utf-8 path")])
        .chain(over)
        .collect();
    refused(&latprof(&record), says);
    assert!(!file.exists(), "nothing is created");
}

/// Exit 2 (bad input) with exactly one stderr line, `latprof: error: ` and `says`.
fn bad_input(args: &[&str], says: &str) {
    let out = latprof(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.starts_with("latprof: error: "), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

/// N14: `dump` and `replay` took the flags that set up the kernel probes and ignored them
/// (`dump --cgroup X` printed every cgroup's numbers, exit 0). They are refused, before the
/// file is read (it need not exist), on either side of the command; the flags these commands
/// use still work.
#[test]
fn recording_commands_refuse_the_probes_flags() {
    let dir = TempDir::new("offline");
    let file = dir.0.join("none.lpr");
    let file = file.to_str().expect("utf-8 path");
    for (flags, says) in [
        (
            &["--cgroup", "/sys/fs/cgroup"][..],
            "--cgroup is for the commands that probe the kernel",
        ),
        (&["--mode", "normal"], "--mode is for"),
        (&["--user-stacks"], "--user-stacks is for"),
        (&["--waker-stacks"], "--waker-stacks is for"),
        (&["--max-tasks", "100"], "--max-tasks is for"),
        (&["--max-records", "100"], "--max-records is for"),
        (&["--max-stacks", "100"], "--max-stacks is for"),
        (&["--max-wakers", "100"], "--max-wakers is for"),
        (&["--max-user-stacks", "100"], "--max-user-stacks is for"),
        (&["--all-sleeps"], "--all-sleeps is for"),
        (&["--inter-cutoff", "1ms"], "--inter-cutoff is for"),
        (&["--include-self"], "--include-self is for"),
        (&["--spike", "1ms"], "--spike is for"),
        (&["--wakeup", "always"], "--wakeup is for"),
        (&["--no-stack-cache"], "--no-stack-cache is for"),
        (&["--debug-checks"], "--debug-checks is for"),
        (
            &["--debug-checks", "--log", "/dev/null"],
            "--debug-checks, --log are for",
        ),
        (
            &["--mode", "lazy", "--cgroup", "/x"],
            "--mode, --cgroup are for",
        ),
    ] {
        for command in [&["dump", file][..], &["replay", file]] {
            let after: Vec<&str> = command.iter().chain(flags).copied().collect();
            bad_input(&after, says);
            let before: Vec<&str> = flags.iter().chain(command).copied().collect();
            bad_input(&before, says);
        }
    }
    // replay draws no waker chains: --wakers is refused there, and taken by dump.
    bad_input(&["replay", file, "--wakers"], "--wakers is for");
    // Flags the command uses get as far as reading the file.
    for args in [
        &["dump", file, "--stack-depth", "3"][..],
        &["dump", file, "--wakers", "--format", "folded"],
        &["replay", file, "--stack-depth", "3"],
    ] {
        refused(&latprof(args), "cannot read");
    }
}

/// `--log FILE` holds the lines of `--debug-checks`, and nothing else: without it the file
/// was neither created nor mentioned.
#[test]
fn log_without_debug_checks_is_refused() {
    let dir = TempDir::new("log");
    let log = dir.0.join("latprof.log");
    let log = log.to_str().expect("utf-8 path");
    for args in [
        &["stats", "--duration", "1s", "--log", log][..],
        &["--log", log, "spikes"],
        &["top", "--log", log],
    ] {
        bad_input(args, "--log FILE takes the log of --debug-checks");
    }
    assert!(!dir.0.join("latprof.log").exists());
}

/// `record --duration 1ns` extrapolated its two snapshots, taken within milliseconds, to
/// "507.2 MB per hour"; under two whole intervals it says it cannot tell.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recording_too_short_for_a_rate_says_so() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let dir = TempDir::new("short");
    let file = dir.0.join("run.lpr");
    let out = latprof(&[
        "record",
        "--duration",
        "1ns",
        "-o",
        file.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let last = stderr
        .lines()
        .find(|l| l.contains("--duration reached"))
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    assert!(
        last.contains("too short to estimate a rate per hour") && !last.contains("MB per hour"),
        "{last}"
    );
}

/// A full disk while recording: the error said only the errno, and the file ended inside a
/// frame, which `dump` then blamed on "the recorder was killed?". The error says the disk is
/// full, and the file ends at its last whole frame, marked as ended by the full disk.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_full_disk_while_recording_is_said_so() {
    struct Unmount<'a>(&'a str);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let dir = TempDir::new("enospc");
    let mnt = dir.0.join("small");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mnt_s = mnt.to_str().expect("utf-8 path");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "latprof-test", mnt_s])
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount -t tmpfs on {mnt_s}");
    // Unmounted however the test ends.
    let _unmount = Unmount(mnt_s);
    let file = mnt.join("run.lpr");
    // Snapshots every 10 ms fill 64 KB within seconds (every frame holds the tick counters
    // of each CPU); the duration only bounds the test if they do not.
    let out = latprof(&[
        "record",
        "--interval",
        "10ms",
        "--duration",
        "60s",
        "-o",
        file.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("latprof: error: writing ") && last.contains("the disk is full"),
        "{stderr}"
    );
    let dump = latprof(&["dump", "--info", file.to_str().expect("utf-8 path")]);
    let info = String::from_utf8_lossy(&dump.stderr);
    assert!(dump.status.success(), "{info}");
    assert!(info.contains("finished: the disk was full"), "{info}");
    assert!(!info.contains("killed"), "{info}");
}

/// `--version` names the version and the commit latprof was built from.
#[test]
fn version_names_the_commit() {
    let out = latprof(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(head.len(), 12, "a git checkout");
    assert_eq!(
        text.trim(),
        format!("latprof {} ({head})", env!("CARGO_PKG_VERSION"))
    );
}

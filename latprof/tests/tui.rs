//! `latprof top` in a real terminal: tmux runs it as root next to a known workload; the test
//! types keys and reads the screen as a person would.
//!
//! Needs root and tmux; `cargo xtask test` runs it (`#[ignore]`d for a plain `cargo test`).
use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

mod common;

use common::{LATPROF, tmux::Tmux};

struct Workload(Child);

impl Workload {
    /// Sleeps 3 ms in a loop until killed.
    fn sleeper() -> Self {
        Self(
            Command::new(common::workload_bin())
                .args(["sleep", "--count", "1000000", "--interval", "3ms"])
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn workload"),
        )
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_in_a_real_terminal() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let work = Workload::sleeper();
    let pid = work.0.id().to_string();
    // The shell line reports how latprof exited, then keeps the pane open to be read.
    let tmux = Tmux::start(&format!(
        "{LATPROF} top --wakers --interval 300ms; echo LATPROF-EXIT=$?; sleep 60"
    ));

    // The workload's reason row, with its numbers.
    let screen = tmux.wait_for(&[
        "Global causes",
        "Application requested delay",
        "ev/s",
        "lazy (stack cache)",
    ]);
    assert!(
        tmux.alternate_screen(),
        "top should own the alternate screen:\n{screen}"
    );

    // Filter the processes to the workload's pid.
    tmux.keys(&["/"]);
    tmux.keys(&[&pid, "Enter"]);
    let screen = tmux.wait_for(&[
        &format!("Processes matching '{pid}'"),
        &format!("Causes of {pid}"),
    ]);
    assert!(
        screen.contains(&format!(" {pid} ")),
        "workload line missing:\n{screen}"
    );

    // Sort by max, then back to total.
    tmux.keys(&["s"]);
    tmux.wait_for(&["sort:max"]);
    tmux.keys(&["s", "s", "s"]);
    tmux.wait_for(&["sort:total"]);

    // Drill into the global top cause: backtrace, processes, wakers, histogram. A nanosleep
    // is woken by the timer interrupt.
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for(&[
        "Backtrace 1",
        "hrtimer_nanosleep",
        "Latency histogram",
        "Woken by",
        "interrupt: timer",
    ]);
    assert!(
        screen.contains(&pid),
        "per-process breakdown lacks the workload:\n{screen}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait_for(&["Global causes"]);

    // Quit: latprof exits 0 and gives the terminal back.
    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&["LATPROF-EXIT=0"]);
    assert!(!tmux.alternate_screen(), "terminal not restored:\n{screen}");
    assert!(
        !screen.contains("Global causes"),
        "TUI left on the screen:\n{screen}"
    );
}

/// A duration as top prints it (`502ms`, `5.55ms`, `1.02s`, `42us`), in nanoseconds.
fn nanos(text: &str) -> f64 {
    let at = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or_else(|| panic!("no unit in {text:?}"));
    let (n, unit) = text.split_at(at);
    let n: f64 = n
        .parse()
        .unwrap_or_else(|_| panic!("not a duration: {text:?}"));
    n * match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => panic!("unit of {text:?}"),
    }
}

/// Seconds since top's first snapshot, from its header (`up H:MM:SS`), if shown.
fn up_secs(screen: &str) -> Option<u64> {
    let (_, rest) = screen.split_once(" up ")?;
    let clock = rest.split_whitespace().next()?;
    clock
        .split(':')
        .try_fold(0, |secs, part| Some(secs * 60 + part.parse::<u64>().ok()?))
}

/// The (count, total) of the row `reason` in the causes pane on `screen`, if shown.
fn cause_row(screen: &str, reason: &str) -> Option<(u64, String)> {
    let row = screen
        .lines()
        .find_map(|l| l.split_once(&format!("││{reason}")))?
        .1;
    let mut words = row.split_whitespace();
    let count = words.next()?.parse().ok()?;
    let total = words.next()?.to_owned();
    Some((count, total))
}

/// top's rows against a workload's own numbers: 100 nanosleeps of 5 ms, started after top
/// attached; its process's row for them shows every one that slept (the workload counts them),
/// short only by its own sleeps whose wakeup the kernel hid (recovered on their own row, or
/// lost: a `stats` beside top, on the same events, says which), and their total, at least
/// 4.9 ms each and at most what the workload timed around them itself.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_rows_match_a_workloads_own_numbers() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let mut work = common::Workload::spawn(&["sleep", "--count", "100", "--interval", "5ms"]);
    let pid = work.pid().to_string();
    let mut stats = Command::new(LATPROF);
    stats
        .args([
            "stats",
            "--all-sleeps",
            "--format",
            "json",
            "--duration",
            "120s",
        ])
        .args(["--pid", &pid])
        .stdout(Stdio::piped());
    let (stats, stats_err) = common::start(&mut stats, "attached");
    // top's first snapshot, from which its header counts the seconds up, comes after this.
    let started = std::time::Instant::now();
    let tmux = Tmux::start(&format!(
        "{LATPROF} top --all-sleeps --interval 300ms; echo LATPROF-EXIT=$?; sleep 60"
    ));
    tmux.wait_for(&["Global causes"]);
    work.go();
    let facts = work.wait_done();
    let (slept, own_total) = (
        common::fact(&facts, "slept"),
        common::fact(&facts, "total_ns"),
    );
    // Its last nanosleep, if the kernel hid its wakeup, is recovered when it sleeps again.
    work.wait_blocked();
    // A snapshot of top's taken more seconds after its first than have passed since
    // `started` was taken after this: after the work.
    let after_work = started.elapsed().as_secs() + 1;
    let (out, rest) = common::interrupt(stats, stats_err);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    // The same kernel events as top's: its own sleeps lost or recovered without a backtrace,
    // and those under 1 us, not counted by latencytop's rule.
    let missing = common::own_missing(&doc, work.pid());
    // Its causes from a snapshot taken after the work: the row holds all of it. The same
    // row twice running, so that a capture of a frame half drawn (the header new, the rows
    // still the frame's before) is not the one judged.
    tmux.keys(&["/"]);
    tmux.keys(&[&pid, "Enter"]);
    let last = std::cell::RefCell::new(None);
    let (screen, (count, total)) = tmux.wait_until(|screen| {
        if !screen.contains(&format!("Causes of {pid}")) {
            return Err(format!("not the causes of {pid}"));
        }
        let up = up_secs(screen).ok_or("no time up in the header")?;
        if up < after_work {
            return Err(format!(
                "top {up} s up, its snapshot not after the work ({after_work} s)"
            ));
        }
        let row = cause_row(screen, "Application requested delay").ok_or("no nanosleep row")?;
        let seen = (up, row);
        if last.borrow().as_ref() == Some(&seen) {
            return Ok((screen.to_owned(), seen.1));
        }
        *last.borrow_mut() = Some(seen);
        Err("the row once; looking again".to_owned())
    });
    if let Err(why) = common::exact_count(count, slept, missing) {
        panic!("top's row: {why}\n{screen}\n{rest}");
    }
    // Printed with 3 significant digits: within 0.5%.
    let total = nanos(&total);
    #[expect(clippy::cast_precision_loss, reason = "nanoseconds of a short test")]
    let (low, high) = (count as f64 * 4.9e6, own_total as f64);
    assert!(
        total >= low * 0.995 && total <= high * 1.005,
        "top's total {total} ns for {count} sleeps of 5 ms, the workload's own {own_total} ns:\n{screen}"
    );
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    work.release();
}

/// Issue 15: the cgroups pane lists each cgroup with its sleeps; Enter on one shows only it
/// (its causes, its processes, each process's cgroup named), Esc shows everything again.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_shows_cgroups_and_one_at_a_time() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    // Short enough for the processes pane's cgroup column.
    let name = format!("lt{}.service", std::process::id());
    let groups = common::cgroups::Cgroups::make(&[&name]);
    let work = Workload::sleeper();
    let pid = work.0.id().to_string();
    common::cgroups::move_pid(work.0.id(), groups.path(0));
    let tmux = Tmux::start(&format!(
        "{LATPROF} top --interval 300ms; echo LATPROF-EXIT=$?; sleep 60"
    ));
    tmux.wait_for(&["Global causes", "Application requested delay"]);
    tmux.keys(&["C"]);
    tmux.wait_for(&["Cgroups (Enter", &name]);
    // Paused, the order holds still: go down to the cgroup's line.
    tmux.keys(&["Space"]);
    let screen = tmux.wait_for(&["PAUSED"]);
    let lines: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.contains("Cgroups (Enter"))
        .skip(2)
        .collect();
    let at = lines
        .iter()
        .position(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("no {name} line:\n{screen}"));
    for _ in 0..at {
        tmux.keys(&["Down"]);
    }
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for(&[
        &format!("Causes in cgroup {name}"),
        &format!("Processes in {name}"),
        "Application requested delay",
    ]);
    let row = screen
        .lines()
        .find(|l| l.contains(&format!(" {pid} ")))
        .unwrap_or_else(|| panic!("the workload is not in it:\n{screen}"));
    assert!(row.contains(&name), "its row names its cgroup:\n{screen}");
    tmux.keys(&["Escape"]);
    tmux.wait_for(&["Global causes"]);
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    drop(work);
}

/// D16: a hangup (the terminal closed, ssh dropped) stops `top` as `q` does: the terminal
/// comes back cooked, with echo, out of the alternate screen.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn a_hangup_gives_the_terminal_back() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let tmux = Tmux::start(&format!(
        "{LATPROF} top --interval 300ms; echo LATPROF-EXIT=$?; echo MODES $(stty -a | tr ' ;' '\\n\\n' | grep -x -e -icanon -e icanon -e -echo -e echo); sleep 60"
    ));
    tmux.wait_for(&["Global causes"]);
    let pane = tmux.display("#{pane_pid}");
    let status = Command::new("pkill")
        .args(["-HUP", "-P", &pane, "-x", "latprof"])
        .status()
        .expect("pkill");
    assert!(status.success(), "no latprof under pane {pane}");
    let screen = tmux.wait_for(&["LATPROF-EXIT=", "MODES"]);
    assert!(screen.contains("LATPROF-EXIT=0"), "{screen}");
    assert!(screen.contains("MODES icanon echo"), "{screen}");
    assert!(!tmux.alternate_screen(), "terminal not restored:\n{screen}");
}

/// A new temporary directory for a recording, and the recording's path in it.
fn recording_dir(tag: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("latprof-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("run.lpr").to_str().expect("utf-8 path").to_owned();
    (dir, path)
}

/// A one-thread process's voluntary context switches (each one a sleep begun), read from /proc
/// every millisecond with CLOCK_MONOTONIC (the clock of a recording's snapshots) before and
/// after each reading.
struct Switches {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(u64, u64, u64)>>,
}

/// What `Switches` read: (clock before, clock after, switches so far).
struct Samples(Vec<(u64, u64, u64)>);

impl Switches {
    fn sample(pid: u32) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let before = latprof::time::monotonic_ns();
                let n = common::voluntary_switches(pid);
                let after = latprof::time::monotonic_ns();
                samples.push((before, after, n));
                std::thread::sleep(Duration::from_millis(1));
            }
            samples
        });
        Self { stop, thread }
    }

    fn stop(self) -> Samples {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        Samples(self.thread.join().expect("sampling thread"))
    }
}

impl Samples {
    /// The sleeps begun by time `t`: (at least, at most), from the last reading that ended
    /// by `t` and the first that began after it.
    fn began_by(&self, t: u64) -> (u64, u64) {
        let least = self
            .0
            .iter()
            .rev()
            .find_map(|&(_, after, n)| (after <= t).then_some(n))
            .unwrap_or_else(|| panic!("no reading before {t}"));
        let most = self
            .0
            .iter()
            .find_map(|&(before, _, n)| (before >= t).then_some(n))
            .unwrap_or_else(|| panic!("no reading after {t}"));
        (least, most)
    }
}

/// A sleeper in a new cgroup `name` of its own: the cgroup, the sleeper and its pid.
fn sleeper_in_cgroup(name: &str) -> (common::cgroups::Cgroups, Workload, String) {
    let groups = common::cgroups::Cgroups::make(&[name]);
    let work = Workload::sleeper();
    common::cgroups::move_pid(work.0.id(), groups.path(0));
    let pid = work.0.id().to_string();
    (groups, work, pid)
}

/// Waits (at most 20 s) until the recording at `path`, still being written, holds a snapshot
/// taken more than `span` after its first (`pid` a process alive throughout): a moment
/// `span` in then names a snapshot already taken, whatever comes after.
fn wait_until_recorded(path: &str, pid: &str, span: Duration) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // Its first and last whole snapshots (none yet: it fails), of one process (alive
        // throughout): a short document.
        let out = Command::new(LATPROF)
            .args([
                "dump", path, "--pid", pid, "--from", "start", "--format", "json",
            ])
            .output()
            .expect("latprof dump");
        let recorded = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .filter(|_| out.status.success())
            .and_then(|doc| {
                let at = |end: &str| doc[end]["monotonic_ns"].as_u64();
                Some(at("to")?.saturating_sub(at("from")?))
            })
            .unwrap_or(0);
        if u128::from(recorded) > span.as_nanos() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} recorded {recorded} ns, not past {span:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `replay PATH` as nobody in a real terminal, after making the recording's directory
/// readable to all.
fn replay_as_nobody(dir: &std::path::Path, path: &str) -> Tmux {
    let status = Command::new("chmod")
        .args(["-R", "a+rX", dir.to_str().expect("utf-8")])
        .status()
        .expect("chmod");
    assert!(status.success());
    Tmux::start(&format!(
        "runuser -u nobody -- {LATPROF} replay {path}; echo LATPROF-EXIT=$?; sleep 60"
    ))
}

#[test]
#[ignore = "needs root (to record) and tmux: run `cargo xtask test`"]
fn replay_in_a_real_terminal_without_root() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let (dir, path) = recording_dir("replay");
    // The sleeper in a cgroup of its own: the recording keeps its name (issue 15).
    let name = format!("latprof-replay-{}.service", std::process::id());
    let (_groups, work, pid) = sleeper_in_cgroup(&name);
    // The sleeper's own count of its sleeps, by the clock of the recording's snapshots.
    let switches = Switches::sample(work.0.id());
    // Every sleep counted (--all-sleeps): a 3 ms nanosleep made late past latencytop's 5 ms
    // cutoff by a busy machine is still one of the sleeper's sleeps.
    let out = Command::new(LATPROF)
        .args([
            "record",
            "--all-sleeps",
            "--wakers",
            "--duration",
            "3s",
            "--interval",
            "250ms",
            "--force",
            "-o",
            &path,
        ])
        .output()
        .expect("latprof record");
    let switches = switches.stop();
    let record_err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{record_err}");
    // Any sleep the recording lost or recovered without a backtrace was checked against the
    // stretches where the kernel hid switches (this fails on any other).
    common::reported_missing(&record_err);

    // As an unprivileged user: no eBPF, only the file.
    let tmux = replay_as_nobody(&dir, &path);
    let screen = tmux.wait_for(&[
        "replay ",
        "Application requested delay",
        "showing: since the start",
        // The variant of the programs that recorded, from the recording's facts.
        "(stack cache)",
    ]);
    assert!(
        screen.contains("#12/12") || screen.contains("#13/13"),
        "opens at the end:\n{screen}"
    );

    // Jump to +1s, mark A, step forward 4 snapshots: the difference of the two.
    tmux.keys(&["t"]);
    tmux.wait_for(&["jump to"]);
    tmux.keys(&["+1s", "Enter"]);
    // The read nearest one second in, the fourth at 250 ms: its header says +1s, or +0s
    // where that read came a little before its second was full (whole seconds shown).
    tmux.wait_for(&[" #4/"]);
    tmux.keys(&["m"]);
    tmux.wait_for(&["showing A"]);
    tmux.keys(&["]", "]", "]", "]"]);
    let screen = tmux.wait_for(&[" #8/", "-> now: ", "Application requested delay"]);
    assert!(screen.contains("Global causes"), "{screen}");
    // The workload's own causes between A and B: exactly what the recording holds for its
    // process between those two moments (`dump` reads the same file), and that every sleep
    // the sleeper itself counted between them (other tests' sleepers share the global pane,
    // not this one).
    tmux.keys(&["/"]);
    tmux.keys(&[&pid, "Enter"]);
    let screen = tmux.wait_for(&[&format!("Causes of {pid}")]);
    let count: u64 = screen
        .lines()
        .find_map(|l| l.split_once("││Application requested delay"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count on the workload's reason row:\n{screen}"));
    let window = |from: &str, to: &str| -> serde_json::Value {
        let dump = common::output_of(
            Command::new(LATPROF)
                .args(["dump", &path, "--pid", &pid, "--from", from, "--to", to])
                .args(["--format", "json"]),
        );
        serde_json::from_slice(&dump).expect("dump's JSON")
    };
    // A and B, the snapshots the screen named.
    let doc = window("#4", "#8");
    let recorded: u64 = doc["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| c["reason"] == "Application requested delay")
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(count, recorded, "between A and B:\n{screen}");
    // The snapshot before each: where its read of the tables began at the earliest.
    let before = window("#3", "#7");
    let at =
        |doc: &serde_json::Value, end: &str| doc[end]["monotonic_ns"].as_u64().expect("a time");
    let (t3, t4, t7, t8) = (
        at(&before, "from"),
        at(&doc, "from"),
        at(&before, "to"),
        at(&doc, "to"),
    );
    // Every sleep of the sleeper counted between A and B ended between the reads of its
    // tables for A and for B: after t3 and by t8; and every sleep that ended after t4 and by
    // t7 is counted there. The sleeper's sleep k ends after it began and before sleep k + 1
    // begins, and /proc says how many had begun (around each of our readings): so at most the
    // sleeps begun by t8 less those begun by t3, and one more (the one going on at t3), and at
    // least those begun after t4 whose successor began by t7. A sleep recovered after a
    // hidden wakeup is counted as its successor begins: one more at the start.
    // Its sleeps: its causes but its waits for a CPU (`record` counts those too).
    let all: u64 = doc["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| c["kind"] != "runqueue")
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    let recovered = common::recovered_blind(&doc);
    let (most, least) = (
        switches.began_by(t8).1 - switches.began_by(t3).0 + 1 + recovered,
        switches
            .began_by(t7)
            .0
            .saturating_sub(switches.began_by(t4).1 + 1),
    );
    let missing = common::own_missing(&doc, work.0.id());
    assert!(
        count <= all && all <= most && all + missing >= least,
        "{count} nanosleeps and {all} sleeps between A and B, {missing} missing; the sleeper's \
         own count: at least {least}, at most {most}:\n{screen}"
    );

    // The recording's wakers, in the top cause's detail (issue 16).
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for(&["Backtrace 1", "Woken by"]);
    assert!(!screen.contains("(wakers off"), "{screen}");
    tmux.keys(&["Escape"]);
    tmux.wait_for(&["Global causes"]);

    // The cgroups pane, from the recording.
    tmux.keys(&["Escape", "C"]);
    tmux.wait_for(&["Cgroups (Enter", &name]);
    tmux.keys(&["C"]);

    // Back one step, the help, then quit.
    tmux.keys(&["["]);
    tmux.wait_for(&["#7/"]);
    tmux.keys(&["?"]);
    tmux.wait_for(&["jump to +30s"]);
    tmux.keys(&["?"]);
    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&["LATPROF-EXIT=0"]);
    assert!(!tmux.alternate_screen(), "terminal not restored:\n{screen}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `top --debug-checks` logged to `$TMPDIR/latprof-PID.log`, opened with File::create: links
/// planted at the next PIDs' names made root overwrite their targets. The log now has a name
/// nobody can guess, is created new and readable by root only.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_debug_log_has_a_name_nobody_can_guess() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let dir = std::env::temp_dir().join(format!("latprof-toplog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let d = dir.to_str().expect("utf-8 path");
    // The inner shell writes its pid and becomes latprof (exec keeps the pid).
    let tmux = Tmux::start(&format!(
        "sh -c 'echo $$ > {d}/pid; TMPDIR={d} exec {LATPROF} top --debug-checks --interval 300ms' 2>{d}/stderr; echo LATPROF-EXIT=$?; sleep 60"
    ));
    tmux.wait_for(&["Global causes"]);
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    let pid = std::fs::read_to_string(dir.join("pid")).expect("latprof's pid");
    let stderr = std::fs::read_to_string(dir.join("stderr")).expect("latprof's stderr");
    let log = stderr
        .lines()
        .find_map(|l| l.strip_prefix("latprof: the eBPF debug log is in "))
        .unwrap_or_else(|| panic!("top did not name its log: {stderr}"));
    let log = std::path::Path::new(log);
    assert_eq!(log.parent(), Some(dir.as_path()), "{stderr}");
    let name = log.file_name().and_then(|n| n.to_str()).expect("a name");
    assert_ne!(
        name,
        format!("latprof-{}.log", pid.trim()),
        "a name one can guess"
    );
    assert!(
        name.starts_with("latprof-")
            && log.extension().is_some_and(|e| e == "log")
            && name.len() >= 20,
        "{name}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(log).expect("the log").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{name}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 15: a cgroup removed while `top` runs is marked removed in the cgroups pane at the
/// next snapshot, its numbers kept.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_marks_a_removed_cgroup() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let name = format!("lpgone{}.service", std::process::id());
    let groups = common::cgroups::Cgroups::make(&[&name]);
    let work = Workload::sleeper();
    common::cgroups::move_pid(work.0.id(), groups.path(0));
    let tmux = Tmux::start(&format!(
        "{LATPROF} top --interval 300ms; echo LATPROF-EXIT=$?; sleep 60"
    ));
    tmux.wait_for(&["Global causes", "Application requested delay"]);
    tmux.keys(&["C"]);
    let screen = tmux.wait_for(&["Cgroups (Enter", &name]);
    assert!(
        !screen.contains(&format!("{name} (removed)")),
        "removed before it was:\n{screen}"
    );
    drop(work);
    common::cgroups::remove_dir(groups.path(0));
    assert!(!groups.path(0).exists(), "the cgroup is still there");
    tmux.wait_for(&[&format!("{name} (removed)")]);
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
}

/// Issue 15: on a host with the legacy hierarchy only (cgroup2 unmounted in a mount namespace
/// of its own), `top` says in its status line that cgroup views are not available.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn top_says_when_cgroup_views_are_not_available() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let dir = std::env::temp_dir().join(format!("latprof-legacy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = dir.join("no-cgroup2.sh");
    std::fs::write(&script, common::cgroups::NO_CGROUP2).expect("write the script");
    let tmux = Tmux::start(&format!(
        "unshare -m --propagation private sh {} {LATPROF} top --interval 300ms; echo LATPROF-EXIT=$?; sleep 60",
        script.display()
    ));
    tmux.wait_for(&["Global causes", "cgroup views are not available"]);
    tmux.keys(&["C"]);
    tmux.wait_for(&["Cgroups: none"]);
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 15 in `replay`, as `nobody`, after the cgroup is gone: the cgroups pane marks it
/// removed; Enter on it shows only it (its causes, its processes with their cgroup named in
/// their row) and the histogram and spikes panes say that they are all cgroups' (a recording
/// keeps histograms summed; spikes carry no cgroup).
#[test]
#[ignore = "needs root (to record) and tmux: run `cargo xtask test`"]
fn replay_filters_by_a_removed_cgroup() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let (dir, path) = recording_dir("replaycg");
    // Short enough for the processes pane's cgroup column.
    let name = format!("lr{}.service", std::process::id());
    let (groups, work, pid) = sleeper_in_cgroup(&name);
    let mut cmd = Command::new(LATPROF);
    cmd.args([
        "record",
        "--duration",
        "3s",
        "--interval",
        "250ms",
        "--force",
        "-o",
        &path,
    ])
    .stdout(Stdio::null());
    let (recorder, mut stderr) = common::start(&mut cmd, "recording to");
    // Recorded in its cgroup past the snapshot nearest one second in (which the test shows
    // below), then the cgroup removed before the end.
    wait_until_recorded(&path, &pid, Duration::from_millis(1000 + 250 / 2));
    drop(work);
    common::cgroups::remove_dir(groups.path(0));
    assert!(!groups.path(0).exists(), "the cgroup is still there");
    let out = recorder.wait_with_output().expect("latprof record");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(out.status.success(), "{rest}");

    let tmux = replay_as_nobody(&dir, &path);
    tmux.wait_for(&["replay ", "Application requested delay"]);
    // At the end: the cgroup is gone, its numbers kept.
    tmux.keys(&["C"]);
    let screen = tmux.wait_for(&["Cgroups (Enter", &format!("{name} (removed)")]);
    let lines: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.contains("Cgroups (Enter"))
        .skip(2)
        .collect();
    let at = lines
        .iter()
        .position(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("no {name} line:\n{screen}"));
    for _ in 0..at {
        tmux.keys(&["Down"]);
    }
    tmux.keys(&["Enter"]);
    tmux.wait_for(&[
        &format!("Causes in cgroup {name}"),
        &format!("Processes in {name}"),
        "Application requested delay",
        "Recent spikes (all cgroups)",
    ]);
    // One second in, the workload was alive: its row names its cgroup.
    tmux.keys(&["t"]);
    tmux.wait_for(&["jump to"]);
    tmux.keys(&["+1s", "Enter"]);
    // The read nearest one second in, the fourth at 250 ms: its header says +1s, or +0s
    // where that read came a little before its second was full (whole seconds shown).
    let screen = tmux.wait_for(&[" #4/", &format!("Processes in {name}"), &pid]);
    let row = screen
        .lines()
        .find(|l| l.contains(&format!(" {pid} ")))
        .unwrap_or_else(|| panic!("no row of {pid}:\n{screen}"));
    assert!(row.contains(&name), "its cgroup not in its row:\n{screen}");
    assert!(screen.contains("Cgroup"), "no cgroup column:\n{screen}");
    // The cgroup's top cause: its histogram is the recording's sum over all cgroups.
    tmux.keys(&["Enter"]);
    tmux.wait_for(&["Backtrace 1", "Latency histogram, all cgroups"]);
    tmux.keys(&["Escape"]);
    tmux.wait_for(&[&format!("Causes in cgroup {name}")]);
    // Esc again: every cgroup.
    tmux.keys(&["Escape"]);
    let screen = tmux.wait_for(&["Global causes"]);
    assert!(!screen.contains("(all cgroups)"), "{screen}");
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The detail pane's text lines (its left column), from the line under its title to its
/// bottom border.
fn detail_pane(screen: &str) -> Vec<String> {
    screen
        .lines()
        .skip_while(|l| !l.contains("┌Detail"))
        .skip(1)
        .take_while(|l| !l.starts_with('└'))
        .map(|l| {
            l.trim_start_matches('│')
                .split('│')
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .collect()
}

/// The detail's backtraces: each one's lines after its `Backtrace N` heading.
fn backtraces(pane: &[String]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for line in pane {
        if line.starts_with("Backtrace ") {
            out.push(Vec::new());
        } else if let Some(bt) = out.last_mut()
            && !line.is_empty()
        {
            bt.push(line.clone());
        }
    }
    out
}

/// The backtrace of the detail that holds the server's innermost frame.
fn server_backtrace(backtraces: &[Vec<String>]) -> Result<&Vec<String>, String> {
    backtraces
        .iter()
        .find(|bt| {
            bt.iter()
                .any(|l| common::ustacks::function(l) == common::ustacks::SERVER_FRAMES[0])
        })
        .ok_or_else(|| "no backtrace with the server's frames".to_owned())
}

/// Issue 17: `top --user-stacks` titles the server's pipe wait by its own function, its detail
/// shows the user frames under the kernel frames (innermost first, under `user:`), and `u`
/// shows the kernel frames only, then the user frames only, then both again.
#[test]
#[ignore = "needs root, gcc and tmux: run `cargo xtask test`"]
fn top_shows_user_frames_under_the_kernel_frames() {
    use common::ustacks::{SERVER_FRAMES, build_server, has_server_chain};
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let dir = std::env::temp_dir().join(format!("latprof-ustop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let server = build_server(&dir, "server", true);
    // The server alone in a cgroup that top watches (filtered in the kernel): the test waits
    // for its frames, not for every process's on a busy machine to be named.
    let name = format!("lpus{}.service", std::process::id());
    let groups = common::cgroups::Cgroups::make(&[&name]);
    // A request every 2 ms: its pipe waits are counted (under --inter-cutoff).
    let work = Workload(
        Command::new(&server)
            .args(["1000000", "2000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the server"),
    );
    let pid = work.0.id().to_string();
    common::cgroups::move_pid(work.0.id(), groups.path(0));
    let tmux = Tmux::start(&format!(
        "{LATPROF} top --user-stacks --cgroup {} --pid {pid} --interval 300ms; echo LATPROF-EXIT=$?; sleep 60",
        groups.path(0).display()
    ));
    // The global pane (full width) names the wait by the server's function beside the reason.
    tmux.wait_for(&[
        "Waiting for a pipe in wait_for_request",
        &format!("Causes of {pid} server"),
    ]);
    tmux.open_cause(&pid, "Waiting for a pipe in wait_for");

    // Both: the kernel's frames, then `user:`, then the server's frames innermost first.
    tmux.wait_until(|screen| {
        if !screen.contains("Detail: kernel + user frames") {
            return Err("not the detail of both".to_owned());
        }
        let both = backtraces(&detail_pane(screen));
        let bt = server_backtrace(&both)?;
        let user_at = bt
            .iter()
            .position(|l| l == "user:")
            .ok_or("no user: heading")?;
        let (kernel, user) = (&bt[..user_at], &bt[user_at + 1..]);
        if !kernel.iter().any(|l| l == "vfs_read") {
            return Err(format!("no kernel frames above the user's: {kernel:?}"));
        }
        if !has_server_chain(user) {
            return Err(format!("user frames {user:?}"));
        }
        Ok(())
    });

    // Kernel frames only: the same kernel frames, no user frame.
    tmux.keys(&["u"]);
    tmux.wait_until(|screen| {
        if !screen.contains("Detail: kernel frames only") {
            return Err("not the detail of kernel frames".to_owned());
        }
        let pane = detail_pane(screen);
        if !backtraces(&pane).concat().iter().any(|l| l == "vfs_read") {
            return Err("no kernel frames".to_owned());
        }
        match pane
            .iter()
            .find(|l| *l == "user:" || SERVER_FRAMES.contains(&common::ustacks::function(l)))
        {
            Some(l) => Err(format!("{l} in the kernel frames' view")),
            None => Ok(()),
        }
    });

    // User frames only: the server's chain, no kernel frame.
    tmux.keys(&["u"]);
    tmux.wait_until(|screen| {
        if !screen.contains("Detail: user frames only") {
            return Err("not the detail of user frames".to_owned());
        }
        let user_only = backtraces(&detail_pane(screen));
        let bt = server_backtrace(&user_only)?;
        if !has_server_chain(bt) {
            return Err(format!("user frames {bt:?}"));
        }
        match user_only
            .concat()
            .iter()
            .find(|l| *l == "vfs_read" || *l == "user:")
        {
            Some(l) => Err(format!("{l} in the user frames' view")),
            None => Ok(()),
        }
    });

    // And both again.
    tmux.keys(&["u"]);
    tmux.wait_for(&["Detail: kernel + user frames"]);
    tmux.keys(&["Escape"]);
    tmux.wait_for(&["Global causes"]);
    tmux.keys(&["q"]);
    tmux.wait_for(&["LATPROF-EXIT=0"]);
    drop(work);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `stats` at a terminal whose table comes out empty says what to try next, in one line after
/// the table; redirected, its output stays latencytop's empty table, byte for byte.
#[test]
#[ignore = "needs root and tmux: run `cargo xtask test`"]
fn stats_at_a_terminal_says_what_to_try_when_nothing_was_counted() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    // One process that sleeps, unwoken, the whole time latprof watches it.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .expect("sleep");
    let pid = sleeper.id().to_string();
    let tmux = Tmux::start(&format!(
        "{LATPROF} stats --pid {pid} --duration 1s; echo LATPROF-EXIT=$?; sleep 60"
    ));
    let screen = tmux.wait_for(&["LATPROF-EXIT=0"]);
    let table = screen
        .lines()
        .position(|l| l == "Latency Top version : v0.1")
        .unwrap_or_else(|| panic!("no table:\n{screen}"));
    assert!(
        screen
            .lines()
            .nth(table + 1)
            .is_some_and(|l| l.starts_with("nothing counted: no task slept")),
        "no line after the empty table:\n{screen}"
    );
    tmux.close();
    let out = std::process::Command::new(LATPROF)
        .args(["stats", "--pid", &pid, "--duration", "1s"])
        .output()
        .expect("latprof");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Latency Top version : v0.1\n",
        "redirected, latencytop's empty table and nothing else"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

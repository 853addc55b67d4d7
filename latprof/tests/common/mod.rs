//! Helpers shared by the integration tests that run latprof as a user would.
// Each test binary uses only some of these.
#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, ChildStderr, Command, Output, Stdio},
};

pub mod cgroups;
pub mod limits;
pub mod probe;
pub mod roots;
pub mod runtimes;
pub mod serve;
pub mod tmux;
pub mod ustacks;
pub mod vm;

pub const LATPROF: &str = env!("CARGO_BIN_EXE_latprof");

/// One test at a time, within a test binary, owns the kernel side (program ids, loopback
/// ports, the machine's CPUs); checks first that this process may load eBPF programs, saying
/// how to run the tests when not (`who`: which tests).
pub fn serial(who: &str) -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    latprof::probe::check_privileges().unwrap_or_else(|_| {
        panic!("{who} need root or CAP_BPF+CAP_PERFMON: run `cargo xtask test`")
    });
    guard
}

/// Feeds `text` to Prometheus' Python client, the parser of module `parser`
/// (`prometheus_client.parser` for Prometheus' text, `prometheus_client.openmetrics.parser`
/// for OpenMetrics); fails with its error. Returns the metric families and samples it read.
pub fn python_parses(parser: &str, text: &[u8]) -> (u64, u64) {
    let mut python = Command::new("/usr/bin/python3")
        .args([
            "-c",
            &format!(
                "import sys\nfrom {parser} import text_string_to_metric_families as p\n\
                 fams = list(p(sys.stdin.read()))\n\
                 print(len(fams), sum(len(f.samples) for f in fams))"
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (cargo xtask test installs python3-prometheus-client)");
    python
        .stdin
        .take()
        .expect("stdin")
        .write_all(text)
        .expect("feed python");
    let out = python.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "{parser} rejected it (is python3-prometheus-client installed? cargo xtask test installs it): {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(text)
    );
    let numbers: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|n| n.parse().expect("a number"))
        .collect();
    (numbers[0], numbers[1])
}

/// latprof-workload's command name as the kernel keeps it (15 characters).
pub const WORKLOAD_COMM: &str = "latprof-workloa";

/// Says that a test retried after a failed attempt: on stderr directly (the test harness keeps
/// eprintln! output to itself when the test then passes) and in `$LATPROF_RETRY_LOG`, which
/// `cargo xtask test` lists in its summary. A retry must show in every run.
pub fn note_retry(what: &str) {
    let line = format!("RETRY: {what}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("LATPROF_RETRY_LOG") {
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// latprof-workload (crate latprof-bench), built by the same `cargo test` beside latprof.
pub fn workload_bin() -> PathBuf {
    let path = std::path::Path::new(LATPROF).with_file_name("latprof-workload");
    assert!(
        path.is_file(),
        "{} is missing: run the tests of the whole workspace (`cargo xtask test`, or `cargo test` at the root), which builds it",
        path.display()
    );
    path
}

/// A workload that waits for `go` and, after its work, stays alive until `release`.
pub struct Workload {
    child: Child,
}

impl Workload {
    pub fn spawn(args: &[&str]) -> Self {
        let child = Command::new(workload_bin())
            .args(["--wait", "--hold"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn workload");
        Self { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("workload stdin");
        stdin.write_all(b"go\n").expect("start workload");
        stdin.flush().expect("start workload");
    }

    /// Blocks until the workload finished its work: every sleep of it has been accounted.
    /// Returns what it reported about its work (`key=value` facts).
    pub fn wait_done(&mut self) -> Vec<(String, u64)> {
        let mut line = String::new();
        BufReader::new(self.child.stdout.as_mut().expect("workload stdout"))
            .read_line(&mut line)
            .expect("read workload stdout");
        let mut words = line.split_whitespace();
        assert_eq!(
            words.next(),
            Some("done"),
            "workload did not finish its work: {line}"
        );
        words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().expect("a number")))
            .collect()
    }

    /// Waits for the started work to end; returns the fact `key` it reported, which it must.
    pub fn wait_fact(&mut self, key: &str) -> u64 {
        fact(&self.wait_done(), key)
    }

    /// Waits until the workload sleeps in a read of stdin (its main thread off the CPU there):
    /// before `go`, so that its wait for it began before what the test starts next; after
    /// `wait_done`, so that a sleep before its wait for the release has been followed by a
    /// switch-out latprof saw. At most 10 s.
    pub fn wait_blocked(&self) {
        let pid = self.pid();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The state follows the name's closing parenthesis; syscall 0 is read(2), fd 0.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, r)| r.split(' ').next());
            let syscall =
                std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
            if state == Some("S") && syscall.starts_with("0 0x0 ") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "workload {pid} never blocked in its read of stdin: state {state:?}, syscall {syscall}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Lets the workload exit and checks that it succeeded.
    pub fn release(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("wait for workload");
        assert!(status.success(), "workload failed: {status}");
    }
}

/// Spawns `cmd` (a latprof command; stdout as the caller set it) and waits for its first
/// stderr line, which must contain `ready` ("attached", or "recording to").
pub fn start(cmd: &mut Command, ready: &str) -> (Child, BufReader<ChildStderr>) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn latprof");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("read stderr");
    assert!(
        line.contains(ready),
        "latprof {cmd:?} did not start: {line}"
    );
    (child, stderr)
}

/// Runs `cmd` (a latprof that reads a file: `dump`, `replay`'s exports) to its end; it must
/// succeed. Returns its stdout.
pub fn output_of(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().expect("run latprof");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A directory on a real disk (not tmpfs), for fsync and direct I/O: the target directory of
/// this build, or `LATPROF_FSYNC_DIR`.
pub fn disk_dir() -> String {
    std::env::var("LATPROF_FSYNC_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_owned())
}

/// The sleeps latprof left out as shorter than 1 us, from its summary line ("N sleeps counted
/// (X interruptible over the cutoff and Z under 1us not counted)"). latencytop does not count
/// them either; a workload counts every sleep it slept, so a count judged against the
/// workload's own takes them in (a nanosleep that left its CPU only as its timer expired, on a
/// stalled machine, slept under 1 us).
pub fn under_1us(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|l| {
        l.split_once(" and ")?
            .1
            .strip_suffix(" under 1us not counted)")?
            .trim()
            .parse()
            .ok()
    })
}

/// The fact `key` of what a workload reported (`Workload::wait_done`), which it must have.
pub fn fact(facts: &[(String, u64)], key: &str) -> u64 {
    facts
        .iter()
        .find_map(|(k, v)| (k == key).then_some(*v))
        .unwrap_or_else(|| panic!("the workload did not report {key}= (it said {facts:?})"))
}

/// The one judgment of a count: latprof counted each of the workload's `slept` sleeps once
/// (`counted`), short only by those it reported missing (`missing`, each explained by switches
/// the kernel hid: `reported_missing`). Says how it fails.
pub fn exact_count(counted: u64, slept: u64, missing: u64) -> Result<(), String> {
    if counted > slept {
        Err(format!(
            "counted {counted} of {slept} sleeps: more than there were"
        ))
    } else if counted + missing < slept {
        Err(format!(
            "counted {counted} of {slept} sleeps: {} lost and not reported ({missing} reported missing)",
            slept - counted - missing
        ))
    } else {
        Ok(())
    }
}

/// Process `pid`'s `what` (`lost`, `waker_unseen`, `waker_first_sleep`) in `doc`'s `hidden`:
/// its own sleeps whose wakeup or waking the kernel hid, each checked against the hidden
/// switches (or, for `waker_first_sleep`, its tasks' first traced sleeps).
pub fn own_hidden(doc: &serde_json::Value, pid: u32, what: &str) -> u64 {
    doc["hidden"]
        .as_array()
        .expect("hidden")
        .iter()
        .filter(|h| h["pid"].as_u64() == Some(u64::from(pid)))
        .map(|h| h[what].as_u64().expect("a count"))
        .sum()
}

/// The sleeps of `holder` (a JSON value with causes: a cgroup's, a process's, a document's)
/// recovered without their backtrace (under "[wakeup hidden from tracing]").
pub fn recovered_blind(holder: &serde_json::Value) -> u64 {
    holder["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| c["reason"] == "[wakeup hidden from tracing]")
        .map(|c| c["count"].as_u64().expect("count"))
        .sum()
}

/// What process `pid` lacks in a `stats --format json` document `doc`: its own sleeps that
/// latprof lost where the kernel hid their wakeup (`hidden`'s `lost`), its own sleeps it
/// recovered without their backtrace (under "[wakeup hidden from tracing]": the process's
/// causes while it lives, the document's with `--pid`), and its own sleeps under 1 us, which
/// latencytop does not count either (`hidden`'s `under_1us`). Nothing another process lost
/// counts: a test's allowance is its workload's own. Each lost or recovered sleep was checked
/// against the hidden switches (`lost_where_hidden`/`reported_lost` fail on any other).
pub fn own_missing(doc: &serde_json::Value, pid: u32) -> u64 {
    let lost = own_hidden(doc, pid, "lost") + own_hidden(doc, pid, "under_1us");
    let pid = u64::from(pid);
    let holder = if doc["pid"].as_u64() == Some(pid) {
        Some(doc)
    } else {
        doc["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"].as_u64() == Some(pid))
    };
    lost + holder.map_or(0, recovered_blind)
}

/// Process `pid`'s counted sleeps whose waker is unknown for a reason latprof gives: the kernel
/// hid their waking (checked against the hidden switches), or it was a task's first traced
/// sleep (its waking may have come before latprof made the task's entry).
pub fn own_unseen(doc: &serde_json::Value, pid: u32) -> u64 {
    own_hidden(doc, pid, "waker_unseen") + own_hidden(doc, pid, "waker_first_sleep")
}

/// The one judgment of a workload's count: `counted` of `pid`'s `slept` sleeps (what the
/// workload itself measured), where `doc` is latprof's JSON of the run. Each sleep counted
/// once; short only by the workload's own sleeps latprof reported missing where the kernel
/// hid their wakeup (`own_missing`).
pub fn judge(doc: &serde_json::Value, pid: u32, counted: u64, slept: u64) -> Result<(), String> {
    exact_count(counted, slept, own_missing(doc, pid))
}

/// The nanosleeps counted in a `stats --format json` document.
pub fn nanosleeps(json: &str) -> u64 {
    nanosleeps_of(&serde_json::from_str(json).expect("latprof's JSON"))
}

/// Every sleep counted in a JSON value with causes (the document, or one of its cgroups).
pub fn counted_of(value: &serde_json::Value) -> u64 {
    value["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .map(|c| c["count"].as_u64().expect("count"))
        .sum()
}

/// The nanosleeps of a JSON value with causes (the document, or one of its cgroups): the
/// count of its causes through `hrtimer_nanosleep`.
pub fn nanosleeps_of(value: &serde_json::Value) -> u64 {
    value["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| {
            c["frames"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "hrtimer_nanosleep"))
        })
        .map(|c| c["count"].as_u64().expect("count"))
        .sum()
}

/// What a latprof counted of a workload's nanosleeps (`count_nanosleeps`).
pub struct Tally {
    pub counted: u64,
    pub slept: u64,
    /// The workload's own sleeps reported missing where the kernel hid switches, and those
    /// under 1 us latprof does not count (`own_missing`).
    pub missing: u64,
    /// latprof's stderr after its first line.
    pub stderr: String,
}

/// Runs a workload's `count` nanosleeps, one every `interval`, under the latprof command
/// `stats(pid)` makes for the workload's pid (a `stats --all-sleeps --pid PID --format json`,
/// however it is run: directly, in a root, in a container), started before the workload and
/// stopped with SIGINT after it.
pub fn count_nanosleeps(count: &str, interval: &str, stats: impl FnOnce(&str) -> Command) -> Tally {
    let mut work = Workload::spawn(&["sleep", "--count", count, "--interval", interval]);
    let mut cmd = stats(&work.pid().to_string());
    cmd.stdout(Stdio::piped());
    let (latprof, stderr) = start(&mut cmd, "attached");
    work.go();
    let slept = work.wait_fact("slept");
    let pid = work.pid();
    let (out, rest) = interrupt(latprof, stderr);
    work.release();
    // Any loss must be explained by hidden switches (this fails on any other).
    reported_missing(&rest);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("latprof's JSON");
    Tally {
        counted: nanosleeps_of(&doc),
        slept,
        missing: own_missing(&doc, pid),
        stderr: rest,
    }
}

/// `latprof record --all-sleeps` of the whole machine into `recording` (a snapshot every
/// 200 ms) while `work` runs: returns its `slept=` and the recorder's stderr after its first
/// line. The recorder stops 600 ms after the work, so that a snapshot holds all of it.
pub fn record_while(work: &mut Workload, recording: &std::path::Path) -> (u64, String) {
    let mut cmd = Command::new(LATPROF);
    cmd.args(["record", "--all-sleeps", "--interval", "200ms", "-o"])
        .arg(recording)
        .stdout(Stdio::null());
    let (child, stderr) = start(&mut cmd, "recording to");
    work.go();
    let slept = work.wait_fact("slept");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let (_, rest) = interrupt(child, stderr);
    (slept, rest)
}

/// Stops a latprof command with SIGINT; it must exit 0. Returns its output and the stderr
/// after the first line.
pub fn interrupt(child: Child, mut stderr: BufReader<ChildStderr>) -> (Output, String) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().expect("wait for latprof");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(out.status.success(), "latprof exit {}: {rest}", out.status);
    (out, rest)
}

/// The sleeps latprof reported lost ("latprof: warning: N sleeps lost: ..."), 0 if none. A
/// loss must have its cause found: switches the kernel hid (it ran no BPF program while some
/// task was on a CPU, and the wakeups it did there are invisible). Each sleep lost or
/// recovered must have overlapped such a stretch (latprof checks each and says when one did
/// not, or could not be checked); any other loss fails.
pub fn reported_lost(text: &str) -> u64 {
    for unexplained in [
        "overlapped no hidden switch",
        "not yet checked against hidden switches",
        "hidden-switch events lost",
    ] {
        assert!(
            !text.contains(unexplained),
            "a sleep lost for another reason than hidden switches:\n{text}"
        );
    }
    let Some(line) = text.lines().find(|l| l.contains("sleeps lost")) else {
        return 0;
    };
    assert!(
        line.contains("their wakeups were hidden"),
        "sleeps lost with no hidden switch to explain them: {line}\nlatprof's stderr:\n{text}"
    );
    line.split_whitespace()
        .nth(2)
        .map_or(0, |n| n.parse().expect("lost count"))
}

/// Process `pid`'s sleeps latprof lost where the kernel hid their wakeup, from its stderr
/// `text` ("lost sleeps and unseen wakings, by process: pid P (L lost, U waker unseen, F
/// first sleep), ..."), each one checked against the hidden switches (`reported_lost` fails on
/// any other).
pub fn own_lost(text: &str, pid: u32) -> u64 {
    own_in_text(text, pid).0
}

/// Process `pid`'s sleeps under 1 us, which latprof (like latencytop) does not count, from
/// the stderr `text` of `stats` or `record` ("sleeps under 1us not counted, by process: pid P
/// (N), ...").
pub fn own_short(text: &str, pid: u32) -> u64 {
    let want = format!("pid {pid} (");
    text.lines()
        .find_map(|l| {
            l.split_once("under 1us not counted, by process: ")
                .map(|(_, r)| r)
        })
        .and_then(|line| {
            line.split("), ")
                .find_map(|item| item.strip_prefix(&want)?.trim_end_matches(')').parse().ok())
        })
        .unwrap_or(0)
}

/// Process `pid`'s (lost, waker unseen) sleeps where the kernel hid their wakeup or waking (the
/// unseen ones with its tasks' first traced sleeps, whose waking may have raced latprof's
/// making of their entries), from latprof's stderr `text`.
pub fn own_in_text(text: &str, pid: u32) -> (u64, u64) {
    reported_lost(text);
    let Some(line) = text
        .lines()
        .find_map(|l| l.split_once("unseen wakings, by process: ").map(|(_, r)| r))
    else {
        return (0, 0);
    };
    let want = format!("pid {pid} (");
    line.split("), ")
        .find_map(|item| {
            let counts = item.strip_prefix(&want)?;
            let mut words = counts.split_whitespace();
            let lost = words.next()?.parse().ok()?;
            let unseen: u64 = words.nth(1)?.parse().ok()?;
            let first: u64 = words.nth(2)?.parse().ok()?;
            Some((lost, unseen + first))
        })
        .unwrap_or((0, 0))
}

/// Sleeps missing from their own cause in latprof's stderr `text`: lost, or recovered after a
/// hidden wakeup without their backtrace (counted under "[wakeup hidden from tracing]").
/// Either is accepted only where the kernel hid switches, which latprof then names.
pub fn reported_missing(text: &str) -> u64 {
    let lost = reported_lost(text);
    let Some(line) = text.lines().find(|l| l.contains("sleeps recovered")) else {
        return lost;
    };
    assert!(
        text.contains("switches hidden"),
        "sleeps recovered with no hidden switch to explain them: {line}"
    );
    let without: u64 = line
        .split(" counted under ")
        .next()
        .and_then(|l| l.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line}"));
    lost + without
}

/// A pid-filtered probe's sleeps that latprof rightly did not count, for a judgment against a
/// workload's own count of its sleeps: lost or recovered without a backtrace where the kernel
/// hid switches (`lost_where_hidden`), and those under 1 us (latencytop's rule; a nanosleep
/// whose task stalled between arming its timer and leaving the CPU).
pub fn not_counted(snap: &latprof::collect::Snapshot) -> u64 {
    lost_where_hidden(snap) + snap.counters.get(latprof_common::Counter::SkippedZero)
}

/// The same for a snapshot: sleeps lost or recovered without a backtrace, accepted only where
/// each overlapped a stretch where the kernel hid switches.
pub fn lost_where_hidden(snap: &latprof::collect::Snapshot) -> u64 {
    use latprof_common::{Counter, RECOVERED_STACK};
    let lost = snap.counters.get(Counter::SleepLost);
    let recovered = snap.counters.get(Counter::SleepsRecovered);
    let hidden = snap.counters.get(Counter::SwitchesHidden);
    // Each one overlapped a stretch where the kernel hid switches, all checked.
    assert_eq!(
        (
            snap.hidden.unexplained,
            snap.hidden.waiting,
            snap.counters.get(Counter::HiddenLogFull)
        ),
        (0, 0, 0),
        "sleeps lost or recovered that no hidden switch explains: {:?}",
        snap.hidden
    );
    assert!(
        snap.hidden.explained >= lost + recovered,
        "{lost} lost and {recovered} recovered, {} checked",
        snap.hidden.explained
    );
    assert!(
        lost + recovered == 0 || hidden > 0,
        "{lost} sleeps lost and {recovered} recovered but no switch was hidden: lost for another reason"
    );
    let without = snap
        .global_records()
        .get(&RECOVERED_STACK)
        .map_or(0, |r| r.count);
    lost + without
}

/// A directory under the system's temporary directory, readable by all (tests read files in
/// it as `nobody`), removed with what it holds when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("latprof-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod temp dir");
        Self(dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file of `../shared/hostile` (or `$LATPROF_SHARED/hostile`): the hardening issue's
/// programs and generators. Missing, the test fails and says where it looked.
pub fn hostile(file: &str) -> PathBuf {
    let dir = std::env::var_os("LATPROF_SHARED")
        .map_or_else(
            || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")),
            PathBuf::from,
        )
        .join("hostile");
    let path = dir.join(file);
    assert!(
        path.exists(),
        "{} is missing: the hostile inputs live in ../shared/hostile (LATPROF_SHARED names \
         another shared directory)",
        path.display()
    );
    path
}

/// Voluntary context switches of process `pid`'s main thread so far (its sleeps, as the
/// kernel counts them for it; what a workload's `slept=` reports too).
pub fn voluntary_switches(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no voluntary_ctxt_switches in /proc/{pid}/status"))
}

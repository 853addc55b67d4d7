//! Spike events and debug checks against the real kernel: `latprof spikes` next to workloads
//! with known long sleeps, in both wakeup policies; `--debug-checks` on an injected anomaly.
//!
//! Needs root; `cargo xtask test` runs it (`#[ignore]`d for a plain `cargo test`).
use std::{
    io::BufReader,
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard},
};

mod common;

use common::{LATPROF, Workload};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    latprof::probe::check_privileges().expect("spike tests need root: run `cargo xtask test`");
    guard
}

/// Where `latprof spikes` writes its lines: a file, so that a test reading them only at the
/// end never blocks the reader on a full pipe.
fn out_file(pid: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("latprof-spikes-{}-{pid}.txt", std::process::id()))
}

/// `latprof spikes --pid PID ARGS` started and attached.
fn spikes(args: &[&str], pid: u32) -> (Child, BufReader<std::process::ChildStderr>) {
    let out = std::fs::File::create(out_file(pid)).expect("output file");
    common::start(
        Command::new(LATPROF)
            .args(["spikes", "--pid", &pid.to_string()])
            .args(args)
            .stdout(out),
        "attached",
    )
}

/// Stops `latprof spikes`; returns its stdout lines and its summary numbers.
fn stop(
    child: Child,
    stderr: BufReader<std::process::ChildStderr>,
    work_pid: u32,
) -> (Vec<String>, Summary) {
    let (_, rest) = common::interrupt(child, stderr);
    let summary = rest
        .lines()
        .find(|l| l.contains(" spikes; submitted"))
        .unwrap_or_else(|| panic!("no summary: {rest}"));
    let num = |key: &str| -> u64 {
        summary
            .split(key)
            .nth(1)
            .and_then(|r| r.trim_start().split([',', ' ']).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no '{key}' in {summary}"))
    };
    let lost = common::reported_missing(&rest);
    let path = out_file(work_pid);
    let lines = std::fs::read_to_string(&path)
        .expect("spikes output")
        .lines()
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_file(&path);
    (
        lines,
        Summary {
            submitted: num("submitted"),
            wakeups: num("wakeups sent"),
            suppressed: num("suppressed"),
            dropped: num("dropped"),
            sleeps: num("reader sleeps"),
            lost,
            stderr: rest,
        },
    )
}

impl Summary {
    /// The wakeup policy's books: each submitted event either woke the reader or did not
    /// (`spike()` counts one of the two for every event written), so the two add up exactly.
    fn wakeups_add_up(&self) {
        assert_eq!(
            self.wakeups + self.suppressed,
            self.submitted,
            "wakeups sent and suppressed are not the events submitted: {self:?}"
        );
    }
}

/// Voluntary context switches of this process's reaped children, all threads included (the
/// kernel adds an exited thread's to its process, and a reaped process's to its parent).
fn children_voluntary_switches() -> u64 {
    // SAFETY: getrusage fills the zeroed struct.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage), 0);
        usage
    };
    u64::try_from(usage.ru_nvcsw).expect("a count")
}

#[derive(Debug)]
struct Summary {
    submitted: u64,
    wakeups: u64,
    suppressed: u64,
    dropped: u64,
    sleeps: u64,
    lost: u64,
    /// Everything after the first line.
    stderr: String,
}

/// 30 nanosleeps of 12 ms with a 10 ms threshold: exactly 30 spike lines at nanosleep, in
/// both policies, each with the workload's pid and a duration of at least 12 ms; the second
/// time named by a user's reasons file (`--reasons`).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn known_long_sleeps_are_exactly_the_spikes() {
    let _guard = serial();
    for policy in ["adaptive", "always"] {
        let mut work = Workload::spawn(&["sleep", "--count", "30", "--interval", "12ms"]);
        let pid = work.pid();
        let wakeup = format!("--wakeup={policy}");
        let reasons = std::env::temp_dir().join(format!("latprof-reasons-{pid}.trans"));
        std::fs::write(&reasons, "20 hrtimer_nanosleep Sleeping on purpose\n").expect("reasons");
        let reasons = reasons.to_str().expect("utf-8 path").to_owned();
        let (args, reason): (Vec<&str>, _) = if policy == "always" {
            (vec!["--reasons", &reasons], "Sleeping on purpose")
        } else {
            (Vec::new(), "Application requested delay")
        };
        let mut args = args;
        args.extend(["--all-sleeps", "--spike", "10ms", &wakeup]);
        let (child, stderr) = spikes(&args, pid);
        work.go();
        work.wait_done();
        // Back asleep in its read: a last nanosleep whose wakeup the kernel hid is found lost
        // at that switch, and so reported.
        work.wait_blocked();
        let (lines, sum) = stop(child, stderr, pid);
        work.release();
        assert!(lines[0].starts_with("TIME"), "{lines:?}");
        let naps: Vec<&String> = lines.iter().filter(|l| l.contains(reason)).collect();
        for l in &naps {
            let words: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(words[1], pid.to_string(), "{l}");
            assert_eq!(words[4], "S", "{l}");
            let ms: f64 = words[5]
                .strip_suffix("ms")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("duration of {l}"));
            assert!(ms >= 12.0, "{l}");
        }
        // The kernel now and then does not run latprof for a wakeup (see docs/kernels.md, Hidden wakeups).
        assert_eq!(
            naps.len() as u64 + sum.lost,
            30,
            "{policy}: {sum:?}\n{}",
            lines.join("\n")
        );
        assert!(sum.lost <= 1, "{policy}: {sum:?}");
        // Every event reached the reader: none dropped, each printed.
        assert_eq!(sum.dropped, 0, "{policy}: {sum:?}");
        assert_eq!(sum.submitted, lines.len() as u64 - 1, "{policy}: {sum:?}");
        sum.wakeups_add_up();
        if policy == "always" {
            assert_eq!(sum.wakeups, sum.submitted, "{sum:?}");
            assert_eq!(sum.suppressed, 0, "{sum:?}");
        } else {
            // A wakeup only for a raised flag, and each raised flag is one sleep in poll; and
            // at least one: the reader waits in poll nearly all of the 360 ms the 30 events
            // come in, 12 ms apart, so no wakeup at all is a policy that never wakes it.
            assert!((1..=sum.sleeps).contains(&sum.wakeups), "{policy}: {sum:?}");
        }
    }
}

/// Bursts: 40 threads sleeping 12 ms in a loop, every sleep of theirs a spike (`--spike
/// 1us`). The events are exactly the workload's sleeps, as the kernel counts them for it; and,
/// adaptive, far fewer wakeups than events, one per reader sleep at most, none lost.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn adaptive_wakeups_are_far_fewer_than_events() {
    let _guard = serial();
    let mut work = Workload::spawn(&[
        "threads",
        "--count",
        "40",
        "--interval",
        "12ms",
        "--seconds",
        "2",
    ]);
    let pid = work.pid();
    // Asleep in its read of stdin before latprof attaches (that sleep, begun unseen, is no
    // event): its sleeps from here on are what latprof must show, every one ending before it
    // stops (the workload has exited by then).
    work.wait_blocked();
    let before = common::voluntary_switches(pid);
    let (child, stderr) = spikes(&["--all-sleeps", "--spike", "1us"], pid);
    work.go();
    work.wait_done();
    let reaped = children_voluntary_switches();
    work.release();
    // This test holds the lock: no other child of ours was reaped meanwhile.
    let all = children_voluntary_switches() - reaped;
    let (lines, sum) = stop(child, stderr, pid);
    assert_eq!(sum.dropped, 0, "{sum:?}");
    assert_eq!(sum.submitted, lines.len() as u64 - 1, "{sum:?}");
    // Every sleep one event: short only by the workload's own sleeps latprof reported lost
    // where the kernel hid their wakeup and those under 1 us (no event, as no count), and by
    // one switch that is no sleep: the main thread's last (TASK_DEAD), which the kernel
    // counts as voluntary and adds to ours where our wait reaped it after that switch.
    let missing = common::own_lost(&sum.stderr, pid) + common::own_short(&sum.stderr, pid) + 1;
    let slept = all
        .checked_sub(before)
        .unwrap_or_else(|| panic!("{all} switches in all, {before} before the work"));
    if let Err(why) = common::exact_count(sum.submitted, slept, missing) {
        panic!("events: {why}\n{sum:?}");
    }
    sum.wakeups_add_up();
    assert!(sum.wakeups * 3 < sum.submitted, "{sum:?}");
    // Each wakeup answers one announced sleep (plus buffer-fill wakeups, none here); at least
    // one of the reader's 20 or more sleeps over the 2 s ended by an event.
    assert!((1..=sum.sleeps).contains(&sum.wakeups), "{sum:?}");
}

/// Sends `signal` to our child `pid`.
fn signal(pid: u32, signal: i32) {
    let pid = i32::try_from(pid).expect("pid");
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Issue 12 section 4: the ring buffer full. `latprof spikes` is stopped (SIGSTOP, and the
/// test waits until it is) while a ping-pong makes a spike of every sleep (`--spike 1us`):
/// the buffer (256 KiB: 2730 events of 96 bytes, the 88-byte event and the ring's 8-byte
/// header) fills and the rest are dropped, counted in the summary and said in a warning;
/// every event that finds the fill mark (64 KiB: 683 events) reached wakes the reader although
/// it did not ask: 2047 wakeups, and one more at most for the flag it raised before it
/// stopped. After SIGCONT every event in the buffer is printed, and printed plus dropped are
/// the sleeps the ping-pong slept.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_full_ring_buffer_drops_are_counted_and_the_fill_mark_wakes_the_reader() {
    // Each record: the event and the ring buffer's 8-byte header, 8-byte aligned.
    const RECORD: u64 = (size_of::<latprof_common::SpikeEvent>() as u64 + 8).next_multiple_of(8);
    // The kernel refuses a record that would take the data past the consumer by more than
    // the ring's size less one byte: with nothing consumed, this many fit.
    const RING_EVENTS: u64 = 256 * 1024 / RECORD;
    // Events written before the data reaches the fill mark: the one after them finds it.
    const BELOW_FILL_MARK: u64 = (64 * 1024_u64).div_ceil(RECORD);
    let _guard = serial();
    // Two processes, one on each CPU: each sleep of the parent's (the one traced) holds the
    // other side's wakeup on the other CPU and its turn, never under the 1 us floor. Two
    // threads free to share a CPU could wake each other within it: a quarter of their sleeps
    // were (one CI run: 8,000 of 33,000), too many for the bound on them below.
    let mut work = Workload::spawn(&["pingpong", "--count", "20000", "--processes", "--apart"]);
    let pid = work.pid();
    // Asleep in its read of stdin before latprof attaches: that sleep, begun unseen, makes no
    // event, so the buffer holds nothing of the workload's until the ping-pong starts.
    work.wait_blocked();
    let (child, stderr) = spikes(&["--all-sleeps", "--spike", "1us"], pid);
    signal(child.id(), libc::SIGSTOP);
    let mut status = 0;
    // SAFETY: waiting for our own child to stop (it is not reaped).
    let waited = unsafe {
        libc::waitpid(
            i32::try_from(child.id()).expect("pid"),
            &raw mut status,
            libc::WUNTRACED,
        )
    };
    assert!(
        waited > 0 && libc::WIFSTOPPED(status),
        "latprof spikes did not stop: {status:#x}"
    );
    work.go();
    let slept = work.wait_fact("ping_slept");
    signal(child.id(), libc::SIGCONT);
    let (lines, sum) = stop(child, stderr, pid);
    work.release();
    let printed = lines.len() as u64 - 1;
    assert!(sum.dropped > 0, "{sum:?}");
    assert!(
        sum.stderr.contains(&format!(
            "warning: {} spike events lost: the ring buffer was full",
            sum.dropped
        )),
        "{sum:?}"
    );
    // What was in the buffer reached the reader, all of it: a full buffer's worth, exactly
    // (nothing was consumed before the reader stopped, nor written after the workload's).
    assert_eq!(sum.submitted, printed, "{sum:?}");
    assert_eq!(sum.submitted, RING_EVENTS, "{sum:?}");
    // Every sleep of the ping-pong's parent is a spike, printed or dropped, but those the
    // kernel hid the wakeup of (lost) and those under 1 us (no spike, as no count): its own,
    // as latprof reports them. Beyond its sleeps while it bounced (`ping_slept`), only its
    // sleeps before: fork, pinning itself to CPU 0, each the first events in the buffer, so
    // printed, and none of them a pipe read.
    let spikes = sum.submitted + sum.dropped;
    let missing = common::own_lost(&sum.stderr, pid) + common::own_short(&sum.stderr, pid);
    let before = lines[1..]
        .iter()
        .filter(|l| !l.contains("Waiting for a pipe"))
        .count() as u64;
    assert!(
        spikes + missing >= slept && spikes <= slept + before,
        "slept {slept}, {missing} missing, {before} spikes not pipe reads: {sum:?}"
    );
    // A wakeup for the flag the reader raised before it stopped (one at most: a stopped
    // reader raises no other, and nothing came after it ran again) and for each event written
    // past the fill mark, and no other.
    sum.wakeups_add_up();
    let past_mark = sum.submitted - BELOW_FILL_MARK;
    assert!(
        (past_mark..=past_mark + 1).contains(&sum.wakeups),
        "{past_mark} events past the fill mark: {sum:?}"
    );
}

/// A task already asleep when latprof attaches wakes up: with --debug-checks that is counted
/// and logged (through aya-log); without, the check is not even loaded and counts nothing.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn debug_checks_count_an_injected_anomaly() {
    let _guard = serial();
    for debug in [true, false] {
        // Asleep on stdin before latprof attaches; woken by the "go" line after.
        let mut work = Workload::spawn(&["sleep", "--count", "1", "--interval", "1ms"]);
        work.wait_blocked();
        let pid = work.pid();
        let pid_arg = pid.to_string();
        // Only the workload is watched: another task's wakeup is no anomaly then, so the one
        // counted is the workload's.
        let mut args = vec![
            "stats",
            "--counters",
            "--duration",
            "60s",
            "--pid",
            &pid_arg,
        ];
        if debug {
            args.insert(0, "--debug-checks");
        }
        let (stats, stderr) = common::start(
            Command::new(LATPROF).args(&args).stdout(Stdio::piped()),
            "attached",
        );
        work.go();
        work.wait_done();
        // The anomaly was counted at its wakeup, before the work; back in its read, the
        // workload makes no other. The counters are read, and the log emptied, at the stop.
        work.wait_blocked();
        let (out, rest) = common::interrupt(stats, stderr);
        work.release();
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let count: u64 = text
            .lines()
            .find(|l| l.starts_with("debug_wakeup_without_sleep"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter line:\n{text}"));
        let logged = rest
            .lines()
            .any(|l| l.contains(&format!("wakeup of tid {pid} with no recorded sleep")));
        if debug {
            // Its wakeup from stdin ends a sleep that began before latprof attached: exactly
            // one anomaly, logged with its tid.
            assert_eq!(count, 1, "{text}\n{rest}");
            assert!(logged, "no anomaly of tid {pid} in the log:\n{rest}");
        } else {
            assert_eq!(count, 0, "{text}");
            assert!(!rest.contains("ebpf"), "{rest}");
        }
    }
}

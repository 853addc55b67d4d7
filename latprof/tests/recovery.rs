//! Privileged tests (they load latprof's real eBPF object into the running kernel and run
//! workloads they spawn themselves; root or CAP_BPF + CAP_PERFMON, so `#[ignore]`d for a plain
//! `cargo test`: `cargo xtask test` runs them; without privileges they fail).
//!
//! Sleeps whose wakeup the kernel hid: recovered where they can be, and each lost or recovered
//! sleep checked against the hidden stretches.
use std::process::{Command, Stdio};

mod common;

use common::{LATPROF, Workload, probe::serial};

/// Issue 12: a sleep whose wakeup the kernel hid is recovered, not lost: found open when its
/// task sleeps again, it was woken at `now - run time since - wait since`. latprof hides about
/// one wakeup in three here (`--debug-hide-wakeups 3`); every sleep the workload slept must be
/// counted, the recovered ones as long as the others. Where the backtrace is taken at the
/// wakeup, the recovered ones have none; where it is taken at switch-out, they keep theirs.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn sleeps_with_a_hidden_wakeup_are_recovered() {
    let _guard = serial();
    for btf_wakeup in [true, false] {
        recovery_attempt(btf_wakeup);
    }
}

/// Issue 12: the check of each lost or recovered sleep against the stretches where switches
/// were hidden can fail. Here the wakeups latprof hides on purpose are not logged as gaps
/// (`--debug-hide-unlogged`): most of the sleeps recovered overlap no gap latprof saw, and it
/// must say so (the other tests require that it never does).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_recovered_sleep_no_gap_explains_is_reported() {
    let _guard = serial();
    let mut work = Workload::spawn(&["sleep", "--count", "100", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let (stats, stderr) = common::start(
        Command::new(LATPROF)
            .args([
                "--debug-hide-wakeups",
                "3",
                "--debug-hide-unlogged",
                "stats",
                "--duration",
                "60s",
                "--pid",
                &pid,
            ])
            .stdout(Stdio::null()),
        "attached",
    );
    work.go();
    work.wait_done();
    work.release();
    let (_, rest) = common::interrupt(stats, stderr);
    let number = |needle: &str| -> u64 {
        rest.lines()
            .find(|l| l.contains(needle))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {needle:?} line:\n{rest}"))
    };
    let recovered = number("sleeps recovered");
    let unexplained = number("overlapped no hidden switch");
    // About a third of 100 hidden; a few may fall in a stretch this host's kernel really hid.
    assert!(recovered >= 15, "{recovered} recovered\n{rest}");
    assert!(
        unexplained >= recovered / 2 && unexplained <= recovered + 1,
        "{unexplained} unexplained of {recovered} recovered\n{rest}"
    );
}

fn recovery_attempt(btf_wakeup: bool) {
    let mut work = Workload::spawn(&["sleep", "--count", "300", "--interval", "2ms"]);
    // Every sleep counts: a 2 ms nanosleep stretched past the 5 ms cutoff on this busy machine
    // must not go missing.
    let mut args = vec![
        "--debug-hide-wakeups",
        "3",
        "stats",
        "--all-sleeps",
        "--duration",
        "60s",
    ];
    if !btf_wakeup {
        args.insert(0, "--no-btf-wakeup");
    }
    let pid = work.pid().to_string();
    args.extend(["--pid", &pid]);
    let (stats, stderr) = common::start(
        Command::new(LATPROF).args(&args).stdout(Stdio::piped()),
        "attached",
    );
    work.go();
    let facts = work.wait_done();
    let fact = |key: &str| common::fact(&facts, key);
    let (slept, own_max_us, own_total_us) = (
        fact("slept"),
        fact("max_ns") / 1000,
        fact("total_ns") / 1000,
    );
    // Its last nanosleep, if its wakeup was hidden, is recovered when it sleeps again: in its
    // wait for the release, which then stays open until latprof has stopped.
    work.wait_blocked();
    let (out, rest) = common::interrupt(stats, stderr);
    work.release();
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let line = |needle: &str| -> Option<(u64, u64, u64)> {
        text.lines().find(|l| l.contains(needle)).map(|l| {
            let f: Vec<u64> = l
                .split(' ')
                .take(3)
                .map(|n| n.parse().expect("number"))
                .collect();
            (f[0], f[1], f[2])
        })
    };
    let recovered: u64 = rest
        .lines()
        .find(|l| l.contains("sleeps recovered"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sleeps recovered:\n{rest}"));
    // About a third of the wakeups hidden (random): far from none, far from all.
    assert!(
        (slept / 6..=slept / 2).contains(&recovered),
        "{recovered} of {slept} recovered\n{rest}"
    );
    // Each recovered sleep was checked against the wakeups hidden (gaps of no length, logged
    // where they were hidden): each overlapped one (common's helpers fail on any other).
    let checked: u64 = rest
        .lines()
        .find_map(|l| {
            l.split("; ")
                .nth(1)?
                .strip_suffix(
                    " lost or recovered sleeps overlapped a stretch where switches were hidden",
                )?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no check of the recovered sleeps:\n{rest}"));
    assert!(
        checked >= recovered,
        "{checked} checked, {recovered} recovered\n{rest}"
    );
    let (count, total, max) = line(" hrtimer_nanosleep ").expect("nanosleep line");
    let hidden = line("[wakeup hidden from tracing]");
    // Lost, and under 1 us (not counted by latencytop's rule; stats traces the workload only).
    let lost = common::reported_lost(&rest) + common::under_1us(&rest).unwrap_or(0);
    if btf_wakeup {
        let (h_count, h_total, h_max) =
            hidden.unwrap_or_else(|| panic!("no recovered line:\n{text}"));
        // Every recovered sleep is under that line, and each nanosleep is counted once.
        assert_eq!(h_count, recovered, "{text}\n{rest}");
        assert_eq!(
            count + h_count + lost,
            slept,
            "{count} + {h_count} recovered + {lost} lost for {slept} slept\n{text}\n{rest}"
        );
        // As long as the others: on an idle machine the averages agree within 0.5% (2,077
        // against 2,076 us); here a stall of a few sleeps, or the last wait on stdin among the
        // recovered, moves a small sample's average, so within 25%; each recovered nanosleep
        // at least the 2 ms it asked for (less 5%), none longer than the workload's own
        // longest. A unit error or a missing term is far outside these.
        let (avg, h_avg) = (total / count, h_total / h_count);
        assert!(
            h_avg.abs_diff(avg) <= avg / 4,
            "average {h_avg} us recovered, {avg} us seen\n{text}"
        );
        assert!(
            h_total >= (h_count - 1) * 1_900,
            "{h_count} recovered in {h_total} us\n{text}"
        );
        assert!(h_max <= own_max_us + 100, "{h_max} > {own_max_us}\n{text}");
    } else {
        // Backtraces taken at switch-out: the recovered sleeps are under their own cause.
        assert!(hidden.is_none(), "{text}");
        assert_eq!(count + lost, slept, "{text}\n{rest}");
        // At least the 2 ms asked for, at most what the workload's own clock saw.
        assert!(
            (slept * 1_900..=own_total_us).contains(&total),
            "slept {slept}, total {total} us, the workload's own {own_total_us} us\n{text}"
        );
        assert!(max <= own_max_us + 100, "{max} > {own_max_us}\n{text}");
    }
}

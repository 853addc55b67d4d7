//! The count tests can fail. A defect injected on purpose (`--debug-defect drop-sleep`: about
//! one counted sleep in 4 vanishes in the eBPF program, counted nowhere, reported nowhere) makes
//! the judgment every count test uses (`common::exact_count`) fail on a workload's own sleeps,
//! where the same run without it passes. `cargo xtask mutants` runs the whole suite with each
//! defect (`LATPROF_TEST_DEFECT`, which every latprof takes from the environment) and checks
//! which tests fail against `must_fail`; this one's clean half fails under drop-sleep too.
//!
//! Needs root (`cargo xtask test`).
use std::process::Command;

mod common;

use common::LATPROF;

/// A workload's 400 sleeps under `latprof stats ARGS`, judged (`common::exact_count`).
fn judged(args: &[&str]) -> Result<(), String> {
    let run = common::count_nanosleeps("400", "1ms", |pid| {
        let mut cmd = Command::new(LATPROF);
        cmd.args(["stats", "--all-sleeps", "--pid", pid, "--format", "json"])
            .args(args);
        cmd
    });
    common::exact_count(run.counted, run.slept, run.missing)
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_dropped_sleep_fails_the_count() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    if let Err(why) = judged(&[]) {
        panic!("without the defect: {why}");
    }
    // About 100 of 400 gone (none at all: a chance of one in 10^49).
    assert!(
        judged(&["--debug-defect", "drop-sleep"]).is_err(),
        "with one sleep in 4 dropped, the count passed as exact"
    );
}

//! The benchmark harness end to end in its quick mode (a few thousand round trips, one round):
//! it must run every configuration, measure latprof's programs through the kernel's BPF
//! statistics, and write its report. No timing is asserted.
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_latprof-bench");

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn quick_bench_runs_end_to_end() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let out = std::env::temp_dir().join(format!("latprof-bench-test-{}", std::process::id()));
    // The harness runs latprof from beside itself: the workspace's `cargo test` builds both.
    let run = Command::new(BENCH)
        .args(["--quick", "--out"])
        .arg(&out)
        .output()
        .expect("run latprof-bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "bench failed: {}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let md = std::fs::read_to_string(out.join("bench.md")).expect("bench.md");
    assert_eq!(md, stdout, "the printed table is the file");
    for workload in ["## pingpong", "## forkstorm", "## idle"] {
        assert!(md.contains(workload), "{workload} missing:\n{md}");
    }
    // Every configuration of the quick run has a row, and latprof's rows carry BPF numbers.
    let rows: Vec<Vec<&str>> = md
        .lines()
        .skip_while(|l| !l.starts_with("## pingpong"))
        .filter(|l| l.starts_with("| none") || l.starts_with("| lazy") || l.starts_with("| normal"))
        .take(3)
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{md}");
    for row in &rows[1..] {
        let per_event: f64 = row[5].parse().expect("BPF ns/event");
        let per_trip: f64 = row[6].parse().expect("BPF ns/round trip");
        assert!(
            per_event > 0.0 && per_trip > 0.0,
            "no BPF time measured for {row:?}"
        );
        let maps: u64 = row[10].parse().expect("maps KiB");
        assert!(maps > 0, "no map memory for {row:?}");
    }
    let per_program = md
        .lines()
        .find(|l| l.starts_with("lazy per program: "))
        .unwrap_or_else(|| panic!("no per-program line:\n{md}"));
    for program in [
        "sched_process_e",
        "sched_switch",
        "sched_wakeup",
        "tick_stop",
    ] {
        assert!(
            per_program.contains(program),
            "{program} missing: {per_program}"
        );
    }
    // The floor: do-nothing programs on latprof's hooks ran, and each of latprof's programs is
    // set against the one on its hook.
    let switch: Vec<&str> = md
        .lines()
        .skip_while(|l| !l.starts_with("### pingpong: each program against the floor"))
        .find(|l| l.starts_with("| sched_switch |"))
        .unwrap_or_else(|| panic!("no floor row for sched_switch:\n{md}"))
        .split('|')
        .map(str::trim)
        .collect();
    let floor: f64 = switch[3].parse().expect("floor ns");
    let lazy: f64 = switch[4].parse().expect("lazy ns");
    assert!(floor > 0.0 && lazy > 0.0, "{switch:?}");
    // The breakdown: lazy without its backtraces costs less than lazy, per wakeup.
    let stack: Vec<&str> = md
        .lines()
        .skip_while(|l| !l.starts_with("### pingpong: what each part of lazy's programs costs"))
        .find(|l| l.starts_with("| stack |"))
        .unwrap_or_else(|| panic!("no breakdown row for the backtraces:\n{md}"))
        .split('|')
        .map(str::trim)
        .collect();
    let _: f64 = stack[3].parse().expect("ns per switch");
    assert!(md.contains("## Targets"), "{md}");
    let json = std::fs::read_to_string(out.join("bench.json")).expect("bench.json");
    // Valid JSON (serde_json wrote it), with a lazy result whose ratio is a number.
    let doc: serde_json::Value = serde_json::from_str(&json).expect("bench.json is JSON");
    let lazy = doc["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["config"] == "lazy")
        .unwrap_or_else(|| panic!("no lazy result: {json}"));
    assert!(lazy["ratio"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    assert!(doc["targets"].is_array(), "{json}");
    let _ = std::fs::remove_dir_all(&out);
}

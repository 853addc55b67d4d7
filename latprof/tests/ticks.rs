//! Privileged tests (they load latprof's real eBPF object into the running kernel and run
//! workloads they spawn themselves; root or CAP_BPF + CAP_PERFMON, so `#[ignore]`d for a plain
//! `cargo test`: `cargo xtask test` runs them; without privileges they fail).
//!
//! Tick counters on a busy and an idle CPU of this machine.
use std::process::Command;

use latprof::{collect::Collector, probe::Mode};

mod common;

use common::{
    LATPROF,
    probe::{attach, serial},
};

/// Each CPU's idle time so far (ms), from /proc/stat (USER_HZ ticks).
fn idle_ms() -> Vec<u64> {
    // SAFETY: sysconf has no memory effects.
    let user_hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let idle: u64 = l
                .split_whitespace()
                .nth(4)
                .and_then(|v| v.parse().ok())
                .expect("idle field");
            idle * 1000 / user_hz.max(1)
        })
        .collect()
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn tick_counters_follow_a_busy_and_an_idle_cpu() {
    let _guard = serial();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    assert!(cpus >= 2, "this test needs two CPUs");
    let probe = attach(Mode::Lazy, None);
    let facts = latprof::probe::facts::kernel_facts(&probe);
    // nohz_full as sysfs says (none on this host; the VM test has CPU 1).
    let sysfs = std::fs::read_to_string("/sys/devices/system/cpu/nohz_full").unwrap_or_default();
    assert_eq!(
        facts.nohz_full_cpus,
        latprof::cpus::parse_list(&sysfs).expect("cpulist")
    );
    let mut collector = Collector::new();
    let idle_before = idle_ms();
    let before = collector.snapshot(&probe).expect("snapshot");
    // CPU 1 busy in user space for 1.5 s.
    let spin = Command::new(common::workload_bin())
        .args(["spin", "--time", "1500ms", "--cpu", "1"])
        .output()
        .expect("spin");
    assert!(spin.status.success());
    let after = collector.snapshot(&probe).expect("snapshot");
    let idle: Vec<u64> = idle_ms()
        .iter()
        .zip(&idle_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let secs = (after.taken_ns - before.taken_ns) as f64 / 1e9;
    let cpu = latprof::export::counters::cpu_ticks(&facts, Some(&before), &after);
    assert_eq!(cpu.len(), cpus, "{cpu:?}");
    let hz = f64::from(facts.hz.unwrap_or(100));
    // A busy CPU keeps its tick (no nohz_full here): about HZ per second while it spins.
    assert!(
        cpu[1].timer_ticks as f64 >= 0.5 * hz * 1.5,
        "CPU 1 busy for 1.5 s of {secs:.1} s: {} ticks at HZ {hz}",
        cpu[1].timer_ticks
    );
    // Idle CPUs stop their tick: a CPU that idled a fifth of a second stopped it at least
    // once. (On a machine busy with other work no CPU may idle at all: then there is nothing
    // to check, and the test says so.)
    if idle.iter().any(|&ms| ms >= 200) {
        assert!(
            cpu.iter().map(|c| c.tick_stopped).sum::<u64>() > 0,
            "idle ms per CPU {idle:?}: {cpu:?}"
        );
    } else {
        eprintln!(
            "NOT CHECKED: no CPU idled 200 ms (idle ms per CPU {idle:?}); tick stops unchecked"
        );
    }
    assert!(cpu.iter().all(|c| c.switches > 0), "{cpu:?}");
    let tracefs = |tp: &str| {
        std::path::Path::new("/sys/kernel/tracing/events")
            .join(tp)
            .exists()
    };
    assert_eq!(
        cpu[0].user_enter.is_some(),
        tracefs("context_tracking/user_enter"),
        "context tracking counted exactly where its tracepoints exist"
    );
    drop(probe);

    // The same through the command line, as a user reads it.
    let out = Command::new(LATPROF)
        .args(["stats", "--counters", "--duration", "1s"])
        .output()
        .expect("latprof stats --counters");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.contains("ticks/s"), "{text}");
    assert!(text.contains("nohz_full CPUs: "), "{text}");
    for c in 0..cpus {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{c:<4} "))),
            "no row for CPU {c}:\n{text}"
        );
    }
}

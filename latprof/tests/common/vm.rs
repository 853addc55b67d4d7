//! Booting ../shared/vm: one guest at a time, a script copied in, its output back.
use std::{path::PathBuf, process::Command};

use super::LATPROF;

pub fn shared_vm() -> Option<PathBuf> {
    let dir = std::env::var_os("LATPROF_SHARED").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")),
        PathBuf::from,
    );
    let run = dir.join("vm/run.sh");
    run.exists().then_some(run)
}

/// Boots the VM with `file` copied in (as /work/NAME) and runs `command`; returns its output.
/// `None` when LATPROF_SKIP_VM is set (xtask says so loudly). One VM at a time: two emulated
/// guests on this 2-core machine slow each other enough to move measurements.
pub fn boot(file: &str, command: &str, vm_args: &[&str]) -> Option<String> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if std::env::var_os("LATPROF_SKIP_VM").is_some() {
        eprintln!("LATPROF_SKIP_VM is set: VM test NOT RUN");
        return None;
    }
    let run = shared_vm().expect(
        "../shared/vm/run.sh not found (set LATPROF_SHARED, or LATPROF_SKIP_VM=1 to skip loudly)",
    );
    let dir = tempdir();
    let script = dir.join("script.sh");
    std::fs::write(&script, format!("#!/bin/sh\n{command}\n")).expect("write VM script");
    // The emulated boot very rarely oopses before the script starts; one retry covers that.
    for attempt in 1..=2 {
        let started = std::time::Instant::now();
        let out = Command::new("bash")
            .arg(&run)
            .args(vm_args)
            .args(["--bin", LATPROF, "--file", file])
            .arg(&script)
            .output()
            .expect("run ../shared/vm/run.sh");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!(
            "VM {vm_args:?} {command}: {:.0}s",
            started.elapsed().as_secs_f64()
        );
        if !out.status.success() && stderr.contains("did not finish") && attempt == 1 {
            eprintln!("VM did not finish (attempt {attempt}), retrying:\n{stderr}");
            continue;
        }
        assert!(
            out.status.success(),
            "VM run failed: {}\n{stdout}\n{stderr}",
            out.status
        );
        let _ = std::fs::remove_dir_all(&dir);
        return Some(stdout);
    }
    unreachable!()
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latprof-vm-test-{}", std::process::id()));
    let dir = dir.join(format!("{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The lines of section `=== name` of a VM script's output (up to the next section).
pub fn section<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    let start = format!("=== {name}");
    let mut lines = out.lines().skip_while(|l| *l != start);
    assert_eq!(
        lines.next(),
        Some(start.as_str()),
        "no section {start} in the VM's output:\n{out}"
    );
    lines
        .take_while(|l| !l.starts_with("=== "))
        .filter(|l| !l.starts_with("+++ "))
        .collect()
}

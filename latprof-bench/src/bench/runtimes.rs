//! Workloads of managed runtimes (issue 32): Node and Java programs that wait inside three
//! functions of their own (the runtime tests' fixtures, latprof/tests/fixtures/runtimes),
//! 2,000 waits of 1 ms each, so that `--user-stacks` is measured against lazy on the
//! backtraces a runtime makes (glibc's condition wait, stepped through by the unwind tables;
//! the runtime's frames; its JIT code) and `lazy-ustacks-fp` shows what the tables' steps
//! cost. Left out, with a line, where node, java or javac is missing.

use std::path::{Path, PathBuf};

use super::configs::{Config, Workload, which};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../latprof/tests/fixtures/runtimes"
);
/// Waits per run, and their length.
const WAITS: &str = "2000";
const WAIT_MS: &str = "1";

fn configs() -> Vec<Config> {
    vec![
        Config::None,
        Config::Lazy,
        Config::LazyUserStacks,
        Config::LazyUserStacksFp,
    ]
}

/// The Node and Java workloads this machine can run.
pub(super) fn workloads() -> Vec<Workload> {
    let mut out = Vec::new();
    if which("node") {
        out.push(Workload {
            name: "node".into(),
            // In /tmp: V8 writes an isolate-*-v8.log where it runs.
            command: vec![
                "sh".into(),
                "-c".into(),
                "cd /tmp && exec node \"$@\"".into(),
                "node".into(),
                "--perf-basic-prof".into(),
                "--interpreted-frames-native-stack".into(),
                format!("{FIXTURES}/sleep_in_three.js"),
                WAITS.into(),
                WAIT_MS.into(),
            ],
            units: 0,
            unit: "",
            configs: configs(),
        });
    } else {
        eprintln!("bench: no node (Debian: apt-get install nodejs): the node workload is left out");
    }
    match java_classes() {
        Some(dir) => out.push(Workload {
            name: "java".into(),
            command: vec![
                "java".into(),
                "-XX:+PreserveFramePointer".into(),
                "-XX:TieredStopAtLevel=1".into(),
                "-cp".into(),
                dir.display().to_string(),
                "SleepInThree".into(),
                WAITS.into(),
                WAIT_MS.into(),
            ],
            units: 0,
            unit: "",
            configs: configs(),
        }),
        None => eprintln!(
            "bench: no java or javac (Debian: apt-get install openjdk-17-jdk-headless): the java workload is left out"
        ),
    }
    out
}

/// The Java fixture compiled into a folder of its own; `None` without a JDK.
fn java_classes() -> Option<PathBuf> {
    if !which("java") || !which("javac") {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("latprof-bench-java-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let status = std::process::Command::new("javac")
        .arg("-d")
        .arg(&dir)
        .arg(Path::new(FIXTURES).join("SleepInThree.java"))
        .status()
        .ok()?;
    status.success().then_some(dir)
}

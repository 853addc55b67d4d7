//! Booting ../shared/vm's x86-64 guests, or tests/vm/arm64.sh's Debian arm64 guests (a
//! `--kernel` named `arm64-debian-12` or `arm64-debian-13`): a script copied in, its output back.
use std::{
    io::Read,
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

pub fn shared_vm() -> Option<PathBuf> {
    let dir = std::env::var_os("LATPROF_SHARED").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")),
        PathBuf::from,
    );
    let run = dir.join("vm/run.sh");
    run.exists().then_some(run)
}

/// The helpers the VM scripts source (`. /work/lib.sh`).
const LIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/lib.sh");

/// Boots the VM with `file` copied in (as /work/NAME, beside lib.sh) and runs `command`;
/// returns its output.
/// `None` when LATPROF_SKIP_VM is set (xtask says so loudly). As many guests at a time as the
/// host has CPUs: each emulates all its vCPUs on one host thread (below), so two guests on
/// this 2-core machine each have a CPU of their own.
pub fn boot(file: &str, command: &str, vm_args: &[&str]) -> Option<String> {
    let _slot = Slot::take();
    if std::env::var_os("LATPROF_SKIP_VM").is_some() {
        // Under CI a check that did not run is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "LATPROF_SKIP_VM is set under CI: the VM checks must run"
        );
        eprintln!("LATPROF_SKIP_VM is set: VM test NOT RUN");
        return None;
    }
    // An arm64 guest: the project's own runner, with run.sh's arguments, and the arm64 binaries.
    let arm64 = arm64_kernel(vm_args);
    let run = if arm64.is_some() {
        PathBuf::from(ARM64)
    } else {
        shared_vm().expect(
            "../shared/vm/run.sh not found (set LATPROF_SHARED, or LATPROF_SKIP_VM=1 to skip loudly)",
        )
    };
    let vm_args: Vec<&str> = vm_args
        .iter()
        .map(|a| {
            a.strip_prefix("arm64-")
                .filter(|_| arm64.is_some())
                .unwrap_or(a)
        })
        .collect();
    let (latprof, workload) = dist_bins(arm64.is_some());
    let dir = tempdir();
    let script = dir.join("script.sh");
    // The defect `cargo xtask mutants` injects reaches the guest's latprof as the host's.
    let defect = std::env::var("LATPROF_TEST_DEFECT")
        .map(|name| format!("export LATPROF_TEST_DEFECT={name}\n"))
        .unwrap_or_default();
    std::fs::write(&script, format!("#!/bin/sh\n{defect}{command}\n")).expect("write VM script");
    // Multi-threaded TCG (run.sh's `-accel tcg,thread=multi`) now and then lets a vCPU trap on
    // an int3 the kernel has already patched away when latprof's attach enables a tracepoint
    // (text_poke_bp): seen as "Oops: int3" at a `66 90` nop in ttwu_do_activate, after which
    // the guest stops making progress (about one boot in ten, most on Debian's 6.1 kernels).
    // One host thread for all vCPUs keeps their view of patched code coherent: run.sh's own
    // text, with that one option changed, runs as run.sh ($0 keeps its folder). A guest that
    // still has not finished after `guest_limit()` is stopped (run.sh prints its console's
    // tail); booted once more only if it printed nothing, and never under CI, where a
    // retry is a failure.
    //
    // The guest writes everything on its serial console, whose interrupt the kernel may judge
    // spurious when its handler falls behind on a busy host and then disable: seen on Debian's
    // 6.1-rt (threaded interrupts) as "Disabling IRQ #4" in the middle of a long JSON, the
    // console silent from there and the script never finished. `noirqdebug` keeps it on.
    let text = std::fs::read_to_string(&run).expect("read run.sh");
    let text = text
        .replace("-accel tcg,thread=multi", "-accel tcg,thread=single")
        .replace(" panic=-1 ", " noirqdebug panic=-1 ");
    assert!(
        text.contains("noirqdebug"),
        "{}: no ` panic=-1 ` on the kernel's command line to add noirqdebug to",
        run.display()
    );
    let attempts = if std::env::var_os("CI").is_some() {
        1
    } else {
        2
    };
    for attempt in 1..=attempts {
        let started = std::time::Instant::now();
        let (status, stdout, stderr, stopped) = run_with_limit(
            arm64.is_some(),
            Command::new("bash")
                .arg("-c")
                .arg(&text)
                .arg(&run)
                .args(&vm_args)
                .arg("--bin")
                .arg(&latprof)
                .arg("--bin")
                .arg(&workload)
                .args(["--file", file, "--file", LIB])
                .arg(&script),
        );
        eprintln!(
            "VM {vm_args:?} {command}: {:.0}s",
            started.elapsed().as_secs_f64()
        );
        // Booted once more only if the guest printed nothing at all (a host hiccup before the
        // script began): a script that began and then failed or hung fails the test.
        if !status.success()
            && stderr.contains("did not finish")
            && stdout.trim().is_empty()
            && attempt < attempts
        {
            // A retry must show in every run's log and in xtask's summary.
            super::note_retry(&format!(
                "VM {vm_args:?} did not finish (attempt {attempt}{}), retrying:\n{stdout}\n{stderr}",
                if stopped {
                    ", stopped after the time limit"
                } else {
                    ""
                }
            ));
            continue;
        }
        assert!(
            status.success(),
            "VM run failed: {status}\n{stdout}\n{stderr}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        return Some(stdout);
    }
    unreachable!()
}

/// The arm64 guests' runner.
const ARM64: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/arm64.sh");

/// The Debian release of an arm64 guest (`--kernel arm64-debian-12`), if `vm_args` name one.
fn arm64_kernel<'a>(vm_args: &[&'a str]) -> Option<&'a str> {
    vm_args
        .windows(2)
        .find(|w| w[0] == "--kernel")
        .and_then(|w| w[1].strip_prefix("arm64-"))
}

/// The static binaries the guests run (`cargo xtask dist`: latprof as shipped, and the tests'
/// workload; in target/dist/aarch64 for `arm64` guests), so that run.sh copies no library into
/// a guest and each kernel's check is true for the userspace a user installs too.
/// `LATPROF_DIST` names another folder.
pub fn dist_bins(arm64: bool) -> (PathBuf, PathBuf) {
    let dir = std::env::var_os("LATPROF_DIST").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/dist")),
        PathBuf::from,
    );
    let dir = if arm64 { dir.join("aarch64") } else { dir };
    let bins = (dir.join("latprof"), dir.join("test/latprof-workload"));
    for bin in [&bins.0, &bins.1] {
        assert!(
            bin.is_file(),
            "{} is missing: `cargo xtask dist` builds the static binaries the VM checks run (`cargo xtask test` does it first)",
            bin.display()
        );
        let file = Command::new("file")
            .arg("-b")
            .arg(bin)
            .output()
            .expect("file");
        let said = String::from_utf8_lossy(&file.stdout).into_owned();
        let machine = if arm64 { "ARM aarch64" } else { "x86-64" };
        assert!(
            said.contains(machine)
                && (said.contains("statically linked") || said.contains("static-pie linked")),
            "{} is not a static {machine} executable ({said}): run.sh would copy libraries into the guest",
            bin.display()
        );
    }
    bins
}

/// How long a guest may take: its scripts run in about 30 s here, an arm64 guest's (every
/// instruction translated from another architecture) in about LATE. LATPROF_VM_LIMIT_S
/// changes it (to see the limit work).
fn guest_limit(arm64: bool) -> Duration {
    let secs = std::env::var("LATPROF_VM_LIMIT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if arm64 { 600 } else { 300 });
    Duration::from_secs(secs)
}

/// Runs run.sh; past `guest_limit()` stops its qemu (through the `timeout` that run.sh starts it
/// under, which passes the signal on), so that run.sh reports the guest's console and exits.
/// Returns (status, stdout, stderr, whether it was stopped).
fn run_with_limit(arm64: bool, cmd: &mut Command) -> (ExitStatus, String, String, bool) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ../shared/vm/run.sh");
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = read(Box::new(child.stdout.take().expect("stdout")));
    let err = read(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + guest_limit(arm64);
    let mut stopped = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for run.sh") {
            break status;
        }
        if !stopped && Instant::now() > deadline {
            stopped = true;
            for pid in descendants(child.id(), "timeout") {
                // SAFETY: signalling a process this test started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (
        status,
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
        stopped,
    )
}

/// Processes under `root` whose command is `name`.
fn descendants(root: u32, name: &str) -> Vec<i32> {
    let mut family = vec![root];
    let mut found = Vec::new();
    // A few rounds reach grandchildren, whatever order /proc lists them in.
    for _ in 0..4 {
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid ...
            let Some((comm, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
            else {
                continue;
            };
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            if ppid.is_some_and(|p| family.contains(&p)) && !family.contains(&pid) {
                family.push(pid);
                if comm == name {
                    found.push(i32::try_from(pid).expect("pid"));
                }
            }
        }
    }
    found
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

/// One of the host's CPUs, held by a running guest.
struct Slot;

static RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

impl Slot {
    fn take() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *running >= cpus {
            running = FREED
                .wait(running)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *running += 1;
        Self
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *running -= 1;
        FREED.notify_one();
    }
}

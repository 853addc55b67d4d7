//! `cargo xtask test`: the whole suite as a fresh machine needs it (setup, the house's plan,
//! fmt and clippy, licenses, the static binaries, the Debian package, the image, the test
//! build), then every test binary as root, timed, and a summary of where the time went and of
//! every retry a test noted.
//!
//! Test binaries run one after another, but for those [`BESIDE`] names: each of them runs
//! beside another binary, whose time it would otherwise add to the suite's while it mostly waits.
use std::{
    env,
    ffi::OsString,
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    NIGHTLY, cargo,
    dist::{self, TARGETS},
    house, is_root, licenses_check_bites, notices, root_dir, run_cmd, setup_for_tests,
};

/// (a test binary, the one it runs beside). tests/pulls.rs waits two minutes on its scrapers'
/// intervals and takes little CPU; vm_kernels' guests load nothing into this machine's kernel,
/// so pulls' programs are in no host test's count of loaded programs (serve.rs and
/// lifecycle.rs count them), and nothing of vm_kernels' is in pulls' counts (scoped to its own
/// workload's pid).
const BESIDE: [(&str, &str); 1] = [("latprof test pulls", "latprof test vm_kernels")];

/// A test binary cargo built: its name (package, kind, target), file and package directory.
pub(crate) struct TestBinary {
    pub(crate) name: String,
    exe: String,
    dir: PathBuf,
}

/// How one test binary went: its name, how long it took, whether it passed, and what it ran
/// beside.
pub(crate) struct Ran {
    pub(crate) name: String,
    pub(crate) took: Duration,
    pub(crate) ok: bool,
    beside: Option<&'static str>,
    /// What it printed on stdout (libtest's `test NAME ... ok` lines).
    pub(crate) stdout: String,
}

/// What the tests need built, and how to run them: the test binaries, whether the VM checks
/// are skipped, the file tests note retries in, and the time each step before took.
pub(crate) struct Prepared {
    pub(crate) binaries: Vec<TestBinary>,
    pub(crate) skip_vm: bool,
    pub(crate) retries: PathBuf,
    steps: Vec<(&'static str, Duration)>,
}

/// `cargo xtask test`: formatting, then every test, the privileged ones included (as root, with
/// sudo when not root), the latencytop truth check and the kernel checks in ../shared/vm.
pub(crate) fn test(args: &[String]) -> Result<()> {
    let started = Instant::now();
    let extra = args.strip_prefix(&["--".to_owned()]).unwrap_or(args);
    let Prepared {
        binaries,
        skip_vm,
        retries,
        steps,
    } = prepare()?;
    let t0 = Instant::now();
    let mut ran = run_binaries(&binaries, |test| {
        test_command(test, &retries, skip_vm, extra)
    });
    // The examples in the documentation.
    let t1 = Instant::now();
    let ok = run_cmd(cargo().args(["test", "--doc"])).is_ok();
    ran.push(Ran {
        name: "doc tests".to_owned(),
        took: t1.elapsed(),
        ok,
        beside: None,
        stdout: String::new(),
    });
    summary(&ran, t0.elapsed(), started, &steps);
    let retried = std::fs::read_to_string(&retries).unwrap_or_default();
    let retried: Vec<&str> = retried
        .lines()
        .filter(|l| l.starts_with("RETRY:"))
        .collect();
    if retried.is_empty() {
        eprintln!("xtask: no test needed a second attempt");
    } else {
        eprintln!(
            "xtask: {} retries (each passed on its second attempt or failed):",
            retried.len()
        );
        for line in &retried {
            eprintln!("xtask:   {line}");
        }
    }
    if skip_vm {
        eprintln!(
            "xtask: WARNING: the latencytop truth check and the kernel checks did NOT RUN (LATPROF_SKIP_VM)"
        );
    }
    let failed: Vec<&str> = ran
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        eprintln!("xtask: FAILED: {}", failed.join(", "));
        eprintln!("xtask: ################################################################");
        bail!("tests failed");
    }
    eprintln!(
        "xtask: every test passed{}",
        if skip_vm {
            ", except those that did not run (above)"
        } else {
            ""
        }
    );
    eprintln!("xtask: ################################################################");
    Ok(())
}

/// Everything the test binaries need, in the order a fresh machine needs it: setup, the house's
/// plan, fmt and clippy, licenses, the static binaries, the Debian package, the image, the test
/// build; then the binaries cargo built, each checked to be among those `cargo test` lists.
pub(crate) fn prepare() -> Result<Prepared> {
    // Where the time before the tests goes, step by step (the summary lists it).
    let mut steps: Vec<(&'static str, Duration)> = Vec::new();
    let mut step = |name, t0: Instant| steps.push((name, t0.elapsed()));
    let t0 = Instant::now();
    setup_for_tests()?;
    step("setup (toolchains, packages)", t0);
    let t0 = Instant::now();
    // The house's plan first (imports down the floors, every file on the map): seconds.
    house::check(&root_dir())?;
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    // Lints with warnings denied: the user-space crates, then the eBPF crate (for its target,
    // with the pinned nightly, as aya-build builds it: without cargo's wrappers).
    run_cmd(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    step("fmt and clippy", t0);
    let t0 = Instant::now();
    run_cmd(&mut ebpf_clippy())?;
    step("clippy of the eBPF crate", t0);
    let t0 = Instant::now();
    // Every dependency's license on the allowed list (deny.toml), and the notices shipped
    // with latprof current.
    run_cmd(
        Command::new("cargo-deny")
            .args(["--all-features", "check", "licenses"])
            .current_dir(root_dir()),
    )?;
    licenses_check_bites()?;
    notices(false)?;
    step("licenses and notices", t0);
    let t0 = Instant::now();
    // The static binary the VM checks run on every kernel, and its Debian package, which
    // lintian checks here and the package tests install in Debian 11 and 12 roots.
    dist::dist(&TARGETS)?;
    step("static binaries (release, musl; x86-64 and arm64)", t0);
    let t0 = Instant::now();
    dist::deb(&TARGETS)?;
    step("Debian package and lintian", t0);
    let t0 = Instant::now();
    // The image the container test runs (tests/container.rs).
    dist::image(&TARGETS)?;
    step("container image", t0);
    let skip_vm = vm_check()?;
    // Tests write every retry here (tests/common note_retry); the summary lists them.
    let retries = root_dir().join("target/test-retries.log");
    let _ = std::fs::remove_file(&retries);
    // Every test binary built first (as this user), then each run (as root, with sudo when
    // this user is not), timed, whatever fails before it: the summary says where the time
    // goes.
    let t0 = Instant::now();
    let json = cargo()
        .args(["test", "--no-run", "--message-format=json"])
        .output()
        .context("building the tests")?;
    if !json.status.success() {
        run_cmd(cargo().args(["test", "--no-run"]))?;
    }
    step("test build (debug)", t0);
    let binaries = executables(&String::from_utf8_lossy(&json.stdout));
    // Every test binary cargo lists runs: one the JSON reading above missed would never run,
    // and nothing would say so.
    let listed = cargo()
        .args(["test", "--no-run"])
        .output()
        .context("listing the test binaries")?;
    let missed = not_run(&binaries, &String::from_utf8_lossy(&listed.stderr));
    if !missed.is_empty() {
        bail!(
            "cargo lists test binaries the suite would not run: {}",
            missed.join(", ")
        );
    }
    Ok(Prepared {
        binaries,
        skip_vm,
        retries,
        steps,
    })
}

/// Clippy of the eBPF crate, for its target with the pinned nightly, as aya-build builds it
/// (without cargo's wrappers).
fn ebpf_clippy() -> Command {
    let mut ebpf = Command::new("cargo");
    ebpf.arg(format!("+{NIGHTLY}"))
        .args([
            "clippy",
            "--package",
            "latprof-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--no-deps",
            "--",
            "-D",
            "warnings",
        ])
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .current_dir(root_dir());
    ebpf
}

/// Whether the VM checks are skipped (`LATPROF_SKIP_VM`); an error when they cannot run and
/// are not skipped, or are skipped under CI.
fn vm_check() -> Result<bool> {
    let vm =
        env::var_os("LATPROF_SHARED").map_or_else(|| root_dir().join("../shared"), PathBuf::from);
    let vm_missing = !vm.join("vm/run.sh").exists();
    let skip_vm = env::var_os("LATPROF_SKIP_VM").is_some();
    if vm_missing && !skip_vm {
        bail!(
            "{} not found: the latencytop truth check and the kernel checks need it \
             (LATPROF_SHARED=DIR names another place; LATPROF_SKIP_VM=1 runs without them, and \
             the summary says they did NOT run)",
            vm.join("vm/run.sh").display()
        );
    }
    if skip_vm && env::var_os("CI").is_some() {
        bail!("LATPROF_SKIP_VM is set: CI must run the latencytop truth check");
    }
    Ok(skip_vm)
}

/// The command that runs one test binary: as root (with sudo when this user is not, passing
/// on what the tests read), every test including the root-only ones, in its package's
/// directory as cargo runs it.
pub(crate) fn test_command(
    test: &TestBinary,
    retries: &std::path::Path,
    skip_vm: bool,
    extra: &[String],
) -> Command {
    let mut cmd = if is_root() {
        let mut cmd = Command::new(&test.exe);
        cmd.env("LATPROF_RETRY_LOG", retries);
        cmd
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg(format!("LATPROF_RETRY_LOG={}", retries.display()));
        if skip_vm {
            cmd.arg("LATPROF_SKIP_VM=1");
        }
        // sudo resets the environment: pass on what the tests read.
        for var in [
            "CI",
            "LATPROF_TEST_DEFECT",
            "LATPROF_SHARED",
            "LATPROF_FSYNC_DIR",
            "LATPROF_DIST",
            "LATPROF_DEB",
        ] {
            if let Some(value) = env::var_os(var) {
                let mut arg = OsString::from(format!("{var}="));
                arg.push(value);
                cmd.arg(arg);
            }
        }
        cmd.arg(&test.exe);
        cmd
    };
    cmd.arg("--include-ignored")
        .args(extra)
        .current_dir(&test.dir);
    cmd
}

/// Runs every binary, one after another, each of [`BESIDE`] beside its partner (its output
/// kept and printed after the partner's, so the two do not interleave). A binary whose
/// partner was not built runs in turn.
pub(crate) fn run_binaries(
    binaries: &[TestBinary],
    command: impl Fn(&TestBinary) -> Command,
) -> Vec<Ran> {
    let partner_of = |name: &str| {
        BESIDE
            .iter()
            .find(|(beside, partner)| {
                beside == &name && binaries.iter().any(|b| b.name == *partner)
            })
            .map(|(_, partner)| *partner)
    };
    let mut ran = Vec::new();
    for test in binaries {
        if partner_of(&test.name).is_some() {
            continue;
        }
        let companions: Vec<_> = binaries
            .iter()
            .filter(|b| partner_of(&b.name) == Some(test.name.as_str()))
            .map(|b| {
                let mut cmd = command(b);
                eprintln!("xtask: beside {}: {cmd:?}", test.name);
                let (name, partner) = (b.name.clone(), partner_of(&b.name));
                // Timed in its thread: its own time, not its partner's.
                let child = thread::spawn(move || {
                    let t0 = Instant::now();
                    let output = cmd.output();
                    (t0.elapsed(), output)
                });
                (name, partner, child)
            })
            .collect();
        let t0 = Instant::now();
        let (ok, stdout) = run_echoed(&mut command(test));
        ran.push(Ran {
            name: test.name.clone(),
            took: t0.elapsed(),
            ok,
            beside: None,
            stdout,
        });
        for (name, beside, child) in companions {
            let (took, output) = child
                .join()
                .map_or((Duration::ZERO, None), |(took, output)| {
                    (
                        took,
                        output
                            .inspect_err(|e| eprintln!("xtask: {name} could not start: {e}"))
                            .ok(),
                    )
                });
            eprintln!(
                "xtask: ################ {name}, which ran beside {}:",
                test.name
            );
            let stdout = output
                .as_ref()
                .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
                .unwrap_or_default();
            let ok = output.as_ref().is_some_and(|out| {
                print!("{stdout}");
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
                out.status.success()
            });
            if output.is_none() {
                eprintln!("xtask: {name} did not run");
            }
            ran.push(Ran {
                name,
                took,
                ok,
                beside,
                stdout,
            });
        }
    }
    ran
}

/// Runs `cmd` as `run_cmd` does, its stdout printed as it comes and kept: whether it
/// succeeded, and what it printed.
fn run_echoed(cmd: &mut Command) -> (bool, String) {
    eprintln!("xtask: {cmd:?}");
    let mut child = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("xtask: {cmd:?} could not start: {e}");
            return (false, String::new());
        }
    };
    let mut kept = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    let ok = child.wait().is_ok_and(|status| status.success());
    (ok, kept)
}

/// Where the time went: each test binary's, then each step's before them, then the whole.
fn summary(ran: &[Ran], tests_took: Duration, started: Instant, steps: &[(&str, Duration)]) {
    eprintln!("xtask: ################################################################");
    eprintln!(
        "xtask: test binaries, {} s in all (build, clippy and packages before them: {} s):",
        tests_took.as_secs(),
        started.elapsed().saturating_sub(tests_took).as_secs()
    );
    for r in ran {
        eprintln!(
            "xtask:   {:>5} s  {}{}{}",
            r.took.as_secs(),
            r.name,
            r.beside
                .map(|p| format!(" (beside {p}: not in the sum)"))
                .unwrap_or_default(),
            if r.ok { "" } else { "  FAILED" }
        );
    }
    eprintln!("xtask: before them:");
    for (name, took) in steps {
        eprintln!("xtask:   {:>5} s  {name}", took.as_secs());
    }
    eprintln!(
        "xtask: in all {} s ({:.1} min)",
        started.elapsed().as_secs(),
        started.elapsed().as_secs_f64() / 60.0
    );
    eprintln!("xtask: ################################################################");
}

/// The binaries `cargo test --no-run` lists (its `Executable ... (PATH)` lines, `listed`) that
/// are not among `binaries`.
fn not_run(binaries: &[TestBinary], listed: &str) -> Vec<String> {
    listed
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Executable "))
        .filter_map(|l| {
            let path = l.rsplit_once('(')?.1.strip_suffix(')')?;
            (!binaries.iter().any(|b| b.exe.ends_with(path))).then(|| path.to_owned())
        })
        .collect()
}

/// The test binaries in `cargo test --no-run --message-format=json`'s messages.
fn executables(json: &str) -> Vec<TestBinary> {
    let field = |line: &str, key: &str| -> Option<String> {
        let key = format!("\"{key}\":\"");
        let start = line.find(&key)? + key.len();
        let end = line[start..].find('"')?;
        Some(line[start..start + end].to_owned())
    };
    // Built as a test: its profile says so (the target's own "test":true says only that it
    // could be; the binaries the tests run are built too).
    let test_profile = |line: &str| {
        line.split_once("\"profile\":{")
            .and_then(|(_, rest)| rest.split_once('}'))
            .is_some_and(|(profile, _)| profile.contains("\"test\":true"))
    };
    json.lines()
        .filter(|l| test_profile(l))
        .filter_map(|l| {
            let exe = field(l, "executable")?;
            let manifest = PathBuf::from(field(l, "manifest_path")?);
            let dir = manifest.parent()?.to_path_buf();
            let package = dir.file_name()?.to_string_lossy().into_owned();
            // The first "name" is the target's; its kind: lib, bin or test.
            let target = field(l, "name")?;
            let kind = l
                .split_once("\"kind\":[\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map_or("", |(kind, _)| kind);
            Some(TestBinary {
                name: format!("{package} {kind} {target}"),
                exe,
                dir,
            })
        })
        .collect()
}

#[cfg(test)]
impl Ran {
    /// How a binary went, for the tests of what reads it.
    pub(crate) fn for_tests(name: &str, ok: bool, stdout: &str) -> Self {
        Self {
            name: name.to_owned(),
            took: Duration::ZERO,
            ok,
            beside: None,
            stdout: stdout.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{executables, not_run};

    /// Two of cargo's messages as `cargo test --no-run --message-format=json` prints them (a
    /// test binary, and a binary the tests run, built but no test), and its human listing.
    const JSON: &str = concat!(
        r#"{"reason":"compiler-artifact","package_id":"path+file:///w/latprof#0.1.0","manifest_path":"/w/latprof/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"docs","src_path":"/w/latprof/tests/docs.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/docs-0a1b"],"executable":"/w/target/debug/deps/docs-0a1b","fresh":true}"#,
        "\n",
        r#"{"reason":"compiler-artifact","package_id":"path+file:///w/latprof#0.1.0","manifest_path":"/w/latprof/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"latprof","src_path":"/w/latprof/src/main.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":false},"features":[],"filenames":["/w/target/debug/latprof"],"executable":"/w/target/debug/latprof","fresh":true}"#,
        "\n"
    );

    #[test]
    fn test_binaries_are_read_from_cargos_messages() {
        let found = executables(JSON);
        assert_eq!(found.len(), 1, "only the one built as a test");
        assert_eq!(found[0].name, "latprof test docs");
        assert_eq!(found[0].exe, "/w/target/debug/deps/docs-0a1b");
    }

    #[test]
    fn a_binary_cargo_lists_and_the_suite_misses_is_named() {
        let found = executables(JSON);
        let listed = "   Compiling x\n  Executable tests/docs.rs (target/debug/deps/docs-0a1b)\n  Executable tests/new.rs (target/debug/deps/new-9f9f)\n";
        assert_eq!(not_run(&found, listed), ["target/debug/deps/new-9f9f"]);
        assert_eq!(
            not_run(
                &found,
                "  Executable tests/docs.rs (target/debug/deps/docs-0a1b)\n"
            ),
            Vec::<String>::new()
        );
    }
}

//! What an unprivileged user's process can point a root latprof at (`--user-stacks`): its
//! binaries, their debug links and section tables, its perf map, its names, its terminal.
//! Each test runs the user's side as `nobody`, from `../shared/hostile` or equivalents built
//! here, against latprof run as root, with bounded waits: a hang is a failure, not a stuck
//! suite.
//!
//! Needs root, gcc, objcopy and tmux; `cargo xtask test` runs it (`#[ignore]`d for a plain
//! `cargo test`).
use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

mod common;

use common::{LATPROF, TempDir, tmux::Tmux};

/// A directory for this test binary's programs, readable and enterable by `nobody`.
fn bin_dir() -> &'static Path {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    &DIR.get_or_init(|| TempDir::new("hostile-root")).0
}

/// Builds `hostile/SRC` (C) as `name` in `bin_dir()`, with frame pointers.
fn build(src: &str, name: &str) -> PathBuf {
    let out = bin_dir().join(name);
    if !out.exists() {
        let status = Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&out)
            .arg(common::hostile(src))
            .status()
            .expect("gcc (cargo xtask test installs it)");
        assert!(status.success(), "gcc {src}");
    }
    out
}

/// The hostile sleeper (`evil MODE N MS`), its file name being the marker the issue's
/// patches look for.
fn evil() -> PathBuf {
    let src = std::fs::read_dir(common::hostile(""))
        .expect("../shared/hostile")
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("MARKFILE_"))
        .expect("MARKFILE_*.c in ../shared/hostile");
    build(&src.file_name().to_string_lossy(), "evil")
}

/// A command run as `nobody` (setpriv execs it: the pid is the program's).
fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=-all",
    ])
    .arg(program);
    cmd
}

/// Waits for `child` at most `limit`; kills it (and fails) past that. Its output is read
/// meanwhile: a child whose pipe filled would otherwise wait on the reader for ever.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    fn drain<R: std::io::Read + Send + 'static>(
        pipe: Option<R>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut out);
            }
            out
        })
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            // A child that leads a process group of its own (`measured`'s) takes what it
            // started with it: a runaway latprof left behind would load every later test.
            let pid = i32::try_from(child.id()).unwrap_or(0);
            // SAFETY: getpgid and kill on our own child's pid.
            if pid > 0 && unsafe { libc::getpgid(pid) } == pid {
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
            let stderr = stderr.join().unwrap_or_default();
            panic!(
                "{what} did not end within {limit:?} (killed): {}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// A workload held at a gate until latprof has attached: `user` runs only once `open` is
/// called (a shell reads a FIFO, then execs it: the pid is the workload's), so none of its
/// sleeps falls before latprof counts, however slowly latprof loads.
struct Gate {
    fifo: PathBuf,
    _dir: TempDir,
}

impl Gate {
    /// Spawns `user` behind a new gate (into `cgroup` first, where given).
    fn spawn(user: &Command, cgroup: Option<&Path>) -> (Child, Self) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = TempDir::new(&format!("gate-{n}"));
        let fifo = dir.file("go");
        let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(status.success());
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(
            r#"fifo=$1; cg=$2; shift 2
[ -z "$cg" ] || echo $$ > "$cg/cgroup.procs" || exit 1
read _ < "$fifo" && exec "$@""#,
        );
        cmd.arg("sh")
            .arg(&fifo)
            .arg(cgroup.map_or_else(PathBuf::new, Path::to_path_buf))
            .arg(user.get_program())
            .args(user.get_args());
        for (key, value) in user.get_envs() {
            if let Some(value) = value {
                cmd.env(key, value);
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the gated workload");
        (child, Self { fifo, _dir: dir })
    }

    /// Lets the workload run.
    fn open(&self) {
        std::fs::write(&self.fifo, "go\n").expect("open the gate");
    }
}

/// Sends SIGINT to latprof and waits for it at most `limit`; it must exit 0. Returns its
/// output, stderr after its first line included.
fn interrupt_bounded(
    latprof: Child,
    mut stderr: std::io::BufReader<std::process::ChildStderr>,
    limit: Duration,
) -> Output {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(i32::try_from(latprof.id()).unwrap(), libc::SIGINT) };
    let mut out = wait_bounded(latprof, limit, "latprof after SIGINT");
    let _ = std::io::Read::read_to_end(&mut stderr, &mut out.stderr);
    assert!(
        out.status.success(),
        "latprof: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `latprof --user-stacks stats --all-sleeps --pid PID --format FORMAT` as root around `user`
/// (as nobody, PID, held at a gate until latprof has attached, then run to its end); latprof
/// must end within `limit` of SIGINT, and exit 0. Returns latprof's output.
fn stats_around(user: &Command, format: &str, limit: Duration) -> Output {
    let (workload, gate) = Gate::spawn(user, None);
    let pid = workload.id().to_string();
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--user-stacks", "stats", "--all-sleeps", "--pid", &pid])
        .args(["--format", format])
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    gate.open();
    let work = wait_bounded(workload, Duration::from_secs(60), "the workload");
    assert!(work.status.success(), "the workload: {}", work.status);
    interrupt_bounded(latprof, stderr, limit)
}

/// N1: a binary whose `.gnu_debuglink` names a FIFO (absolute: it replaces the debug
/// directory) hung the naming thread in its open for good, and with it latprof's stop.
#[test]
#[ignore = "needs root"]
fn a_debug_link_to_a_fifo_does_not_hang_latprof() {
    let dir = TempDir::new("dlink");
    let evil = evil();
    let fifo = dir.file("dbg.fifo");
    // The user's FIFO, in a directory the user may write.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let status = as_nobody(Path::new("mkfifo"))
        .args(["-m", "644"])
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let mut name = fifo.to_string_lossy().into_owned().into_bytes();
    name.push(0);
    while !name.len().is_multiple_of(4) {
        name.push(0);
    }
    name.extend_from_slice(&0x1234_5678_u32.to_le_bytes());
    let blob = dir.file("dl.blob");
    std::fs::write(&blob, &name).unwrap();
    let linked = dir.file("dlinkfifo");
    let status = Command::new("objcopy")
        .arg(format!("--add-section=.gnu_debuglink={}", blob.display()))
        .arg(&evil)
        .arg(&linked)
        .status()
        .expect("objcopy (binutils)");
    assert!(status.success());
    // The user's own binary.
    let status = Command::new("chown")
        .args(["nobody"])
        .arg(&linked)
        .status()
        .unwrap();
    assert!(status.success());
    let mut user = as_nobody(&linked);
    user.args(["raw", "1500", "3"]);
    let out = stats_around(&user, "text", Duration::from_secs(25));
    let text = String::from_utf8_lossy(&out.stdout);
    // Named from its symbols (no DWARF through the link): the function is there.
    assert!(text.contains("MARKFUNC_"), "{text}");
}

/// N2: a perf map that is a link to a file only root may read was followed, and its lines
/// became frame names in root's output.
#[test]
#[ignore = "needs root"]
fn a_perf_map_linked_to_roots_file_is_not_read() {
    let dir = TempDir::new("perfmap-link");
    let secret = dir.file("secret.txt");
    // A line that would name any address.
    std::fs::write(&secret, "0 ffffffffffffffff ROOT_ONLY_SECRET\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let jitter = build("jitter.c", "jitter");
    let mut user = as_nobody(&jitter);
    user.env("PERFMAP", format!("link:{}", secret.display()))
        .args(["1500", "3"]);
    let out = stats_around(&user, "text", Duration::from_secs(25));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("ROOT_ONLY_SECRET"), "{text}");
    // A FIFO as the map blocks nothing either.
    let mut user = as_nobody(&jitter);
    user.env("PERFMAP", "fifo").args(["1500", "3"]);
    stats_around(&user, "text", Duration::from_secs(25));
}

/// N2 (memory): a 3 GB sparse perf map and one of 5 million lines are read only up to the
/// bound, not whole (`latprof-workload measure` reports latprof's own peak memory).
#[test]
#[ignore = "needs root"]
fn huge_perf_maps_are_read_within_bounds() {
    let jitter = build("jitter.c", "jitter");
    for map in ["big:3000000000", "lines:5000000"] {
        let dir = TempDir::new("perfmap-big");
        let report = dir.file("rusage");
        let mut user = as_nobody(&jitter);
        user.env("PERFMAP", map).args(["1500", "3"]);
        let (workload, gate) = Gate::spawn(&user, None);
        let mut cmd = Command::new(common::workload_bin());
        cmd.args(["measure", "--report", report.to_str().unwrap(), LATPROF])
            .args(["--user-stacks", "stats", "--all-sleeps", "--duration", "6s"])
            .args(["--pid", &workload.id().to_string()])
            .stdout(Stdio::null());
        let (latprof, mut stderr) = common::start(&mut cmd, "attached");
        // Its map is read at its first backtrace, within the 6 s.
        gate.open();
        let mut out = wait_bounded(latprof, Duration::from_secs(40), "latprof stats");
        let _ = std::io::Read::read_to_end(&mut stderr, &mut out.stderr);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = wait_bounded(workload, Duration::from_secs(60), "jitter");
        let report = std::fs::read_to_string(&report).unwrap();
        let rss: u64 = report
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("maxrss_kib="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{report}"));
        // latprof alone peaks at about 60 MiB here (a test build); a map read whole took
        // +450 MB, or all there was.
        assert!(rss < 160 * 1024, "{map}: peak RSS {rss} KiB ({report})");
    }
}

/// N3: a section header claiming 2 GiB of `.eh_frame` (a sparse file that long) was allocated
/// whole: under a 1 GiB address-space limit root's latprof died.
#[test]
#[ignore = "needs root"]
fn a_section_claiming_gigabytes_is_not_allocated() {
    let dir = TempDir::new("ehbomb");
    let bomb = dir.file("ehbomb");
    let status = Command::new("python3")
        .arg(common::hostile("elfpatch.py"))
        .arg(evil())
        .arg(&bomb)
        .args([".eh_frame", &(2u64 << 30).to_string()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let mut user = as_nobody(&bomb);
    user.args(["libc", "1500", "3"]);
    let (workload, gate) = Gate::spawn(&user, None);
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--as={}", 1u64 << 30))
        .arg(LATPROF)
        .args(["--user-stacks", "stats", "--all-sleeps"])
        .args(["--pid", &workload.id().to_string()])
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    gate.open();
    let _ = wait_bounded(workload, Duration::from_secs(60), "ehbomb");
    let out = interrupt_bounded(latprof, stderr, Duration::from_secs(25));
    // Its frames are there: named, or (the 2 GiB file cannot be mapped under the limit)
    // by file and offset.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("MARKFUNC_") || text.contains("ehbomb+0x"),
        "{text}"
    );
}

/// N6: a process mapping 1,100 small files executable had root's latprof open every one of
/// them, to its descriptor limit.
#[test]
#[ignore = "needs root"]
fn a_process_mapping_many_files_does_not_spend_the_descriptors() {
    let dir = TempDir::new("manymaps");
    let files = dir.file("files");
    std::fs::create_dir(&files).unwrap();
    for i in 0..1100 {
        std::fs::write(files.join(format!("f{i}")), vec![0u8; 4096]).unwrap();
    }
    let manymaps = build("manymaps.c", "manymaps");
    let mut user = as_nobody(&manymaps);
    user.arg("1100").arg(&files).arg("1500");
    let (workload, gate) = Gate::spawn(&user, None);
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=1024:1024")
        .arg(LATPROF)
        .args(["--user-stacks", "stats", "--all-sleeps"])
        .args(["--pid", &workload.id().to_string()])
        .stdout(Stdio::null());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    gate.open();
    // prlimit execs latprof: the same pid.
    let pid = latprof.id();
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            most = most.max(fds.count());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = wait_bounded(workload, Duration::from_secs(60), "manymaps");
    interrupt_bounded(latprof, stderr, Duration::from_secs(25));
    // Half of the limit at most for the binaries, and about 40 for the rest.
    assert!(most > 0 && most < 600, "{most} descriptors open");
}

/// R1: a user in a user and mount namespace of its own bind-mounted a root-only file over its
/// perf map: root's latprof followed the mount, took the root-owned file as the process's own,
/// and its lines named the JIT frames.
#[test]
#[ignore = "needs root"]
fn a_perf_map_bind_mounted_over_roots_file_is_not_read() {
    let dir = TempDir::new("perfmap-bind");
    let secret = dir.file("secret.txt");
    std::fs::write(&secret, "0 ffffffffffffffff ROOT_ONLY_SECRET\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // bindmap.sh execs the jitter beside it.
    build("jitter.c", "jitter");
    let script = bin_dir().join("bindmap.sh");
    std::fs::copy(common::hostile("bindmap.sh"), &script).unwrap();
    let mut user = as_nobody(Path::new("unshare"));
    user.args(["-Urm", "sh"]).arg(&script).arg(&secret);
    // The workload fails (and so the test) where the bind mount cannot be made.
    let out = stats_around(&user, "text", Duration::from_secs(25));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("ROOT_ONLY_SECRET"), "{text}");
    // Its JIT frame was seen, and left unnamed.
    assert!(text.contains("[anon]+0x"), "{text}");
}

/// R2: the symbolizer mapped a user's library as it is; the user cut it short and wrote it
/// back in a loop, and root's latprof died of SIGBUS (exit 135) within seconds.
#[test]
#[ignore = "needs root"]
fn a_library_cut_short_under_latprof_does_not_kill_it() {
    let dir = TempDir::new("librace");
    let src = dir.file("librace.c");
    let status = Command::new("python3")
        .arg(common::hostile("mklibrace.py"))
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    let lib = dir.file("librace.so");
    let status = Command::new("gcc")
        .args([
            "-O1",
            "-g3",
            "-fno-omit-frame-pointer",
            "-shared",
            "-fPIC",
            "-o",
        ])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(status.success());
    // The user's own library: it may write it.
    let status = Command::new("chown")
        .arg("nobody")
        .arg(&lib)
        .status()
        .unwrap();
    assert!(status.success());
    let race = build("race.c", "race");
    let mut user = as_nobody(&race);
    user.arg(&lib).arg("8");
    // latprof must still be there to stop, and exit 0 (interrupt_bounded).
    let out = stats_around(&user, "text", Duration::from_secs(40));
    let text = String::from_utf8_lossy(&out.stdout);
    // Its frames are there: named from the copy, or by file and offset where the copy was
    // taken while the file was cut short.
    assert!(
        text.contains("race_fn_") || text.contains("librace.so+0x"),
        "{text}"
    );
}

/// `measured` around `user` (held at a gate until latprof has attached), which must then run
/// to its end and exit 0.
fn measured_around(user: &Command, args: &[&str], limit: Duration) -> (String, u64) {
    let (workload, gate) = Gate::spawn(user, None);
    let out = measured(args, limit, &gate);
    let work = wait_bounded(workload, Duration::from_secs(60), "the workload");
    assert!(work.status.success(), "the workload: {}", work.status);
    out
}

/// Runs `latprof ARGS` under `latprof-workload measure` until it ends by itself, at most
/// `limit`, opening `gate` once it has attached; it must exit 0. Returns its stdout and peak
/// RSS in KiB.
fn measured(args: &[&str], limit: Duration, gate: &Gate) -> (String, u64) {
    // A directory of each call's own: the tests of this binary run side by side.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = TempDir::new(&format!("measured-{n}"));
    let report = dir.file("rusage");
    let mut cmd = Command::new(common::workload_bin());
    cmd.args(["measure", "--report", report.to_str().unwrap(), LATPROF])
        .args(args)
        .stdout(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let (latprof, mut stderr) = common::start(&mut cmd, "attached");
    gate.open();
    let mut out = wait_bounded(latprof, limit, "latprof");
    let _ = std::io::Read::read_to_end(&mut stderr, &mut out.stderr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(&report).unwrap();
    let rss = report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("maxrss_kib="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{report}"));
    (String::from_utf8_lossy(&out.stdout).into_owned(), rss)
}

/// R4: 30 small binaries of a user's whose `.eh_frame` claims 60 MiB each (sparse files that
/// long) took root's latprof to 1.9 GB, kept after they exited.
#[test]
#[ignore = "needs root"]
fn sparse_sections_of_many_binaries_are_not_allocated() {
    let dir = TempDir::new("ehsparse");
    let mut bins = Vec::new();
    for i in 0..30 {
        let bin = dir.file(&format!("ehsparse{i}"));
        let status = Command::new("python3")
            .arg(common::hostile("elfpatch.py"))
            .arg(evil())
            .arg(&bin)
            .args([".eh_frame", &(60u64 << 20).to_string()])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let status = Command::new("chown")
            .arg("nobody")
            .arg(&bin)
            .status()
            .unwrap();
        assert!(status.success());
        bins.push(format!("{} libc 1500 3 &", bin.display()));
    }
    let script = format!("{} wait", bins.join(" "));
    let mut user = as_nobody(Path::new("sh"));
    user.args(["-c", &script]);
    let (text, rss) = measured_around(
        &user,
        &[
            "--user-stacks",
            "stats",
            "--all-sleeps",
            "--duration",
            "10s",
        ],
        Duration::from_secs(90),
    );
    assert!(
        text.contains("ehsparse"),
        "their sleeps are counted:\n{text}"
    );
    // Whole-machine, latprof names every process's frames, this test binary's others' too:
    // it peaked at 60 to 211 MB here (a test build), as the tests beside it ran. 30 tables read
    // whole took 1.8 GB more.
    assert!(rss < 600 * 1024, "peak RSS {rss} KiB");
}

/// R6: a 24 KB binary whose `.dynsym` claims 100 GiB (and one whose `.symtab` claims 2 GiB),
/// in sparse files that long: root's latprof died allocating what they claimed.
#[test]
#[ignore = "needs root"]
fn symbol_tables_claiming_gigabytes_are_not_allocated() {
    for (section, size) in [(".dynsym", 100u64 << 30), (".symtab", 2 << 30)] {
        let dir = TempDir::new("symbomb");
        let bomb = dir.file("symbomb");
        let status = Command::new("python3")
            .arg(common::hostile("elfpatch.py"))
            .arg(evil())
            .arg(&bomb)
            .args([section, &size.to_string()])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let status = Command::new("chown")
            .arg("nobody")
            .arg(&bomb)
            .status()
            .unwrap();
        assert!(status.success());
        let mut user = as_nobody(&bomb);
        user.args(["libc", "1500", "3"]);
        let (workload, gate) = Gate::spawn(&user, None);
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--as={}", 1u64 << 30))
            .arg(LATPROF)
            .args(["--user-stacks", "stats", "--all-sleeps"])
            .args(["--pid", &workload.id().to_string()])
            .stdout(Stdio::piped());
        let (latprof, stderr) = common::start(&mut cmd, "attached");
        gate.open();
        let _ = wait_bounded(workload, Duration::from_secs(60), "symbomb");
        let out = interrupt_bounded(latprof, stderr, Duration::from_secs(25));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("symbomb+0x"), "{section}: {text}");
    }
}

/// R11: 24 processes passing tokens (five wait sites) took `stats --chains` past 4 GiB with
/// no output at the default depth: the chains' tree grew as 24 to the depth.
#[test]
#[ignore = "needs root"]
fn wait_chains_of_a_process_mesh_stay_bounded() {
    let procmesh = build("procmesh.c", "procmesh");
    let mut user = as_nobody(&procmesh);
    user.args(["24", "8"]);
    let (json, rss) = measured_around(
        &user,
        &[
            "--chains",
            "--chain-depth",
            "8",
            "stats",
            "--format",
            "json",
            "--duration",
            "10s",
        ],
        Duration::from_secs(120),
    );
    assert!(
        json.contains("\"behind\""),
        "chains were split:\n{json:.2000}"
    );
    // And the output says how much the bounds left whole.
    let doc: serde_json::Value = serde_json::from_str(&json).expect("latprof's JSON");
    let not_split = doc["chain_sleeps_not_split"].as_u64();
    assert!(not_split > Some(0), "chain_sleeps_not_split: {not_split:?}");
    // About 60 MiB alone; bounded trees add a few. Unbounded, gigabytes.
    assert!(rss < 400 * 1024, "peak RSS {rss} KiB");
}

/// The hostile sleeper with its names rewritten by `patch.py` (escape sequences, forged
/// lines), in `dir`.
fn patched(dir: &TempDir) -> PathBuf {
    let patched = dir.file("patched");
    let status = Command::new("python3")
        .arg(common::hostile("patch.py"))
        .arg(evil())
        .arg(&patched)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(&patched, std::fs::Permissions::from_mode(0o755)).unwrap();
    patched
}

/// N7: escapes and forged lines in function, source file and binary names reached root's
/// terminal raw.
#[test]
#[ignore = "needs root"]
fn names_from_a_users_binary_are_printable() {
    let dir = TempDir::new("escapes");
    let patched = patched(&dir);
    for format in ["text", "folded"] {
        let mut user = as_nobody(&patched);
        user.args(["raw", "1500", "3"]);
        let out = stats_around(&user, format, Duration::from_secs(25));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("PWNED"),
            "{format}: the patched name is shown\n{text}"
        );
        assert!(
            !text.contains('\x1b') && !text.contains('\x07'),
            "{format}: an escape reached the output\n{text:?}"
        );
        // Every line is a line latprof wrote: the forged "1 1 1 fake;line" stays inside one.
        for line in text.lines().filter(|l| l.contains("fake")) {
            assert!(line.contains("PWNED"), "{format}: a forged line\n{text}");
        }
    }
}

/// N7: a cgroup's name is any delegated user's choice (systemd user slices, containers), and
/// a user's binary names the frames `spikes` prints: escapes in either reached root's
/// terminal raw.
#[test]
#[ignore = "needs root"]
fn cgroup_names_and_spike_lines_are_printable() {
    let dir = TempDir::new("escapes-cg");
    let patched = patched(&dir);
    let cgroups = common::cgroups::Cgroups::make(&["latprof-evil-\x1b[31mRED\x07"]);
    let cgroup = cgroups.path(0).to_owned();
    for command in [
        &["stats", "--by", "cgroup"][..],
        &["--spike", "1ms", "spikes"][..],
    ] {
        let mut user = as_nobody(&patched);
        // About 1 s of sleeps: its map is read as soon as its first backtrace is announced
        // (the capture thread does not wait for names being found).
        user.args(["raw", "300", "3"]);
        let (workload, gate) = Gate::spawn(&user, Some(&cgroup));
        let pid = workload.id().to_string();
        // A spike a line: more than a pipe holds, so into a file.
        let printed = dir.file("out");
        let mut cmd = Command::new(LATPROF);
        cmd.arg("--user-stacks")
            .args(command)
            .args(["--pid", &pid])
            .stdout(std::fs::File::create(&printed).unwrap());
        let (latprof, stderr) = common::start(&mut cmd, "attached");
        gate.open();
        let _ = wait_bounded(workload, Duration::from_secs(60), "the workload");
        interrupt_bounded(latprof, stderr, Duration::from_secs(25));
        let text = std::fs::read_to_string(&printed).unwrap();
        assert!(
            text.contains("PWNED"),
            "{command:?}: the patched name\n{text}"
        );
        if command[0] == "stats" {
            assert!(
                text.contains("latprof-evil-\\x1b[31mRED\\x07"),
                "{command:?}: the cgroup, escaped\n{text}"
            );
        }
        assert!(
            !text.contains('\x1b') && !text.contains('\x07'),
            "{command:?}: an escape reached the output\n{text:?}"
        );
    }
}

/// N15: a library loaded after the process's first sleep (dlopen) was never named: the
/// process's memory map was read once. The workload sleeps in its own code until latprof has
/// seen it, then loads the library and sleeps in it.
#[test]
#[ignore = "needs root"]
fn a_library_loaded_after_the_first_sleep_is_named() {
    let dir = TempDir::new("dlopen");
    std::fs::write(
        dir.file("lib.c"),
        "#include <time.h>\n\
         __attribute__((noinline)) void SLEEPS_IN_A_LIBRARY(long ns) {\n\
             struct timespec t = {0, ns}; nanosleep(&t, 0);\n\
         }\n",
    )
    .unwrap();
    std::fs::write(
        dir.file("main.c"),
        "#include <dlfcn.h>\n#include <time.h>\n#include <unistd.h>\n\
         int main(int argc, char **argv) {\n\
             struct timespec t = {0, 3000000};\n\
             while (access(argv[2], F_OK) != 0) nanosleep(&t, 0);\n\
             void *lib = dlopen(argv[1], RTLD_NOW); if (!lib) return 1;\n\
             void (*f)(long) = (void (*)(long))dlsym(lib, \"SLEEPS_IN_A_LIBRARY\");\n\
             for (int i = 0; i < 300; i++) f(3000000);\n\
             return 0;\n\
         }\n",
    )
    .unwrap();
    for (args, out) in [
        (&["-shared", "-fPIC", "lib.c"][..], "lib.so"),
        (&["main.c", "-ldl"][..], "main"),
    ] {
        let status = Command::new("gcc")
            .current_dir(&dir.0)
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o", out])
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "gcc {out}");
    }
    let go = dir.file("go");
    let workload = as_nobody(&dir.file("main"))
        .arg(dir.file("lib.so"))
        .arg(&go)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = workload.id().to_string();
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--user-stacks", "stats", "--all-sleeps", "--pid", &pid])
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    // The workload sleeps every 3 ms: its map is read at its first backtrace after attach.
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go, "").unwrap();
    let work = wait_bounded(workload, Duration::from_secs(30), "the workload");
    assert!(
        work.status.success(),
        "the workload failed: {}",
        work.status
    );
    let (out, _) = common::interrupt(latprof, stderr);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SLEEPS_IN_A_LIBRARY"), "{text}");
}

/// N15: a valid perf map written before the first sleep (and removed when the process
/// exits) named nothing: it was read only when naming, after the process was gone.
#[test]
#[ignore = "needs root"]
fn a_jit_frame_is_named_from_the_processs_perf_map() {
    let jitter = build("jitter.c", "jitter");
    let mut user = as_nobody(&jitter);
    user.env("PERFMAP", "name:MYJITFN").args(["1500", "3"]);
    let out = stats_around(&user, "text", Duration::from_secs(25));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("MYJITFN"), "{text}");
}

/// N10: naming must not hold a stop: 40 processes with 200 MB perf maps made
/// `stats --duration 3s` take 13 s, with the programs attached (they outlive it: their maps
/// are there when the last snapshot names their frames). Timed from SIGINT to exit. The processes are in a cgroup
/// of their own that latprof is limited to, so only their frames are named.
#[test]
#[ignore = "needs root"]
fn naming_does_not_hold_the_stop() {
    let jitter = build("jitter.c", "jitter");
    let cgroups = common::cgroups::Cgroups::make(&["latprof-test-bigmaps"]);
    let cgroup = cgroups.path(0).to_owned();
    let workloads: Vec<Child> = (0..40)
        .map(|_| {
            // Into the cgroup before the program starts, then nobody's jitter.
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && exec setpriv --reuid=nobody --regid=nogroup \
                     --clear-groups {} 3000 3",
                    cgroup.display(),
                    jitter.display()
                ))
                .env("PERFMAP", "big:200000000")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--user-stacks", "stats", "--all-sleeps", "--cgroup"])
        .arg(&cgroup)
        .stdout(Stdio::piped());
    let (latprof, mut stderr) = common::start(&mut cmd, "attached");
    // Counting while the jitters sleep every 3 ms.
    std::thread::sleep(Duration::from_secs(2));
    let stopped = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(i32::try_from(latprof.id()).unwrap(), libc::SIGINT) };
    let out = wait_bounded(latprof, Duration::from_secs(60), "latprof stats");
    let took = stopped.elapsed();
    // Still running (and their maps still there) when latprof stopped: no longer needed, nor
    // their maps (the jitter leaves its map behind; the shell exec'd it, so its pid is theirs).
    for mut w in workloads {
        let _ = w.kill();
        let _ = w.wait();
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", w.id()));
    }
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(out.status.success(), "{rest}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("[anon]+0x7"),
        "the jitters' sleeps are counted:\n{text}"
    );
    // Reading the maps whole took 8 s more here.
    eprintln!("stats took {took:?} from SIGINT to exit");
    assert!(took < Duration::from_secs(4), "took {took:?} to stop");
}

/// N11: a recording with user frames names other users' functions and binaries: only its
/// owner reads it.
#[test]
#[ignore = "needs root"]
fn recordings_with_user_frames_are_private() {
    let dir = TempDir::new("private-rec");
    let rec = dir.file("run.lpr");
    let out = Command::new(LATPROF)
        .args(["--user-stacks", "record", "--duration", "1s", "-o"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&rec).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
}

/// N5: `top` and `replay` spun at full CPU for ever, deaf to signals, programs attached, when
/// their terminal went away; they must leave within 2 s.
#[test]
#[ignore = "needs root and tmux"]
fn top_and_replay_leave_when_their_terminal_goes() {
    let dir = TempDir::new("hangup");
    let rec = dir.file("run.lpr");
    let out = Command::new(LATPROF)
        .args(["record", "--duration", "1s", "-o"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (what, command) in [
        ("top", format!("{LATPROF} top")),
        ("replay", format!("{LATPROF} replay {}", rec.display())),
    ] {
        let tmux = Tmux::start(&command);
        // latprof's pid once its screen is up: the pane's command, or its child where a
        // shell runs it.
        let pid = tmux.wait_until(|screen| {
            let pane: Option<u32> = tmux.display("#{pane_pid}").parse().ok();
            match pane.and_then(latprof_at) {
                Some(pid) if screen.contains("Global causes") => Ok(pid),
                _ => Err(format!("{what} did not start")),
            }
        });
        tmux.close();
        let gone = Instant::now() + Duration::from_secs(2);
        while Path::new(&format!("/proc/{pid}")).exists() {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state.contains(") Z") {
                break;
            }
            if Instant::now() >= gone {
                // SAFETY: ending the process this test started.
                unsafe { libc::kill(i32::try_from(pid).unwrap(), libc::SIGKILL) };
                panic!("{what} still runs 2 s after its terminal went away: {state}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `pid` if it is latprof, else its child that is.
fn latprof_at(pid: u32) -> Option<u32> {
    let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    if comm(pid).trim() == "latprof" {
        return Some(pid);
    }
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .find(|&c| comm(c).trim() == "latprof")
}

/// `latprof --user-stacks stats --all-sleeps --cgroup CGROUP --format json` around `user`,
/// started in `cgroup` once latprof has attached: the workload must succeed, latprof exit 0.
fn user_stacks_of_cgroup(user: &Command, cgroup: &Path) -> serde_json::Value {
    let (workload, gate) = Gate::spawn(user, Some(cgroup));
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--user-stacks", "stats", "--all-sleeps", "--format", "json"])
        .arg("--cgroup")
        .arg(cgroup)
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    gate.open();
    let work = wait_bounded(workload, Duration::from_secs(60), "the workload");
    assert!(work.status.success(), "the workload: {}", work.status);
    let out = interrupt_bounded(latprof, stderr, Duration::from_secs(25));
    serde_json::from_slice(&out.stdout).expect("latprof's JSON")
}

/// R5: a library rewritten in place (the same inode, new contents) is read anew for the
/// processes that map it after. A user's `libfl.so` (`fl.S`: `frameless_sleep` saves `rbp`
/// and clobbers it, so only its unwind rows lead back to its callers) is run by `flmain`,
/// then overwritten with another build (8 KiB of padding before the function, two more
/// registers saved) and run again: every sleep of both runs unwinds to `STALE_TEST_OUTER`.
/// On the old code the first contents' rows and names, kept by (device, inode), served the
/// second run, whose backtraces stopped in the library.
#[test]
#[ignore = "needs root"]
fn a_library_rewritten_in_place_is_read_anew() {
    const SLEEPS: u64 = 100;
    let dir = TempDir::new("rewritten");
    let shared_lib = |name: &str, defines: &[&str]| {
        let out = bin_dir().join(name);
        let status = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .args(defines)
            .arg(common::hostile("fl.S"))
            .status()
            .expect("gcc");
        assert!(status.success(), "gcc fl.S {defines:?}");
        out
    };
    let (first, second) = (
        shared_lib("libfl1.so", &[]),
        shared_lib("libfl2.so", &["-DPAD", "-DMORE"]),
    );
    let flmain = build("flmain.c", "flmain");
    // The user's own library, which the user rewrites.
    let lib = dir.file("libfl.so");
    std::fs::copy(&first, &lib).expect("copy the library");
    let status = Command::new("chown")
        .arg("nobody:nogroup")
        .args([&lib, &dir.0])
        .status()
        .expect("chown");
    assert!(status.success());
    let (flmain, lib, second) = (flmain.display(), lib.display(), second.display());
    let mut user = as_nobody(Path::new("/bin/sh"));
    user.arg("-c").arg(format!(
        "{flmain} {lib} {SLEEPS} && cat {second} > {lib} && {flmain} {lib} {SLEEPS}"
    ));
    let cgroups = common::cgroups::Cgroups::make(&["latprof-test-rewritten"]);
    let doc = user_stacks_of_cgroup(&user, cgroups.path(0));
    let (mut whole, mut cut) = (0, Vec::new());
    for cause in doc["causes"].as_array().expect("causes") {
        let frames = common::ustacks::user_frames(cause);
        let count = cause["count"].as_u64().expect("count");
        let in_lib = frames
            .iter()
            .any(|f| f.starts_with("frameless_sleep") || f.contains("libfl.so"));
        if frames.iter().any(|f| f.starts_with("STALE_TEST_OUTER")) {
            whole += count;
        } else if in_lib {
            cut.push((count, frames));
        }
    }
    // Each run's sleeps, but for a few: those the kernel hid (a hidden waking loses the
    // backtrace), and a process's first ones, walked before its unwind rows are in the kernel
    // (the naming thread then finds the library's caller from the return address on the
    // stack, and the walk stops there: `[truncated]`).
    // On a loaded machine a process waits longer for its rows: half of a run's sleeps may
    // be walked before them; on the old code none of the second run's reached a caller.
    let cut_at_caller: u64 = cut
        .iter()
        .filter(|(_, f)| f.iter().any(|f| f.starts_with("STALE_TEST_CALLER")))
        .map(|(n, _)| n)
        .sum();
    let cut_all: u64 = cut.iter().map(|(n, _)| n).sum();
    assert!(
        whole >= SLEEPS + SLEEPS / 2
            && cut_at_caller == cut_all
            && whole + cut_all >= 2 * SLEEPS - 10,
        "{whole} of {} sleeps unwound to STALE_TEST_OUTER; cut short: {cut:?}",
        2 * SLEEPS
    );
}

/// R3: the unwind table's rows of files no live process maps are given back. A user runs a
/// binary whose `.eh_frame` needs 131,070 rows (`mkeh.py fit`), then, once it has exited,
/// one of other contents that needs 129,000: the two together pass the users' three quarters
/// of the table. On the old code the second found no room (`unwind_rows_full` 1: its
/// backtraces would stop at its frameless functions) and the table stayed full for the rest
/// of the run; now the first one's rows are given back to it.
#[test]
#[ignore = "needs root"]
fn unwind_rows_of_processes_gone_are_given_back() {
    let dir = TempDir::new("rows");
    let crafted = |name: &str, fdes: &str| {
        let out = dir.file(name);
        let status = Command::new("/usr/bin/python3")
            .arg(common::hostile("mkeh.py"))
            .arg(evil())
            .arg(&out)
            .args(["fit", fdes])
            .stdout(Stdio::null())
            .status()
            .expect("python3");
        assert!(status.success(), "mkeh.py fit {fdes}");
        out
    };
    let (first, second) = (crafted("rows-a", "43690"), crafted("rows-b", "43000"));
    let mut user = as_nobody(Path::new("/bin/sh"));
    user.arg("-c").arg(format!(
        "{} libc 200 3 && {} libc 200 3",
        first.display(),
        second.display()
    ));
    let cgroups = common::cgroups::Cgroups::make(&["latprof-test-rows"]);
    let doc = user_stacks_of_cgroup(&user, cgroups.path(0));
    let counters = &doc["counters"];
    assert_eq!(
        counters["unwind_rows_full"].as_u64(),
        Some(0),
        "a file found no room in the unwind table: {counters}"
    );
    // Both programs' sleeps were counted and named (200 each, about 0.7 s: each is read
    // while it runs; a few the kernel hid may be missing).
    let marked: u64 = doc["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| {
            common::ustacks::user_frames(c)
                .iter()
                .any(|f| f.starts_with("MARKFUNC_"))
        })
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    assert!(
        marked >= 380,
        "{marked} of 400 sleeps under MARKFUNC_: {:?}",
        doc["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .map(|c| (c["count"].as_u64(), common::ustacks::user_frames(c)))
            .collect::<Vec<_>>()
    );
}

/// R7: perf maps are budgeted per user. Four of nobody's JITs write maps of 600,000 lines
/// each (12 MB): past a user's 32 MiB, nobody's next maps stop being read
/// (`perf_maps_stopped`), and root's JIT started after them is still named from its map. On
/// the old code one budget of 64 MiB served the whole run, which nobody's maps spent.
#[test]
#[ignore = "needs root"]
fn a_users_perf_maps_do_not_spend_roots_budget() {
    let jitter = build("jitter.c", "jitter");
    let cgroups = common::cgroups::Cgroups::make(&["latprof-test-perfmaps"]);
    let mut cmd = Command::new(LATPROF);
    cmd.args(["--user-stacks", "stats", "--all-sleeps", "--format", "json"])
        .arg("--cgroup")
        .arg(cgroups.path(0))
        .stdout(Stdio::piped());
    let (latprof, stderr) = common::start(&mut cmd, "attached");
    let spawn = |user: &mut Command, map: &str| {
        user.env("PERFMAP", map).args(["400", "5"]);
        let (child, gate) = Gate::spawn(user, Some(cgroups.path(0)));
        gate.open();
        child
    };
    let users: Vec<Child> = (0..4)
        .map(|_| spawn(&mut as_nobody(&jitter), "lines:600000"))
        .collect();
    // Root's JIT after nobody's maps were read: the capture thread reads a process's map
    // within its 50 ms tick of the process's first backtrace, and each writes its map in a
    // fraction of a second before its first sleep; 1.5 s leaves them both many times over.
    std::thread::sleep(Duration::from_millis(1500));
    let root = spawn(&mut Command::new(&jitter), "name:ROOTJITFN");
    for child in users.into_iter().chain([root]) {
        let pid = child.id();
        let out = wait_bounded(child, Duration::from_secs(60), "a jitter");
        assert!(out.status.success(), "jitter {pid}: {}", out.status);
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }
    let out = interrupt_bounded(latprof, stderr, Duration::from_secs(25));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("latprof's JSON");
    let stopped = doc["counters"]["perf_maps_stopped"].as_u64();
    assert!(
        stopped >= Some(1),
        "nobody's maps were read past its budget: {stopped:?}"
    );
    let named = doc["causes"].as_array().expect("causes").iter().any(|c| {
        common::ustacks::user_frames(c)
            .iter()
            .any(|f| f.contains("ROOTJITFN"))
    });
    assert!(
        named,
        "root's JIT is not named: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

//! Files any user may hand `latprof dump` and `replay`, built to hurt: compression and memory
//! bombs, files that never end or block, names with terminal escapes. Each must end in bounded
//! memory and CPU time (the child's own rusage) with one clear line, never a panic.
//!
//! Needs no root: these run in a plain `cargo test`.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use latprof::store::{FILE_HEADER_LEN, KIND_KEY, MAGIC, VERSION, codec::Enc, writer::frame};

mod common;

use common::LATPROF;

/// The ceiling a hostile file may push latprof to: far above what reading it needs (a few
/// MiB), far below what the bombs asked for before the reader was bounded (4.5 GB).
const MAX_RSS_KIB: i64 = 200 * 1024;
/// CPU seconds: the time bomb took 66 s before; bounded, it takes well under one.
const MAX_CPU_S: f64 = 5.0;

struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
    cpu_s: f64,
}

/// Runs latprof with `args` under `latprof-workload measure` (its peak memory is its own, not
/// this test process's), its output in files (a pipe could fill).
fn run(args: &[&str], dir: &Path) -> Run {
    run_with(Command::new(common::workload_bin()), args, dir)
}

/// [`run`] as the user any user is: `nobody` where the tests run as root (`dir` is then made
/// writable for its report).
fn run_as_nobody(args: &[&str], dir: &Path) -> Run {
    use std::os::unix::fs::PermissionsExt as _;
    // SAFETY: no memory effects.
    if unsafe { libc::geteuid() } != 0 {
        return run(args, dir);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut command = Command::new("runuser");
    command
        .args(["-u", "nobody", "--"])
        .arg(common::workload_bin());
    run_with(command, args, dir)
}

fn run_with(mut command: Command, args: &[&str], dir: &Path) -> Run {
    let out = dir.join("stdout");
    let err = dir.join("stderr");
    let report = dir.join("rusage");
    let _ = std::fs::remove_file(&report);
    let status = command
        .args(["measure", "--report", report.to_str().unwrap(), LATPROF])
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .status()
        .expect("spawn latprof-workload measure");
    let stderr = std::fs::read_to_string(err).unwrap();
    assert!(status.success(), "measure failed: {stderr}");
    let report = std::fs::read_to_string(report).unwrap();
    let field = |key: &str| -> f64 {
        report
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {report}"))
    };
    #[expect(clippy::cast_possible_truncation, reason = "small integers")]
    let int = |key: &str| field(key) as i64;
    Run {
        code: Some(i32::try_from(int("code")).unwrap()).filter(|c| *c >= 0),
        signal: Some(i32::try_from(int("signal")).unwrap()).filter(|s| *s != 0),
        // pprof is binary.
        stdout: String::from_utf8_lossy(&std::fs::read(out).unwrap()).into_owned(),
        stderr,
        max_rss_kib: int("maxrss_kib"),
        cpu_s: field("cpu_s"),
    }
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latprof-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file header and these frames.
fn recording(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&[0, 0]);
    assert_eq!(bytes.len(), FILE_HEADER_LEN);
    for f in frames {
        bytes.extend_from_slice(f);
    }
    bytes
}

/// The start of a key frame's payload: the recording's facts (the current version's layout), then a
/// body's times and an empty backtrace list; what follows is up to the bomb.
fn key_frame_head() -> Enc {
    let mut e = key_frame_info();
    e.u64(1); // taken
    e.u64(1); // wall
    e.usize(0); // backtraces
    e
}

/// The recording's facts of a key frame (the current version's layout).
fn key_frame_info() -> Enc {
    let mut e = Enc::default();
    for s in ["0.1.0", "host", "6.18.0", "#1"] {
        e.str(s);
    }
    e.u32(2); // cpus
    e.u64(0); // lazy
    e.u64(1_000_000_000); // interval
    e.u32(12); // stack depth
    e.bool(true); // details
    for _ in 0..4 {
        e.u64(0); // sched and lock text
    }
    e.str(""); // kernel facts: config source
    e.u64(0); // HZ
    for _ in 0..4 {
        e.u64(0); // optional booleans
    }
    e.usize(0); // nohz_full CPUs
    e.usize(0); // tick sources
    e.u64(u64::MAX); // spike threshold
    e.str(""); // programs
    e.str(""); // their cost
    e.usize(0); // fallbacks
    e.bool(false); // wakers (format 6)
    e.bool(false); // waker stacks
    e.bool(false); // user stacks (format 7)
    e.str(""); // the kernel's build id (format 8)
    e.bool(false); // chains (format 10)
    e
}

/// Bounded memory and time, a failure or a warning said in lines, never a panic or an abort.
fn assert_bounded(r: &Run, what: &str) {
    assert!(
        r.signal.is_none() && r.code != Some(101),
        "{what}: latprof died (signal {:?}, code {:?}):\n{}",
        r.signal,
        r.code,
        r.stderr
    );
    assert!(!r.stderr.contains("panicked"), "{what}: {}", r.stderr);
    assert!(
        r.max_rss_kib < MAX_RSS_KIB,
        "{what}: {} KiB resident",
        r.max_rss_kib
    );
    assert!(r.cpu_s < MAX_CPU_S, "{what}: {} s of CPU", r.cpu_s);
}

/// D3: one 8 KB key frame declaring 134 million empty symbols (2 bytes each in the frame,
/// 32 in memory): the reader stops at what the file's size allows.
#[test]
fn a_symbol_bomb_is_refused_in_bounded_memory() {
    let dir = tempdir("syms");
    for count in [134_000_000usize, 30_000_000] {
        let mut e = key_frame_head();
        e.usize(count);
        e.buf.resize(e.buf.len() + 2 * count, 0);
        let bytes = recording(&[frame(KIND_KEY, &e.buf, true)]);
        assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
        let path = dir.join(format!("syms-{count}.lpr"));
        std::fs::write(&path, &bytes).unwrap();
        let r = run(&["dump", path.to_str().unwrap()], &dir);
        assert_bounded(&r, "symbol bomb");
        assert_eq!(r.code, Some(1), "{}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains("than latprof writes"), "{}", r.stderr);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// D4: 300 frames of a few KB that each inflate to 256 MiB of zeros (77 GB in all).
#[test]
fn a_compression_bomb_costs_bounded_time() {
    let dir = tempdir("zeros");
    let zeros = frame(KIND_KEY, &vec![0; 256 << 20], true);
    let small = frame(KIND_KEY, &vec![0; 16 << 20], true);
    let mut frames = vec![zeros; 300];
    // Smaller ones that each fit the limit: together they do not.
    frames.extend(std::iter::repeat_n(small, 300));
    let bytes = recording(&frames);
    assert!(bytes.len() < 8 << 20, "{} bytes", bytes.len());
    let path = dir.join("zeros.lpr");
    std::fs::write(&path, &bytes).unwrap();
    let r = run(&["dump", path.to_str().unwrap()], &dir);
    assert_bounded(&r, "compression bomb");
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// D15: a device that never ends, a FIFO nobody writes, a directory: refused at once.
#[test]
fn files_that_are_not_regular_are_refused() {
    let dir = tempdir("special");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = fifo.to_str().unwrap();
    let d = dir.to_str().unwrap();
    for args in [
        vec!["dump", "/dev/zero"],
        vec!["dump", fifo],
        vec!["dump", d],
        vec!["replay", "/dev/zero"],
        vec!["stats", "--reasons", "/dev/zero", "--duration", "1ms"],
        vec!["stats", "--reasons", fifo, "--duration", "1ms"],
    ] {
        let r = run(&args, &dir);
        assert_bounded(&r, &args.join(" "));
        assert_eq!(r.code, Some(1), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("not a regular file"),
            "{args:?}: {}",
            r.stderr
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// D16: 20,000 damaged frames are not one 1.4 MB error line: the first few are named, the
/// rest counted.
#[test]
fn many_damaged_frames_are_counted_not_listed() {
    let dir = tempdir("damaged");
    let mut bad = frame(KIND_KEY, b"not a snapshot", false);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let bytes = recording(&vec![bad; 20_000]);
    let path = dir.join("damaged.lpr");
    std::fs::write(&path, &bytes).unwrap();
    let r = run(&["dump", path.to_str().unwrap()], &dir);
    assert_bounded(&r, "damaged frames");
    assert_eq!(r.code, Some(1));
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.len() < 2000,
        "{} bytes: {}",
        r.stderr.len(),
        r.stderr
    );
    assert!(r.stderr.contains("19990 more problems"), "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// D6: a task name with terminal escapes, as a hostile recording holds it, reaches no output
/// raw.
#[test]
fn escapes_in_a_recording_are_printed_escaped() {
    use latprof::{
        collect::{Snapshot, TaskSnapshot},
        store::{
            RecordingInfo,
            writer::{Options, Writer},
        },
        symbols::Kallsyms,
    };
    let dir = tempdir("escapes");
    let path = dir.join("names.lpr");
    let syms = Kallsyms::parse("ffffffff81200000 T hrtimer_nanosleep\n").unwrap();
    let mut w = Writer::create(&path, RecordingInfo::default(), Options::default()).unwrap();
    let mut snap = Snapshot::default();
    snap.stacks.insert(7, vec![0xffff_ffff_8120_0010]);
    snap.tasks.push(TaskSnapshot {
        tid: 42,
        tgid: 42,
        comm: "\x1b[2J\x1b[31mPWN".into(),
        kthread: false,
        task_only: 0,
        records: vec![latprof_common::LatencyRecord {
            stack_id: 7,
            count: 1,
            total_ns: 9_000_000,
            max_ns: 9_000_000,
            cgroup: 0,
        }],
    });
    w.append(&snap, &syms).unwrap();
    w.finish("test").unwrap();
    for format in ["json", "text", "folded", "openmetrics"] {
        let r = run(
            &[
                "dump",
                "--format",
                format,
                "--pid",
                "42",
                path.to_str().unwrap(),
            ],
            &dir,
        );
        assert_eq!(r.code, Some(0), "{format}: {}", r.stderr);
        assert!(!r.stdout.contains('\x1b'), "{format}: {:?}", r.stdout);
        if format == "json" {
            assert!(r.stdout.contains(r"\\x1b[2J\\x1b[31mPWN"), "{}", r.stdout);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// D16: under a small `ulimit -v`, running out of memory is one line and exit status 1, not
/// an abort with a backtrace. The file decodes to 60 MB (within what the reader allows), so
/// some of these limits stop latprof in the middle of reading it.
#[test]
fn out_of_memory_is_one_line() {
    let dir = tempdir("ulimit");
    let mut e = key_frame_head();
    e.usize(0);
    e.buf.resize(e.buf.len() + (60 << 20), 0);
    let path = dir.join("big.lpr");
    std::fs::write(&path, recording(&[frame(KIND_KEY, &e.buf, true)])).unwrap();
    drop(e);
    let mut out_of_memory = 0;
    for limit_kib in [40_000, 60_000, 80_000, 100_000, 120_000, 160_000] {
        let out = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "ulimit -v {limit_kib} && exec {LATPROF} dump {}",
                    path.display()
                ),
            ])
            .output()
            .expect("sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("memory allocation of") && !stderr.contains("panicked"),
            "ulimit -v {limit_kib}: {stderr}"
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "ulimit -v {limit_kib}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "ulimit -v {limit_kib}: {stderr}");
        eprintln!("ulimit -v {limit_kib}: {stderr}");
        if stderr.contains("out of memory allocating") {
            out_of_memory += 1;
        }
    }
    assert!(
        out_of_memory > 0,
        "no limit was small enough to run out of memory"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A key frame whose items fit the decoder's budget but whose snapshot would take three times
/// that to rebuild: refused as holding no snapshot, never a recording with facts and no
/// snapshot (whose first use panicked).
#[test]
fn a_snapshot_too_big_to_rebuild_is_refused() {
    let dir = tempdir("rebuild");
    let records = 1_000_000;
    let mut e = key_frame_head();
    e.usize(0); // symbols
    e.u64(0); // lazy
    e.bool(false); // skip kthreads
    e.u32(0); // retries
    e.usize(0); // counters
    e.usize(0); // programs
    e.usize(0); // tasks gone
    e.usize(1); // one task
    e.u32(1);
    e.u32(1);
    e.str("x");
    e.bool(false);
    e.u32(0);
    e.usize(records);
    e.buf.resize(e.buf.len() + 4 * records, 0);
    for _ in 0..5 {
        e.usize(0); // global gone, global, histograms gone, histograms, ticks
    }
    let path = dir.join("rebuild.lpr");
    std::fs::write(&path, recording(&[frame(KIND_KEY, &e.buf, true)])).unwrap();
    let r = run(&["dump", path.to_str().unwrap()], &dir);
    assert_bounded(&r, "snapshot too big to rebuild");
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("holds no complete snapshot"),
        "{}",
        r.stderr
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file of frame headers that each claim the rest of the file: each would be read and
/// checksummed in turn (quadratic: terabytes for a few megabytes). Reading is bounded too.
#[test]
fn headers_that_claim_the_rest_of_the_file_cost_bounded_time() {
    let dir = tempdir("claims");
    let headers = 200_000;
    let mut bytes = recording(&[]);
    let len = 18 * headers;
    for i in 0..headers {
        bytes.extend_from_slice(b"LPF\x1e");
        let rest = u32::try_from(len - 18 * (i + 1)).unwrap();
        bytes.extend_from_slice(&rest.to_le_bytes());
        bytes.extend_from_slice(&[KIND_KEY, 0]);
        bytes.extend_from_slice(&rest.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
    }
    let path = dir.join("claims.lpr");
    std::fs::write(&path, &bytes).unwrap();
    let r = run(&["dump", path.to_str().unwrap()], &dir);
    assert_bounded(&r, "headers claiming the rest");
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A crafted recording from /work/shared/hostile/mklpr7.py (kept beside this file's tests as
/// `tests/fixtures/mklpr7.py`): `variant` with `args`, written to `path`.
fn mklpr7(path: &Path, variant: &str, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mklpr7.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(path)
        .arg(variant)
        .args(args)
        .output()
        .expect("python3 (and the zstd command) to craft recordings");
    assert!(
        out.status.success(),
        "mklpr7.py {variant} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// N8: what the views build from a recording is charged to the budget that bounds decoding. A
/// 192-byte file naming a 1 MB symbol in each of 65535 frames made `dump` and `replay` want
/// 64 GB; a few KB naming one long symbol (or one long user backtrace, or one cause with a
/// thousand wakers) in every cause cost a minute of CPU. Each ends in bounded memory and time
/// with one error line, in every format and in replay's model (built before it asks for a
/// terminal, which it has none of here); files whose views fit are shown.
#[test]
fn what_views_build_from_a_recording_is_bounded() {
    let dir = tempdir("views");
    // (variant, its arguments, shown: whether its views fit).
    let variants: &[(&str, &[&str], bool)] = &[
        // 65535 frames: no recording of latprof's (the kernel takes 127).
        ("deep", &["1000000", "65535"], false),
        // 127 frames of a 1 MB name: 127 MB to show.
        ("deep", &["1000000", "127"], false),
        ("deep", &["300", "127"], true),
        // 20,000 backtraces of 12 frames of one 100 KB name: 24 GB.
        ("wide", &["100000", "20000"], false),
        ("wide", &["100", "200"], true),
        // 10,000 causes sharing one user backtrace of 127 frames of 1 KB names: 1.3 GB.
        ("ushare", &["1000", "127", "10000"], false),
        // A user backtrace of 65535 frames: more than latprof takes.
        ("ushare", &["10", "65535", "10"], false),
        ("ushare", &["30", "40", "50"], true),
        // 1,000 wakers of one cause of 127 frames of a 100 KB name: 12.7 GB.
        ("wshare", &["100000", "127", "1000"], false),
        ("wshare", &["50", "20", "100"], true),
        ("ok", &[], true),
    ];
    let formats: &[&[&str]] = &[
        &["--format", "text"],
        &["--format", "json"],
        &["--format", "folded"],
        &["--format", "openmetrics"],
        &["--format", "pprof"],
        &["--by", "cgroup", "--format", "json"],
        &["--by", "cgroup", "--format", "text"],
        &["--wakers", "--format", "folded"],
    ];
    for (i, (variant, args, shown)) in variants.iter().enumerate() {
        let path = dir.join(format!("{i}-{variant}.lpr"));
        mklpr7(&path, variant, args);
        let file = path.to_str().unwrap();
        let what = format!("{variant} {args:?}");
        for format in formats {
            let mut argv = vec!["dump", file];
            argv.extend_from_slice(format);
            let r = run_as_nobody(&argv, &dir);
            let what = format!("dump {what} {format:?}");
            assert_bounded(&r, &what);
            if *shown {
                assert_eq!(r.code, Some(0), "{what}: {}", r.stderr);
                // Waker chains only where the file has wakers.
                let wakers = matches!(*variant, "wshare" | "ok");
                assert!(
                    !r.stdout.is_empty() || (format.contains(&"--wakers") && !wakers),
                    "{what}: nothing shown"
                );
            } else {
                assert_eq!(r.code, Some(1), "{what}: {}", r.stderr);
                assert_eq!(r.stderr.lines().count(), 1, "{what}: {}", r.stderr);
                assert!(
                    r.stderr.starts_with("latprof: error: "),
                    "{what}: {}",
                    r.stderr
                );
                assert!(!r.stderr.contains("out of memory"), "{what}: {}", r.stderr);
                // Why: more to show than the budget, or deeper than latprof takes.
                assert!(
                    r.stderr.contains("showing it would take about")
                        || r.stderr.contains("contents do not decode ("),
                    "{what}: {}",
                    r.stderr
                );
            }
        }
        let r = run_as_nobody(&["replay", file], &dir);
        let what = format!("replay {what}");
        assert_bounded(&r, &what);
        assert_eq!(r.code, Some(1), "{what}: {}", r.stderr);
        assert!(!r.stderr.contains("out of memory"), "{what}: {}", r.stderr);
        if *shown {
            // The model was built; only then did it ask for the terminal.
            assert!(r.stderr.contains("not a tty"), "{what}: {}", r.stderr);
        } else {
            assert_eq!(r.stderr.lines().count(), 1, "{what}: {}", r.stderr);
            assert!(!r.stderr.contains("not a tty"), "{what}: {}", r.stderr);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `n` global causes of one reason, each a distinct backtrace of 12 frames: 11 naming one
/// `len`-byte symbol, the last its own. Replay's rows compared each backtrace with every one
/// of its row before it (quadratic: 50 million comparisons of 11 long names here).
fn distinct_backtraces(len: usize, n: u64) -> Vec<u8> {
    const SHARED: u64 = 1 << 24;
    let mut e = key_frame_info();
    e.u64(1); // taken
    e.u64(1); // wall
    e.u64(n); // backtraces
    for id in 1..=n {
        e.u64(id);
        e.usize(12);
        for _ in 0..11 {
            e.u64(SHARED + 1);
        }
        e.u64(SHARED * (id + 1));
    }
    e.u64(n + 1); // symbols
    e.u64(SHARED);
    e.str(&"z".repeat(len));
    for id in 1..=n {
        e.u64(SHARED * (id + 1));
        e.str(&format!("f{id}"));
    }
    for _ in 0..7 {
        e.usize(0); // mode, skip kthreads, retries, counters, programs, tasks gone, tasks
    }
    e.usize(0); // global gone
    e.u64(n);
    for id in 1..=n {
        e.u64(id);
        e.u64(1);
        e.u64(1000);
        e.u64(1000);
    }
    for _ in 0..16 {
        // histograms gone, histograms, ticks, cgroups gone, cgroups, paths gone, paths,
        // wakers gone, wakers, user files, user parts, user backtraces, exited gone, exited,
        // chains gone, chains
        e.usize(0);
    }
    recording(&[frame(KIND_KEY, &e.buf, true)])
}

/// Views within the budget cost bounded time too: thousands of distinct backtraces of one
/// reason, in every format and in replay's rows.
#[test]
fn many_backtraces_of_one_reason_cost_bounded_time() {
    let dir = tempdir("distinct");
    let path = dir.join("distinct.lpr");
    std::fs::write(&path, distinct_backtraces(70, 10_000)).unwrap();
    let file = path.to_str().unwrap();
    for format in ["text", "json", "folded", "openmetrics", "pprof"] {
        let r = run_as_nobody(&["dump", file, "--format", format], &dir);
        assert_bounded(&r, format);
        assert_eq!(r.code, Some(0), "{format}: {}", r.stderr);
    }
    let r = run_as_nobody(&["replay", file], &dir);
    assert_bounded(&r, "replay");
    assert!(r.stderr.contains("not a tty"), "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

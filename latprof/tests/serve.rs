//! `latprof serve` as it runs on a fleet: the real binary as root, real eBPF, real workloads,
//! scraped by a real Prometheus (Debian's `prometheus`, started here on a free loopback port
//! with its own storage, never a system one), its profiles read by Go's `go tool pprof`
//! (Debian's `golang-go`), its text checked by Prometheus' own parsers and `promtool`; stopped
//! by signals, stormed by scrapers and by task churn.
//!
//! Root only, like the privileged tests: `#[ignore]`d for a plain `cargo test`, run by
//! `cargo xtask test`. What they need and do not find fails them, loudly.
use std::{
    collections::HashSet,
    io::{BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

mod common;

use common::{
    LATPROF, Workload, fact,
    limits::Ceiling,
    probe::{assert_unloaded, latprof_program_ids},
    serve::{
        NANOSLEEP, Prometheus, Serve, count, free_port, http_get, missing, missing_so_far,
        nanosleeps, sample, temp_dir,
    },
};

/// One test at a time: program ids, loopback ports and the machine's CPUs are shared.
fn serial() -> MutexGuard<'static, ()> {
    common::serial("the serve tests")
}

/// Ids of the BPF programs process `pid` holds a descriptor of (a program's or its link's:
/// `prog_id` in the descriptor's fdinfo).
fn programs_held_by(pid: u32) -> HashSet<u32> {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("the process's fdinfo")
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// 1000 x nanosleep(2 ms) under `latprof serve --pid`, in lazy and in normal mode; a real
/// Prometheus scrapes it and its query API finds exactly the sleeps that slept, less those
/// latprof reports lost, in the counter and in the histogram.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn prometheus_finds_the_exact_count() {
    let _guard = serial();
    for mode in ["lazy", "normal"] {
        prometheus_count(mode);
    }
}

/// The user and system CPU time of process `pid` so far, from /proc/PID/stat (fields 14 and 15,
/// in clock ticks).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .expect("stat's name")
        .1
        .split(' ')
        .collect();
    // Field 3 (the state) is the first after the name.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no memory effects.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("USER_HZ");
    ticks as f64 / hz as f64
}

/// The nanosleeps of `prometheus_count`'s workload.
const SLEEP_COUNT: u32 = 1000;

fn prometheus_count(mode: &str) {
    // 1000 (two seconds and more): Prometheus scrapes the series at least twice while it
    // grows, so the serve guide's rate() queries have an increase to show.
    let mut work = Workload::spawn(&[
        "sleep",
        "--count",
        &SLEEP_COUNT.to_string(),
        "--interval",
        "2ms",
    ]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--mode", mode, "--pid", &pid, "--all-sleeps"]);
    let cpu_before = cpu_seconds(serve.pid());
    let first = serve.metrics();
    let cpu_after = cpu_seconds(serve.pid());
    assert!(
        first.contains(&format!("latprof_mode_info{{mode=\"{mode}\"}} 1")),
        "latprof_mode_info says another mode than {mode}"
    );
    assert!(
        first.contains(&format!(
            "latprof_build_info{{version=\"{}\",revision=\"",
            env!("CARGO_PKG_VERSION")
        )),
        "no latprof_build_info:\n{first}"
    );
    // latprof's own process, as every exporter gives it: its own pid's numbers.
    let own = |name: &str| sample(&first, name).unwrap_or_else(|| panic!("no {name}:\n{first}"));
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", serve.pid()))
        .expect("status")
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .trim()
                .strip_suffix(" kB")?
                .parse::<f64>()
                .ok()
        })
        .expect("VmRSS");
    let rss = own("process_resident_memory_bytes");
    assert!(
        rss > 0.25 * rss_kib * 1024.0 && rss < 4.0 * rss_kib * 1024.0,
        "process_resident_memory_bytes {rss}, VmRSS {rss_kib} kB"
    );
    let fds = own("process_open_fds");
    assert!(fds >= 3.0 && fds <= own("process_max_fds"), "{first}");
    let started = own("process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "started {started}, now {now}"
    );
    // Its CPU time as /proc had it just before and just after the scrape (in whole ticks).
    let cpu = own("process_cpu_seconds_total");
    assert!(
        cpu >= cpu_before - 1e-9 && cpu <= cpu_after + 1e-9,
        "process_cpu_seconds_total {cpu}, /proc said {cpu_before} before the scrape and {cpu_after} after"
    );
    let prometheus = Prometheus::start(&[serve.addr]);
    // The first scrape lands before the workload starts: the counter starts at zero.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.value("up{job=\"latprof\"}") != Some(1) {
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped latprof"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    work.go();
    let done = work.wait_done();
    let (slept, split) = (fact(&done, "slept"), fact(&done, "split"));
    let query = format!("latprof_sleeps_total{{reason=\"{NANOSLEEP}\",state=\"S\"}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (seen, lost) = loop {
        let metrics = serve.metrics();
        let lost = missing(&metrics);
        let seen = prometheus.value(&query);
        if seen == Some(slept - lost) || Instant::now() > deadline {
            break (seen, lost);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        seen,
        Some(slept - lost),
        "Prometheus' {query}: {slept} slept, {lost} reported lost"
    );
    // The histogram's buckets hold the same sleeps, around 2 ms.
    let in_buckets = prometheus
        .value(&format!(
            "sum(latprof_sleep_duration_seconds_bucket{{reason=\"{NANOSLEEP}\",le=\"+Inf\"}})"
        ))
        .expect("histogram");
    assert_eq!(in_buckets, slept - lost, "histogram count");
    // Each sleep lies inside its call (switch-out to wakeup, on the clock the workload's
    // Instant reads): their sum is at most the calls' own.
    let calls_ns = fact(&done, "total_ns");
    let metrics = serve.metrics();
    let slept_s = sample(
        &metrics,
        &format!("latprof_sleep_seconds_total{{reason=\"{NANOSLEEP}\",state=\"S\"}}"),
    )
    .expect("the nanosleeps' seconds");
    assert!(
        slept_s * 1e9 <= calls_ns as f64 + 1e3,
        "latprof's {slept_s} s of nanosleep sleeps exceed the {calls_ns} ns the calls took"
    );
    let under_1ms = prometheus
        .value(&format!(
            "sum(latprof_sleep_duration_seconds_bucket{{reason=\"{NANOSLEEP}\",le=\"0.001024\"}})"
        ))
        .expect("histogram bucket");
    // A 2 ms nanosleep's sleep can be short: woken before its timer it sleeps again for the
    // rest (both parts counted: the workload's `split` counts the sleeps of calls that slept
    // more than once), and delayed between arming its timer and leaving the CPU it sleeps only
    // what is left. The workload cannot see that delay: this machine's vCPU stolen by its host
    // (steal is about 2% of its CPU time, /proc/stat) or an interrupt. Two of this session's
    // three fresh-clone runs met one such sleep (0.9 ms, of a call that slept once): at most
    // 2 in 1000 beyond `split` pass; a wrong duration puts far more, or all, in the wrong
    // bucket.
    let stalled = u64::from(SLEEP_COUNT / 500);
    assert!(
        under_1ms <= split + stalled,
        "2 ms sleeps under 1 ms: {under_1ms}, of calls that slept more than once: {split}, \
         allowed for delays the workload cannot see: {stalled}"
    );
    guide_queries_answer(&prometheus);
    work.release();
    let (status, rest) = serve.stop(libc::SIGTERM);
    assert!(status.success(), "latprof serve exit {status}: {rest}");
}

/// The serve guide's two PromQL examples (docs/guide/serve.md), as printed there, answer on this Prometheus: the seconds
/// slept per reason include the workload's nanosleeps, and their 99th percentile is above the
/// log2 bucket below 2 ms and at most a few buckets above (a shared machine delays some
/// wakeups by milliseconds).
fn guide_queries_answer(prometheus: &Prometheus) {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guide/serve.md"
    ))
    .expect("docs/guide/serve.md");
    let example = |start: &str| {
        readme
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no query starting {start} in docs/guide/serve.md"))
            .to_owned()
    };
    let of_nanosleep = |promql: &str| {
        let samples = prometheus.query(promql);
        samples
            .iter()
            .find(|(labels, _)| labels["reason"] == NANOSLEEP)
            .map_or_else(
                || panic!("{promql}: no {NANOSLEEP} in {samples:?}"),
                |(_, v)| *v,
            )
    };
    let per_reason = example("sum by (host, reason) (rate(");
    let slept = of_nanosleep(&per_reason);
    assert!(slept > 0.0, "{per_reason}: {slept}");
    let p99 = example("histogram_quantile(0.99,");
    let p99_value = of_nanosleep(&p99);
    assert!(
        p99_value > 0.002_048 && p99_value <= 0.016_384,
        "{p99}: {p99_value}"
    );
}

/// The sum of `latprof_sleeps_total` over the series of `state`.
fn state_total(metrics: &str, state: &str) -> u64 {
    let tag = format!("state=\"{state}\"}}");
    metrics
        .lines()
        .filter(|l| l.starts_with("latprof_sleeps_total{") && l.contains(&tag))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The state label tells sleeps apart: an fsync's waits for the disk are D, a nanosleep S,
/// a wait for a CPU after a wakeup R.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn states_split_s_d_and_r() {
    let _guard = serial();
    let dir = common::disk_dir();
    let mut work = Workload::spawn(&["fsync", "--count", "30", "--dir", &dir]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps"]);
    work.go();
    work.wait_done();
    let metrics = serve.wait_for(30, "D, S and R series", |m| {
        state_total(m, "D") >= 30 && state_total(m, "R") > 0
    });
    work.release();
    // Every fsync waits for its write at least once, uninterruptibly; none is counted as S
    // under the nanosleep reason (the workload sleeps only on its stdin pipe, S).
    assert!(state_total(&metrics, "D") >= 30, "{metrics}");
    assert!(
        !metrics.contains(&format!("reason=\"{NANOSLEEP}\",state=\"D\"")),
        "{metrics}"
    );
    drop(serve);
}

/// `go tool pprof -traces` reads the profile of the last seconds and finds the workload's
/// nanosleep backtrace with its count; `stats --format pprof` writes one it reads the same, and
/// so does `dump --format pprof` of a recording.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn go_pprof_reads_the_profiles() {
    let _guard = serial();
    let dir = temp_dir("pprof");
    let mut work = Workload::spawn(&["sleep", "--count", "200", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps"]);
    work.go();
    let slept = work.wait_fact("slept");
    let metrics = serve.wait_for(30, "the workload's sleeps", |m| {
        nanosleeps(m) + missing_so_far(m) >= slept
    });
    let expected = slept - missing(&metrics);
    let r = serve.get("/debug/pprof/offcpu?seconds=60");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(&r.body[..2], [0x1f, 0x8b], "not gzip");
    let file = dir.join("offcpu.pb.gz");
    std::fs::write(&file, &r.body).expect("write profile");
    let (count, frames) = go_pprof_nanosleep(&file, &dir);
    assert_eq!(count, expected, "go tool pprof's count of {frames:?}");
    assert!(frames.iter().any(|f| f == "do_syscall_64"), "{frames:?}");
    // The next pull holds what ended since this one: nothing of it.
    std::thread::sleep(Duration::from_secs(3));
    let r = serve.get("/debug/pprof/offcpu?seconds=1");
    std::fs::write(&file, &r.body).expect("write profile");
    assert_eq!(
        go_pprof_nanosleep(&file, &dir).0,
        0,
        "sleeps since the previous pull"
    );
    drop(serve);
    work.release();

    let mut work = Workload::spawn(&["sleep", "--count", "100", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let out = std::fs::File::create(&file).expect("profile file");
    let mut cmd = Command::new(LATPROF);
    cmd.args([
        "stats",
        "--pid",
        &pid,
        "--all-sleeps",
        "--duration",
        "60s",
        "--format",
        "pprof",
    ])
    .stdout(out);
    let (child, stderr) = common::start(&mut cmd, "attached");
    work.go();
    let slept = work.wait_fact("slept");
    let (_, rest) = common::interrupt(child, stderr);
    let (count, _) = go_pprof_nanosleep(&file, &dir);
    assert_eq!(
        count,
        slept - common::reported_missing(&rest) - common::under_1us(&rest).unwrap_or(0),
        "stats --format pprof"
    );
    work.release();

    // A recording's last snapshot (the workload still alive, held), as a profile.
    let mut work = Workload::spawn(&["sleep", "--count", "100", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let recording = dir.join("run.lpr");
    let (slept, rest) = common::record_while(&mut work, &recording);
    let dump = Command::new(LATPROF)
        .arg("dump")
        .arg(&recording)
        .args(["--pid", &pid, "--format", "pprof"])
        .output()
        .expect("latprof dump");
    assert!(
        dump.status.success(),
        "dump --format pprof: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    assert_eq!(&dump.stdout[..2], [0x1f, 0x8b], "not gzip");
    std::fs::write(&file, &dump.stdout).expect("write profile");
    let (count, frames) = go_pprof_nanosleep(&file, &dir);
    // The recorder watched the whole machine: only the workload's own losses excuse a
    // missing sleep (the stderr's lost by process, and its sleeps recovered without a
    // backtrace in the recording's view of it).
    let own = Command::new(LATPROF)
        .arg("dump")
        .arg(&recording)
        .args(["--pid", &pid, "--format", "json"])
        .output()
        .expect("latprof dump");
    let own: serde_json::Value = serde_json::from_slice(&own.stdout).expect("dump's JSON");
    let missing = common::own_lost(&rest, work.pid())
        + common::own_short(&rest, work.pid())
        + common::recovered_blind(&own);
    if let Err(why) = common::exact_count(count, slept, missing) {
        panic!("dump --format pprof of {frames:?}: {why}");
    }
    assert!(frames.iter().any(|f| f == "do_syscall_64"), "{frames:?}");
    work.release();
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
}

/// `serve --user-stacks`: the profile's nanosleep samples go on from the kernel's frames to
/// the workload's own (named, demangled), the count unchanged.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn profile_carries_user_frames() {
    let _guard = serial();
    let dir = temp_dir("pprof-user");
    let mut work = Workload::spawn(&["sleep", "--count", "200", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps", "--user-stacks"]);
    work.go();
    let slept = work.wait_fact("slept");
    let metrics = serve.wait_for(30, &format!("the workload's {slept} sleeps"), |m| {
        nanosleeps(m) + missing_so_far(m) >= slept
    });
    let expected = slept - missing(&metrics);
    // A read waits 2 s for names (docs/guide/serve.md): a backtrace named later (the workload's debug
    // binary read on a busy CPU) is `[unnamed]` until a later read, then named in every
    // profile, the earlier reads' sleeps too.
    let file = dir.join("offcpu.pb.gz");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tries = 0;
    let (count, frames) = loop {
        // A scraper of its own each time: each pull is a first one, of the last 60 s (a pull
        // continues from the same scraper's previous one).
        tries += 1;
        let r = serve.get(&format!(
            "/debug/pprof/offcpu?seconds=60&scraper=try-{tries}"
        ));
        assert_eq!(r.status, 200, "{}", r.text());
        std::fs::write(&file, &r.body).expect("write profile");
        let (count, frames) = go_pprof_nanosleep(&file, &dir);
        if !frames.iter().any(|f| f == "[unnamed]") || Instant::now() > deadline {
            break (count, frames);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(count, expected, "go tool pprof's count of {frames:?}");
    let kernel = frames.iter().position(|f| f == "do_syscall_64");
    let user = frames
        .iter()
        .position(|f| f.starts_with("latprof_bench::workload::nanosleep"));
    assert!(
        kernel.is_some() && user > kernel,
        "the workload's own frame after the kernel's: {frames:?}"
    );
    profile_shape(&std::fs::read(&file).expect("the profile"), &pid, &dir);
    drop(serve);
    work.release();
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
}

/// The shape fleet backends read (issue 28), in a profile of the workload's nanosleeps with
/// user frames: the kernel's mapping with the kernel's build id, the workload binary's own
/// mapping with its path and build id, bare function names with their source file, entry line
/// and line,
/// the reason as the root frame, the state, the workload's pid and its thread's name as
/// labels (no container: it runs in none); `go tool pprof -functions` lists the workload's
/// function once, `-lines` with its source line.
fn profile_shape(gz: &[u8], pid: &str, home: &Path) {
    let p = latprof::export::pprof::decode(gz).expect("a profile");
    let sample = p
        .sample
        .iter()
        .find(|s| p.frame_names(s).contains(&"hrtimer_nanosleep"))
        .expect("a nanosleep sample");
    let labels: Vec<(&str, &str)> = sample
        .label
        .iter()
        .map(|l| (p.string(l.key), p.string(l.str)))
        .collect();
    // The kernel's name of the workload's thread: its first 15 bytes.
    assert_eq!(
        labels,
        [
            ("state", "S"),
            ("pid", pid),
            ("thread_name", "latprof-workloa")
        ]
    );
    assert_eq!(
        p.frame_names(sample).last(),
        Some(&NANOSLEEP),
        "the reason is the root"
    );
    let at = |id: u64| p.location.iter().find(|l| l.id == id).expect("location");
    let mapping = |id: u64| p.mapping.iter().find(|m| m.id == id).expect("mapping");
    let function = |id: u64| p.function.iter().find(|f| f.id == id).expect("function");
    let kernel_id = std::fs::read("/sys/kernel/notes")
        .ok()
        .and_then(|n| latprof::probe::facts::gnu_build_id(&n))
        .expect("this kernel's build id");
    let workload = common::workload_bin();
    let mut seen_kernel = false;
    let mut own = None;
    for &id in &sample.location_id {
        let loc = at(id);
        let m = mapping(loc.mapping_id);
        let f = function(loc.line[0].function_id);
        let name = p.string(f.name);
        assert!(m.has_functions, "{m:?}");
        assert!(!name.contains(" ("), "a bare function name: {name}");
        if name == "hrtimer_nanosleep" {
            assert_eq!(p.string(m.filename), "[kernel.kallsyms]");
            assert_eq!(p.string(m.build_id), kernel_id);
            seen_kernel = true;
        }
        if name.starts_with("latprof_bench::workload::nanosleep") {
            own = Some((name, p.string(f.filename), loc.line[0].line, m));
            assert!(f.start_line > 0, "{name}: no entry line");
        }
    }
    assert!(seen_kernel);
    let (name, file, line, m) = own.expect("the workload's own frame");
    assert_eq!(
        std::path::Path::new(p.string(m.filename)),
        workload,
        "{m:?}"
    );
    assert!(
        !p.string(m.build_id).is_empty(),
        "the workload binary's build id"
    );
    assert!(m.has_filenames && m.has_line_numbers, "{m:?}");
    let rust = std::path::Path::new(file)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("rs"));
    assert!(rust && line > 0, "{name} at {file}:{line}");
    let go = |view: &str| -> String {
        let path = home.join("shape.pb.gz");
        std::fs::write(&path, gz).expect("write");
        let out = Command::new("go")
            .args([
                "tool",
                "pprof",
                "-top",
                "-nodecount=1000",
                view,
                "-sample_index=sleeps",
            ])
            .arg(&path)
            .env("HOME", home)
            .env("PPROF_TMPDIR", home)
            .output()
            .expect("go tool pprof");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let functions = go("-functions");
    let rows = functions.lines().filter(|l| l.ends_with(name)).count();
    assert_eq!(rows, 1, "{name} once in -functions:\n{functions}");
    let lines = go("-lines");
    let at_line = format!("{name} {file}:{line}");
    assert!(lines.contains(&at_line), "{at_line} in -lines:\n{lines}");
}

/// The nanosleep samples `go tool pprof -traces` shows in `file`: their count (summed) and
/// the frames of the first.
fn go_pprof_nanosleep(file: &Path, home: &Path) -> (u64, Vec<String>) {
    let out = Command::new("go")
        .args(["tool", "pprof", "-traces", "-sample_index=sleeps"])
        .arg(file)
        .env("HOME", home)
        .env("PPROF_TMPDIR", home)
        .output()
        .expect("go (cargo xtask test installs Debian's golang-go)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut total = 0;
    let mut first = Vec::new();
    for block in text.split("-----------+") {
        let mut count = None;
        let mut frames = Vec::new();
        for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
            // A sample's labels (`state:[S]`) and separators are no frames.
            let label = line
                .split_once(":[")
                .is_some_and(|(key, _)| key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            if label || line.starts_with('-') {
                continue;
            }
            let mut words = line.split_whitespace();
            let head = words.next().unwrap_or("");
            if count.is_none()
                && let Ok(n) = head.parse::<u64>()
            {
                count = Some(n);
                frames.extend(words.map(str::to_owned));
            } else if count.is_some() {
                frames.push(line.to_owned());
            }
        }
        if let Some(n) = count
            && frames.iter().any(|f| f == "hrtimer_nanosleep")
        {
            total += n;
            if first.is_empty() {
                first = frames;
            }
        }
    }
    (total, first)
}

/// Both formats by `Accept`, each passing Prometheus' own parsers and `promtool check
/// metrics`; no kernel address in any label; the other endpoints, unknown paths and bad
/// query values.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn formats_parse_and_bad_requests_are_refused() {
    let _guard = serial();
    let serve = Serve::start(&[]);
    // Something to show: a workload's own sleeps and its waits for a CPU after each (an idle
    // machine's own sleeps may all be kernel threads', which are not counted).
    let mut work = Workload::spawn(&["sleep", "--count", "100", "--interval", "2ms"]);
    work.go();
    work.wait_done();
    serve.wait_for(30, "the workload's sleeps and CPU waits", |m| {
        nanosleeps(m) > 0
            && sample(
                m,
                "latprof_sleeps_total{reason=\"Waiting for CPU\",state=\"R\"}",
            )
            .is_some()
    });
    work.release();
    // Without --pid kernel threads' sleeps and waits are left out of the counters, and of the
    // histograms alike (they once were in the histograms only, and kernel threads wait for a
    // CPU all the time): the run-queue series' histogram counts what its counter counts, but
    // for the events between the read of the one and of the other.
    let r = "reason=\"Waiting for CPU\",state=\"R\"";
    serve.wait_for(
        30,
        "the run-queue histogram's count near its counter",
        |m| {
            let counted = count(m, &format!("latprof_sleeps_total{{{r}}}"));
            let in_buckets = count(m, &format!("latprof_sleep_duration_seconds_count{{{r}}}"));
            counted > 0 && in_buckets.abs_diff(counted) * 100 <= counted
        },
    );
    let om = http_get(
        serve.addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(om.status, 200);
    assert!(
        om.content_type.starts_with("application/openmetrics-text"),
        "{}",
        om.content_type
    );
    let om = om.text();
    assert!(om.ends_with("# EOF\n"));
    let prom = serve.get("/metrics");
    assert!(
        prom.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        prom.content_type
    );
    let prom = prom.text();
    assert!(!prom.contains("# EOF"));
    let (families, _) =
        common::python_parses("prometheus_client.openmetrics.parser", om.as_bytes());
    assert_eq!(
        families,
        common::python_parses("prometheus_client.parser", prom.as_bytes()).0
    );
    // Series, seconds, histogram, folded, cgroup sleeps, cgroup seconds, folded cgroups,
    // pipeline, hidden sleeps waiting, dropped, runs, run time, CPU events, table entries and
    // capacity, collections, mode; the six process_* families and build info.
    assert_eq!(families, 24, "{om}");
    for needed in [
        "latprof_sleeps_total{reason=\"Waiting for CPU\",state=\"R\"}",
        "latprof_folded_cgroups",
        "latprof_dropped_total{kind=\"sleep_lost\"}",
        "latprof_pipeline_events_total{counter=\"spikes_dropped\"}",
        "latprof_cpu_events_total{cpu=\"0\",event=\"switch\"}",
        "latprof_table_entries{table=\"tasks\"}",
        "process_cpu_seconds_total",
        "process_max_fds",
    ] {
        assert!(sample(&prom, needed).is_some(), "no {needed} in\n{prom}");
    }
    assert!(
        prom.contains("latprof_program_run_seconds_total{program=\"sched_switch"),
        "{prom}"
    );
    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().expect("stdin").write_all(prom.as_bytes())?;
            c.wait_with_output()
        })
        .expect("promtool (cargo xtask test installs Debian's prometheus package)");
    assert!(
        promtool.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&promtool.stdout),
        String::from_utf8_lossy(&promtool.stderr)
    );
    // No kernel address in a label (an unnamed frame is "[unknown]").
    for line in prom.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains("0xffff"), "{line}");
    }

    let index = serve.get("/");
    assert_eq!(index.status, 200);
    for endpoint in ["/metrics", "/debug/pprof/offcpu", "/healthz"] {
        assert!(index.text().contains(endpoint), "{}", index.text());
    }
    let health = serve.get("/healthz");
    assert_eq!((health.status, health.text().as_str()), (200, "ok\n"));
    for (path, status) in [
        ("/nope", 404),
        ("/metrics/extra", 404),
        ("/debug/pprof/heap", 404),
        ("/debug/pprof/offcpu?seconds=0", 400),
        ("/debug/pprof/offcpu?seconds=301", 400),
        ("/debug/pprof/offcpu?seconds=abc", 400),
        ("/debug/pprof/offcpu?seconds=99999999999999999999", 400),
        ("/debug/pprof/offcpu?seconds=%ff%00", 400),
        ("/debug/pprof/offcpu?seconds=5", 200),
    ] {
        let r = serve.get(path);
        assert_eq!(r.status, status, "{path}: {}", r.text());
        if status != 200 {
            assert_eq!(r.text().lines().count(), 1, "{path}: {}", r.text());
        }
    }
    // Still serving after all of that.
    assert_eq!(serve.get("/healthz").status, 200);
    let (status, rest) = serve.stop(libc::SIGINT);
    assert!(status.success(), "exit {status}: {rest}");
}

/// SIGTERM and SIGINT: a clean exit, status 0; SIGKILL: no clean-up runs at all. Either way
/// no program of latprof's stays loaded.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn signals_leave_nothing_loaded() {
    let _guard = serial();
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGKILL] {
        let serve = Serve::start(&[]);
        assert!(serve.metrics().contains("latprof_sleeps_total"));
        // This latprof's own: another latprof on the machine loads programs of the same names.
        let during: HashSet<u32> = latprof_program_ids()
            .intersection(&programs_held_by(serve.pid()))
            .copied()
            .collect();
        assert!(
            !during.is_empty(),
            "no program of latprof's loaded while it serves"
        );
        let (status, rest) = serve.stop(signal);
        if signal == libc::SIGKILL {
            assert!(!status.success());
        } else {
            assert!(status.success(), "exit {status}: {rest}");
            assert!(rest.contains("stopped"), "{rest}");
        }
        assert_unloaded(&during, &format!("after signal {signal}"));
    }
}

/// With only the capabilities the shipped systemd unit leaves it (its CapabilityBoundingSet)
/// and under its ceilings (`MemoryMax=`, `TasksMax=`, set as a cgroup of the memory and pids
/// controllers), `latprof serve` loads, names backtraces (kallsyms needs CAP_SYSLOG), counts a
/// workload exactly, answers 100 profile pulls at once without a task refused or the memory
/// ceiling touched, and stops cleanly.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn runs_with_only_the_units_capabilities() {
    let _guard = serial();
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/latprof.service"),
    )
    .expect("contrib/latprof.service");
    let setting = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{key} in the unit"))
    };
    let caps: Vec<String> = setting("CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    assert_eq!(caps, ["+bpf", "+perfmon", "+syslog"]);
    let (memory_max, tasks_max) = (
        common::limits::bytes(setting("MemoryMax"), ["K", "M", "G", "T"]),
        setting("TasksMax").parse().expect("TasksMax: a number"),
    );
    let ceiling = Ceiling::new("latprof-test-unit", memory_max, tasks_max);
    let mut work = Workload::spawn(&["sleep", "--count", "100", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &ceiling.enter_script(), "sh", "setpriv"])
        .arg(format!("--bounding-set=-all,{}", caps.join(",")))
        .args(["--inh-caps=-all", "--", LATPROF, "serve", "--listen", &addr])
        .args(["--pid", &pid, "--all-sleeps"])
        .stdout(Stdio::null());
    let (child, stderr) = common::start(&mut cmd, "serving");
    let serve = Serve::adopt(child, stderr, addr.parse().expect("addr"));
    let status = std::fs::read_to_string(format!("/proc/{}/status", serve.pid())).expect("status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff")
        .trim()
        .to_owned();
    // CAP_PERFMON 38, CAP_BPF 39, CAP_SYSLOG 34.
    assert_eq!(eff, "000000c400000000", "effective capabilities");
    work.go();
    let slept = work.wait_fact("slept");
    let metrics = serve.wait_for(30, "the workload's sleeps", |m| {
        nanosleeps(m) + missing_so_far(m) >= slept
    });
    assert_eq!(nanosleeps(&metrics), slept - missing(&metrics));
    work.release();
    // Each pull builds its profile on one of serve's blocking threads.
    let pulls: Vec<_> = (0..100)
        .map(|i| {
            let addr = serve.addr;
            std::thread::spawn(move || {
                http_get(
                    addr,
                    &format!("/debug/pprof/offcpu?seconds=60&scraper=p{i}"),
                    None,
                )
                .status
            })
        })
        .collect();
    for pull in pulls {
        assert_eq!(pull.join().expect("a pull"), 200);
    }
    let (refused, hits, peak) = (
        ceiling.tasks_refused(),
        ceiling.memory_hits(),
        ceiling.peak_memory(),
    );
    let threads = std::fs::read_dir(format!("/proc/{}/task", serve.pid()))
        .expect("its threads")
        .count();
    eprintln!(
        "under MemoryMax {memory_max} and TasksMax {tasks_max}: {peak} bytes at most, {threads} \
         threads after 100 pulls"
    );
    // The reader, the HTTP server's two workers and its 8 blocking threads, and a few more
    // (11 here): with tokio's default of 512 blocking threads the pulls started dozens.
    assert!(threads <= 20, "{threads} threads after 100 pulls at once");
    assert_eq!(refused, 0, "tasks refused by TasksMax={tasks_max}");
    assert_eq!(
        hits, 0,
        "MemoryMax={memory_max} reached ({peak} bytes at most)"
    );
    let (status, rest) = serve.stop(libc::SIGTERM);
    assert!(status.success(), "exit {status}: {rest}");
}

/// A memory ceiling on latprof's cgroup under what its kernel tables take (they are charged
/// there) is one line that names the flag to lower, and nothing is loaded: before, the check
/// read the machine's free memory only, and the kernel refused a map (or the OOM killer came)
/// under a unit's `MemoryMax=` or a pod's limit.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_memory_ceiling_under_the_tables_is_one_line() {
    let _guard = serial();
    // The default tables take about 38 MiB on 2 CPUs: over half of 48 MiB.
    let ceiling = Ceiling::new("latprof-test-small", 48 << 20, 64);
    let before = latprof_program_ids();
    let out = Command::new("sh")
        .args(["-c", &ceiling.enter_script(), "sh", LATPROF])
        .args(["stats", "--duration", "1s"])
        .output()
        .expect("latprof");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("over half of the"), "{err}");
    let new: Vec<u32> = latprof_program_ids().difference(&before).copied().collect();
    assert!(new.is_empty(), "programs loaded: {new:?}");
}

/// The shipped unit passes `systemd-analyze verify` (every key known, the command there) with
/// its ExecStart pointed at this build's latprof.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn the_unit_verifies() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/latprof.service"),
    )
    .expect("contrib/latprof.service");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/latprof serve"),
        "{unit}"
    );
    let dir = temp_dir("unit");
    let path = dir.join("latprof.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/latprof", LATPROF)).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // What it says of latprof's unit; other units it loads (the host's) are not ours to judge.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("latprof.service") || l.contains(LATPROF))
        .collect();
    assert!(ours.is_empty(), "systemd-analyze verify: {said}");
    assert!(
        out.status.success() || !said.contains("latprof"),
        "systemd-analyze verify: {said}"
    );
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
}

/// 100 clients scraping as fast as they can, one that asks and never reads its answers, one
/// that connects and sends nothing: the reads of the kernel's tables go on, and a workload's
/// sleeps are all counted.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn scrapers_do_not_stall_collection() {
    let _guard = serial();
    let mut work = Workload::spawn(&["sleep", "--count", "200", "--interval", "2ms"]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps"]);
    let addr = serve.addr;
    // Never reads: its pipelined requests' answers fill the socket buffers and stay there.
    let mut stuck = TcpStream::connect(addr).expect("connect");
    stuck
        .set_write_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    for _ in 0..2000 {
        let req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /debug/pprof/offcpu?seconds=300 HTTP/1.1\r\nHost: x\r\n\r\n";
        if stuck.write_all(req.as_bytes()).is_err() {
            break;
        }
    }
    let silent = TcpStream::connect(addr).expect("connect");
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    let scrapers: Vec<_> = (0..100)
        .map(|_| {
            let (stop, scrapes) = (Arc::clone(&stop), Arc::clone(&scrapes));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = http_get(addr, "/metrics", None);
                    assert_eq!(r.status, 200);
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let collections = |m: &str| count(m, "latprof_collections_total");
    let first = collections(&serve.metrics());
    work.go();
    let slept = work.wait_fact("slept");
    let metrics = serve.wait_for(60, "the workload's sleeps under 100 scrapers", |m| {
        nanosleeps(m) + missing_so_far(m) >= slept && collections(m) >= first + 3
    });
    stop.store(true, Ordering::Relaxed);
    for s in scrapers {
        s.join().expect("a scraper failed");
    }
    assert_eq!(nanosleeps(&metrics), slept - missing(&metrics));
    assert!(
        scrapes.load(Ordering::Relaxed) >= 100,
        "the scrapers got few answers"
    );
    drop((stuck, silent));
    work.release();
    let (status, rest) = serve.stop(libc::SIGTERM);
    assert!(status.success(), "exit {status}: {rest}");
}

/// What latprof refuses says so in one line, exits non-zero, and loads nothing.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn bad_starts_say_one_line_and_load_nothing() {
    let _guard = serial();
    let before = latprof_program_ids();
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("run latprof");
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for bad in ["localhost", "127.0.0.1", "127.0.0.1:99999", ""] {
        let (status, err) = run(Command::new(LATPROF).args(["serve", "--listen", bad]));
        assert_eq!(status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("latprof: error: "), "{err}");
        assert!(
            err.contains(&format!("'{bad}' is not an address and port")),
            "{err}"
        );
    }
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").to_string();
    let (status, err) = run(Command::new(LATPROF).args(["serve", "--listen", &port]));
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("cannot listen on {port}")), "{err}");
    let (status, err) = run(Command::new("runuser")
        .args(["-u", "nobody", "--", LATPROF, "serve"])
        .current_dir("/"));
    assert_eq!(status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root"), "{err}");
    // Nothing was ever attached (a load would have shown in the ids, even unloaded since:
    // ids are never reused).
    let new: Vec<u32> = latprof_program_ids().difference(&before).copied().collect();
    assert!(new.is_empty(), "programs loaded: {new:?}");
}

/// What a process holds that can grow with what it is fed, in KiB: its anonymous and shared
/// memory (`RssAnon` + `RssShmem`). The file-backed rest is its own code and libraries, paged
/// in as code paths first run (the debug binary alone is 17 MiB of it), which is no growth.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    ["RssAnon:", "RssShmem:"]
        .iter()
        .map(|key| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{key} in {status}"))
        })
        .sum()
}

/// Ninety seconds of fork/exit and thread churn (thousands of exits) while Prometheus-like
/// scrapes and profile pulls go on: no kernel table grows with the exits (each stays far under
/// its capacity and under a ceiling that thousands of exits would pass), and latprof's memory
/// stops growing once warm (the first 30 s).
///
/// It ran three minutes before; 90 s here churned 323,000 exits, RSS 50,216 KiB at 30 s and at
/// most 50,868 KiB after, tables within 43 entries: a third minute added nothing. With the
/// profiles' thread labels (each exit's records logged, each read's sleeps kept by thread for
/// the 300 s window) it grew by 6 MB a minute until serve kept at most 4,096 threads; since:
/// 131,000 exits, 55,112 KiB at 30 s, at most 55,140 KiB after. Anonymous memory is measured
/// (the binary's own pages are no growth): 39,500 KiB at 30 s and 39,592 KiB at most after
/// (447,000 exits). Two CI runs saw one step of 4 MiB in the third 30 s and none after (VmRSS
/// 60,444 to 64,400 KiB, then anonymous memory 39,624 to 43,672 KiB): glibc's malloc raises
/// its mmap threshold after a large buffer is freed (a profile's, built on a blocking thread
/// that may be new, with an arena of its own), so the next such buffer comes from a heap that
/// keeps it. The measured serve runs with the threshold fixed (`GLIBC_TUNABLES`): buffers
/// over 128 KiB are mapped and given back, and what stays is what serve holds: 23,300 KiB at
/// 30 s, 24,484 at most in the second 30 s, 24,832 in the third (the profiles' 300 s window
/// still filling), 24,588 at the end; 22,764, 24,192, 25,080 and 24,792 in a second run. A
/// third CI run sampled a pull's buffers in flight (21,664 then 24,300 KiB at most, 23,564 at
/// the end): growth is judged by each 30 s's lowest sample since, and by the end, after the
/// pulls: 21,240 KiB at 30 s, 23,708 at least in the third 30 s, 23,884 at the end (and
/// 21,228, 23,520, 23,576), the 300 s window still filling.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn churn_keeps_memory_bounded() {
    const TABLES: [&str; 5] = ["tasks", "records", "stacks", "histograms", "cgroups"];
    const THIRD: Duration = Duration::from_secs(30);
    let _guard = serial();
    let serve = {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(LATPROF);
        cmd.args(["serve", "--listen", &addr])
            .env(
                "GLIBC_TUNABLES",
                "glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072",
            )
            .stdout(Stdio::null());
        let (child, stderr) = common::start(&mut cmd, "serving");
        Serve::adopt(child, stderr, addr.parse().expect("addr"))
    };
    let addr = serve.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(http_get(addr, "/metrics", None).status, 200);
                if i.is_multiple_of(5) {
                    let r = http_get(addr, "/debug/pprof/offcpu?seconds=300", None);
                    assert_eq!(r.status, 200);
                }
                i += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let churn = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let bin = common::workload_bin();
            let mut exits = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for args in [
                    &["forks", "--count", "500", "--sleep", "50us"][..],
                    &["exit-storm", "--count", "500", "--batch", "8"][..],
                ] {
                    let out = Command::new(&bin).args(args).output().expect("workload");
                    assert!(out.status.success(), "{args:?}: {out:?}");
                    exits += 500;
                }
            }
            exits
        })
    };
    let pid = serve.pid();
    let entries = |m: &str, table: &str| -> u64 {
        let series = format!("latprof_table_entries{{table=\"{table}\"}}");
        assert!(sample(m, &series).is_some(), "no {series}");
        count(m, &series)
    };
    let first = serve.metrics();
    let capacity: Vec<u64> = TABLES
        .iter()
        .map(|t| count(&first, &format!("latprof_table_capacity{{table=\"{t}\"}}")))
        .collect();
    let mut most = [0u64; TABLES.len()];
    let mut at_warm = None;
    // Memory once warm (30 s), its highest in the second 30 s, and its lowest in the second
    // and the third: a sample may come while a pull's profile is being built (2 to 3 MiB of
    // buffers, given back after), so growth is judged by the lows, what serve keeps.
    let (mut rss_second, mut low_second, mut low_third) = (0, u64::MAX, u64::MAX);
    let start = Instant::now();
    while start.elapsed() < 3 * THIRD {
        std::thread::sleep(Duration::from_secs(3));
        let (rss, m) = (rss_kib(pid), serve.metrics());
        for (most, t) in most.iter_mut().zip(TABLES) {
            *most = (*most).max(entries(&m, t));
        }
        if start.elapsed() < THIRD {
            continue;
        }
        if at_warm.is_none() {
            at_warm = Some((rss, TABLES.map(|t| entries(&m, t))));
        }
        if start.elapsed() < 2 * THIRD {
            rss_second = rss_second.max(rss);
            low_second = low_second.min(rss);
        } else {
            low_third = low_third.min(rss);
        }
    }
    stop.store(true, Ordering::Relaxed);
    scraper.join().expect("scraper");
    let exits = churn.join().expect("churn");
    let (rss_end, end) = (rss_kib(pid), serve.metrics());
    let end: Vec<u64> = TABLES.iter().map(|t| entries(&end, t)).collect();
    let (rss_warm, warm) = at_warm.expect("a warm measurement");
    eprintln!(
        "churn: {exits} exits; latprof anonymous memory {rss_warm} KiB at 30 s, at most {rss_second} KiB in the second 30 s, at least {low_second} KiB in the second and {low_third} KiB in the third, {rss_end} KiB at the end (no pull running); tables {TABLES:?}: at 30 s {warm:?}, at most {most:?}, at the end {end:?}, capacity {capacity:?}"
    );
    // A tenth of what ran here (323,000), so a busy machine still churns enough.
    assert!(exits >= 30_000, "too little churn: {exits} exits");
    // Ceilings (measured: see the line above in the test's output).
    for (i, t) in TABLES.iter().enumerate() {
        // Thousands of exits would pass 2000; a table near its capacity drops.
        assert!(
            most[i] < 2000 && most[i] * 4 < capacity[i],
            "{t}: {} entries at most of {}",
            most[i],
            capacity[i]
        );
        // Entries that came after warming up: new backtraces, not exited tasks.
        assert!(
            end[i] <= warm[i] + warm[i] / 2 + 100,
            "{t}: {} entries at 30 s, {} at the end",
            warm[i],
            end[i]
        );
    }
    assert!(
        rss_second < 52 * 1024,
        "latprof serve anonymous memory {rss_second} KiB"
    );
    // Flat once warm, but for the profiles' 300 s window filling (2.3 to 2.6 MiB from 30 s to
    // the end here): the third 30 s's low at most 4 MiB over the second's, the end (the pulls
    // over) within 6 MiB of 30 s. Some 480,000 exits pass meanwhile: 16 bytes kept for each
    // would be 7 MiB.
    assert!(
        low_third <= low_second + 4 * 1024 && rss_end < rss_warm + 6 * 1024,
        "anonymous memory grew: {rss_warm} KiB at 30 s, at least {low_second} then {low_third} KiB, {rss_end} KiB at the end"
    );
    let (status, rest) = serve.stop(libc::SIGTERM);
    assert!(status.success(), "exit {status}: {rest}");
}

/// `hprobe.py PORT ARGS...` (the hostile HTTP prober) run as `nobody`, its output piped.
fn hprobe_as_nobody(addr: SocketAddr, args: &[&str]) -> Child {
    Command::new("runuser")
        .args(["-u", "nobody", "--", "/usr/bin/python3"])
        .arg(common::hostile("hprobe.py"))
        .arg(addr.port().to_string())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runuser -u nobody -- python3 hprobe.py")
}

/// The sockets process `pid` holds open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read the process's descriptors")
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// GET `path` on a new connection: the status (0 where none came) and how long the answer
/// took, waiting 10 s at most.
fn timed_get(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let status = String::from_utf8_lossy(&raw)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, t0.elapsed())
}

/// Issue 29, N9: 300 connections from `nobody` that send nothing (`hprobe.py PORT conns`),
/// against `latprof serve` under the report's limit of 256 descriptors. While they are held a
/// scrape answers within a second (a hang bound: before, none answered for as long as they
/// were held), and the server has closed every one of them by the end of its idle timeout.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn idle_connections_do_not_lock_out_a_scrape() {
    use std::io::BufRead as _;
    let _guard = serial();
    let own = std::process::id().to_string();
    let serve = Serve::start_with_fd_limit(&["--pid", &own], Some(256));
    // Held past the idle timeout and one tick of the connections' watchdog, with a margin
    // for a busy machine: hprobe then counts those still open.
    let idle = latprof::serve::conn::Limits::default().idle_timeout;
    let hold = idle + Duration::from_secs(3);
    let mut probe = hprobe_as_nobody(serve.addr, &["conns", "300", &hold.as_secs().to_string()]);
    let mut out = BufReader::new(probe.stdout.take().expect("stdout"));
    let mut said = Vec::new();
    let mut line = String::new();
    // hprobe says "open: N" once its connections are all made (or the first failed).
    while !line.starts_with("open:") {
        line.clear();
        let n = out.read_line(&mut line).expect("read hprobe");
        assert!(
            n > 0,
            "hprobe ended before it held its connections: {said:?}"
        );
        said.push(line.trim_end().to_owned());
    }
    assert_eq!(line.trim_end(), "open: 300", "{said:?}");
    let (status, took) = timed_get(serve.addr, "/metrics");
    assert!(
        status == 200 && took < Duration::from_secs(1),
        "a scrape while 300 connections were held: status {status} after {took:?}"
    );
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read hprobe");
    let done = probe.wait_with_output().expect("wait for hprobe");
    assert!(
        done.status.success(),
        "hprobe: {}: {rest}{}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    let last = rest.lines().last().unwrap_or("");
    assert_eq!(
        last.rsplit_once(": ").map(|(_, n)| n),
        Some("0"),
        "connections the server left open past its idle timeout ({idle:?}): {rest}"
    );
    // hprobe's own scrapes while it held them were answered too.
    assert!(
        rest.lines()
            .filter(|l| l.contains("probe"))
            .all(|l| l.contains("HTTP/1.1 200")),
        "{rest}"
    );
    let (status, rest) = serve.stop(libc::SIGTERM);
    assert!(status.success(), "latprof serve exit {status}: {rest}");
}

/// Issue 29, N9: 150 slowloris connections from `nobody` (`hprobe.py PORT slowloris`: a
/// request's first lines, then one header line every 2 s) under the report's limit of 256
/// descriptors. While they are held a scrape answers within a second (a hang bound), and the
/// server has cut every one of them by the end of its header timeout (before: none, ever).
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn slow_headers_are_cut_and_do_not_lock_out_a_scrape() {
    let _guard = serial();
    let own = std::process::id().to_string();
    let serve = Serve::start_with_fd_limit(&["--pid", &own], Some(256));
    let header = latprof::serve::conn::Limits::default().header_timeout;
    // Past the header timeout and one tick, with a margin for a busy machine.
    let hold = header + Duration::from_secs(3);
    let probe = hprobe_as_nobody(
        serve.addr,
        &["slowloris", "150", &hold.as_secs().to_string()],
    );
    // hprobe says nothing until the end: held is when latprof has taken 40 of them (the
    // listener is one socket more), which it does as they come.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sockets(serve.pid()) < 41 {
        assert!(
            Instant::now() < deadline,
            "latprof took {} connections in 10 s",
            sockets(serve.pid()) - 1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, took) = timed_get(serve.addr, "/metrics");
    assert!(
        status == 200 && took < Duration::from_secs(1),
        "a scrape while slowloris connections were held: status {status} after {took:?}"
    );
    let done = probe.wait_with_output().expect("wait for hprobe");
    let out = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "hprobe: {}: {out}{}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        out.trim_end().ends_with("closed by server: 150"),
        "slowloris connections the server left open past its header timeout ({header:?}): {out}"
    );
    let (status, rest) = serve.stop(libc::SIGTERM);
    assert!(status.success(), "latprof serve exit {status}: {rest}");
}

/// `Type=notify`: READY=1 only once /metrics answers with data, WATCHDOG=1 from the read loop
/// while the unit's watchdog is set, STOPPING=1 on SIGTERM before latprof exits.
#[test]
#[ignore = "needs root"]
fn tells_systemd_when_ready_alive_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let _serial = serial();
    let dir = temp_dir("notify");
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = Command::new(LATPROF)
        .args([
            "serve",
            "--listen",
            &addr.to_string(),
            "--interval",
            "200ms",
        ])
        .env("NOTIFY_SOCKET", &socket_path)
        // A ping every half second.
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn latprof serve");
    let recv = || {
        let mut buf = [0u8; 512];
        let n = socket
            .recv(&mut buf)
            .expect("a message from latprof within 60 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first = recv();
    assert!(first.starts_with("READY=1\n"), "{first}");
    assert!(
        first.contains(&format!("MAINPID={}", child.id())),
        "{first}"
    );
    // Ready means serving real data: the first read is published.
    let reply = http_get(addr, "/metrics", None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply.text().contains("latprof_table_capacity"),
        "{}",
        reply.text()
    );
    for _ in 0..3 {
        assert_eq!(recv(), "WATCHDOG=1");
    }
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGTERM) },
        0
    );
    let mut last = recv();
    while last == "WATCHDOG=1" {
        last = recv();
    }
    assert!(last.starts_with("STOPPING=1"), "{last}");
    let status = child.wait().expect("wait for latprof serve");
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

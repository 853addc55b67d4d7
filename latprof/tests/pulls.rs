//! Fleet scrapers pulling `latprof serve`'s off-CPU profile the way they really pull it, each
//! continuing from its previous pull (docs/guide/serve.md: "Every sleep once, across pulls"): Parca asks for
//! `seconds` = its scrape interval every interval (default 10 s), Alloy's `pyroscope.scrape`
//! for `seconds` = interval - 1 every interval (default 15 s), and the intervals of
//! contrib/parca.yml and contrib/latprof.alloy the same way. They pull for about 2 minutes
//! while a workload of known count sleeps: what each pulled adds up to every sleep once.
//!
//! Root only, like the privileged tests: `#[ignore]`d for a plain `cargo test`, run by
//! `cargo xtask test`.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

mod common;

use common::{
    Workload,
    serve::{Serve, missing, missing_so_far, nanosleeps, request},
};

/// How a scraper pulls: its User-Agent (its name to latprof, with its address), every how
/// long, asking for how many seconds.
#[derive(Clone, Debug)]
struct Scraper {
    agent: String,
    every: Duration,
    seconds: u64,
}

/// A scrape interval in a contrib config: the value after `key` on its line, "10s" or "15s".
fn contrib_interval(file: &str, key: &str) -> Duration {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/").to_owned() + file;
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {path}"));
    let secs: u64 = value
        .trim_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or_else(|_| panic!("{key}{value} in {path}"));
    Duration::from_secs(secs)
}

/// The nanosleeps a pulled profile holds.
fn pulled(body: &[u8]) -> u64 {
    let profile = latprof::export::pprof::decode(body).expect("a gzipped pprof profile");
    profile
        .sample
        .iter()
        .filter(|s| profile.frame_names(s).contains(&"hrtimer_nanosleep"))
        .map(|s| u64::try_from(s.value[0]).expect("a count"))
        .sum()
}

/// Pulls every `scraper.every` from now until `stop`, then once more at its next pull; the
/// nanosleeps of every pull summed, and the number of pulls.
fn run(serve: std::net::SocketAddr, scraper: &Scraper, stop: &AtomicBool) -> (u64, u32) {
    let path = format!("/debug/pprof/offcpu?seconds={}", scraper.seconds);
    let (mut sum, mut pulls) = (0, 0);
    let mut next = Instant::now();
    loop {
        let last = stop.load(Ordering::SeqCst);
        let r = request(serve, &path, &[("User-Agent", &scraper.agent)]);
        assert_eq!(r.status, 200, "{scraper:?}: {}", r.text());
        assert!(
            r.content_type.starts_with("application/octet-stream"),
            "Alloy refuses any other: {}",
            r.content_type
        );
        sum += pulled(&r.body);
        pulls += 1;
        if last {
            return (sum, pulls);
        }
        next += scraper.every;
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn fleet_scrapers_pull_every_sleep_once() {
    let _guard = common::serial("the pull tests");
    let parca = |agent: &str, every: Duration| Scraper {
        agent: agent.to_owned(),
        every,
        seconds: every.as_secs(),
    };
    let alloy = |agent: &str, every: Duration| Scraper {
        agent: agent.to_owned(),
        every,
        seconds: every.as_secs() - 1,
    };
    let scrapers = [
        parca("conprof/", Duration::from_secs(10)),
        alloy("Alloy/v1.5.1 (linux; binary)", Duration::from_secs(15)),
        parca(
            "conprof/contrib",
            contrib_interval("parca.yml", "scrape_interval:"),
        ),
        alloy(
            "Alloy/contrib (linux; binary)",
            contrib_interval("latprof.alloy", "scrape_interval ="),
        ),
    ];
    // About 100 s of sleeps: every scraper pulls many times meanwhile.
    let mut work = Workload::spawn(&["sleep", "--count", "2000", "--interval", "50ms"]);
    let pid = work.pid().to_string();
    let serve = Serve::start(&["--pid", &pid, "--all-sleeps"]);
    let stop = Arc::new(AtomicBool::new(false));
    let running: Vec<_> = scrapers
        .iter()
        .cloned()
        .map(|scraper| {
            let stop = Arc::clone(&stop);
            let addr = serve.addr;
            thread::spawn(move || run(addr, &scraper, &stop))
        })
        .collect();
    work.go();
    let slept = work.wait_fact("slept");
    // Every sleep read by latprof before the scrapers' last pulls.
    let metrics = serve.wait_for(30, "the workload's sleeps", |m| {
        nanosleeps(m) + missing_so_far(m) >= slept
    });
    stop.store(true, Ordering::SeqCst);
    let expected = slept - missing(&metrics);
    for (scraper, thread) in scrapers.iter().zip(running) {
        let (sum, pulls) = thread.join().expect("a scraper");
        assert_eq!(
            sum, expected,
            "{scraper:?}: {pulls} pulls held {sum} of the workload's {expected} nanosleeps"
        );
        assert!(pulls >= 6, "{scraper:?}: {pulls} pulls");
    }
    drop(serve);
    work.release();
}

/// R8: a local user who pulled with the real scraper's `scraper=` moved the real one's place
/// (its next profile covered only the time since the user's pull), and 70 made-up names
/// evicted it (its next profile covered only its `seconds`). The user here is `nobody`,
/// pulling from its own socket on the loopback address.
#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn a_local_user_cannot_take_a_scrapers_window() {
    let _guard = common::serial("the pull tests");
    let serve = Serve::start(&[]);
    let path = "/debug/pprof/offcpu?seconds=2&scraper=parca";
    let covered = |body: &[u8]| {
        let profile = latprof::export::pprof::decode(body).expect("a gzipped pprof profile");
        Duration::from_nanos(u64::try_from(profile.duration_nanos).expect("a span"))
    };
    let first = Instant::now();
    let r = serve.get(path);
    assert_eq!(r.status, 200, "{}", r.text());
    thread::sleep(Duration::from_secs(4));
    let script = format!(
        "import urllib.request as u\n\
         for name in ['parca'] + ['made-up-%d' % i for i in range(70)]:\n    \
         u.urlopen('http://{}/debug/pprof/offcpu?seconds=1&scraper=' + name).read()\n",
        serve.addr
    );
    let status = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            // Debian's own: a python3 on root's PATH may be under /root, out of nobody's reach.
            "/usr/bin/python3",
            "-c",
            &script,
        ])
        .status()
        .expect("setpriv python3");
    assert!(status.success(), "nobody's pulls");
    thread::sleep(Duration::from_secs(4));
    let since = first.elapsed();
    let r = serve.get(path);
    assert_eq!(r.status, 200, "{}", r.text());
    // From the read the first pull held last (up to a read, 1 s, before it) to the latest
    // read (up to 1 s before this pull): all of it but 2 s at most. The user's pull 4 s
    // after the first would have left 5 s at most.
    let span = covered(&r.body);
    assert!(
        span + Duration::from_secs(2) >= since,
        "the scraper's second pull covers {span:?} of the {since:?} since its first"
    );
    drop(serve);
}

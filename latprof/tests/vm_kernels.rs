//! latprof on the kernels people run: each kernel ../shared/vm offers (the 6.12 reference build,
//! Debian 12's stock 6.1 and its PREEMPT_RT flavour, Debian 11's stock 5.10) boots once and
//! runs tests/vm/kernels.sh: exact nanosleep counts in lazy and normal mode, a pipe ping-pong
//! counted on both sides, fsync's uninterruptible waits under their backtrace, spikes for known
//! long sleeps, each of two cgroups' sleeps (`stats --by cgroup`), user backtraces named
//! (`--user-stacks`), `stats --counters` with the
//! variant of the programs that loaded and their cost, a verifier rejection said with its
//! reason, and no program left loaded afterwards.
//!
//! Debian's arm64 kernels (12's 6.1 and 13's 6.12, the distribution's binaries) boot under
//! qemu-system-aarch64 (tests/vm/arm64.sh) and run the same script with the arm64 build of
//! latprof and of the workload, to the same assertions.
//!
//! The expected variant is written down per kernel, so a kernel that silently falls back to a
//! slower variant fails here.
//!
//! Needs root and ../shared/vm; `cargo xtask test` runs it. LATPROF_SKIP_VM=1 skips it loudly.
use serde_json::Value;

mod common;

use common::vm::{boot, section};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/kernels.sh");

/// What `stats` says it loaded where the best variant runs.
const CACHED: &str = "backtraces at wakeup through the stack cache";
/// arm64: the stack cache knows only x86-64's kernel stacks; every backtrace is walked.
const WALKED: &str =
    "backtraces walked at wakeup, no stack cache (about 3x the kernel time per counted sleep)";
/// Debian 11's 5.10: no bpf_loop, no bpf_task_pt_regs, no BPF compare-and-swap.
const BOUNDED_NOCAS: &str = "backtraces at wakeup through the stack cache, learnt in a bounded loop (no bpf_loop: a little more per new backtrace); no BPF compare-and-swap: normal mode keeps maxima per CPU (one more lookup per sleep)";

fn rc(out: &str, name: &str) -> String {
    section(out, &format!("{name} rc")).join(" ")
}

fn num(text: &str, what: &str) -> u64 {
    text.parse()
        .unwrap_or_else(|_| panic!("{what}: {text:?} is not a number"))
}

/// A `key=value` fact the workload printed about its own work.
fn fact(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .map_or_else(
            || panic!("workload did not report {key}: {line}"),
            |v| num(v, key),
        )
}

/// 100 nanosleeps of 2 ms of one process: every one that slept counted, under one backtrace,
/// and inside what the workload timed around them itself.
fn check_nanosleep(out: &str, mode: &str, variant: &str) {
    assert_eq!(rc(out, &format!("nanosleep {mode}")), "0", "{out}");
    let stderr = section(out, &format!("nanosleep {mode} stderr")).join("\n");
    assert!(
        stderr.contains(&format!("latprof: programs: {variant}\n")),
        "{mode}: not the expected programs ({variant}):\n{stderr}"
    );
    // No warning but the variant's own fallbacks (5.10's bounded cache and no CAS).
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("warning") && !l.contains("not the best variant")),
        "{mode}: {stderr}"
    );
    let own = section(out, &format!("nanosleep {mode} workload")).join(" ");
    let lines = section(out, &format!("nanosleep {mode}"));
    let cause: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("hrtimer_nanosleep"))
        .collect();
    assert_eq!(cause.len(), 1, "{mode}: one nanosleep cause in {lines:#?}");
    let f: Vec<&str> = cause[0].split(' ').collect();
    let (count, total_us, max_us) = (num(f[0], "count"), num(f[1], "total"), num(f[2], "max"));
    assert_eq!(f[3], "hrtimer_nanosleep", "{mode}: {}", cause[0]);
    // Every sleep the workload really slept: under emulation a 2 ms timer can expire before
    // the task leaves the CPU (a slow interrupt in between), and that nanosleep never sleeps
    // (seen once on 5.10: 99 of 100).
    let slept = fact(&own, "slept");
    assert!(
        slept >= 90,
        "{mode}: the workload slept only {slept} times: {own}"
    );
    assert_eq!(
        count, slept,
        "{mode}: {lines:#?}\nstderr:\n{stderr}\nworkload: {own}"
    );
    // latprof times each sleep from switch-out to wakeup, inside the workload's own interval
    // around nanosleep. The timer starts a little before the switch-out (under emulation up
    // to a few hundred microseconds: 1,867 us measured for a 2 ms sleep on 5.10), so a sleep
    // measures at least 1.5 ms here.
    assert!(total_us >= slept * 1500, "{mode}: total {total_us} us");
    assert!(
        total_us <= fact(&own, "total_ns") / 1000 + 1,
        "{mode}: total {total_us} us over the workload's own {own}"
    );
    // The maximum is at least the average (a maximum kept wrong, e.g. the first sleep's only,
    // falls below it) and within the workload's own longest sleep.
    assert!(
        (total_us / count..=fact(&own, "max_ns") / 1000 + 1).contains(&max_us),
        "{mode}: max {max_us} us against the average and the workload's own {own}"
    );
}

/// Two cgroups with a nanosleep workload each: `stats --by cgroup` gives each exactly its
/// workload's sleeps (the VMs hide nothing: no loss allowed), under the cgroup's name. Beside
/// it, `--cgroup` on the first in normal mode: its sleeps exactly, and none of the second's.
fn check_cgroups(out: &str) {
    let slept = |which: &str| {
        fact(
            &section(out, &format!("cgroups workload {which}")).join(" "),
            "slept",
        )
    };
    for (run, expect) in [
        (
            "cgroups",
            &[("lp-a.service", "a", 55), ("lp-b", "b", 27)][..],
        ),
        ("cgroup filter", &[("lp-a.service", "a", 55)][..]),
    ] {
        assert_eq!(rc(out, run), "0", "{out}");
        let text = section(out, run);
        let stderr = section(out, &format!("{run} stderr")).join("\n");
        assert!(!stderr.contains("sleeps lost"), "{stderr}");
        let cgroup_sleeps = |name: &str| -> Option<u64> {
            let at = text
                .iter()
                .position(|l| l.starts_with(&format!("cgroup {name} (/{name}): ")))?;
            text[at + 1..]
                .iter()
                .take_while(|l| l.starts_with("  "))
                .find(|l| l.contains(" hrtimer_nanosleep "))
                .and_then(|l| l.split_whitespace().next())
                .map(|n| num(n, "count"))
        };
        for &(name, which, least) in expect {
            let slept = slept(which);
            assert!(
                slept >= least,
                "{name}: the workload slept only {slept} times"
            );
            assert_eq!(
                cgroup_sleeps(name),
                Some(slept),
                "{run}: {name}:\n{}\n{stderr}",
                text.join("\n")
            );
        }
        if run == "cgroup filter" {
            // B's workload slept as much, and nothing outside A was counted.
            let others: Vec<&&str> = text
                .iter()
                .filter(|l| l.starts_with("cgroup ") && !l.starts_with("cgroup lp-a.service "))
                .collect();
            assert!(others.is_empty(), "{run}: counted outside A: {others:?}");
        }
    }
}

fn json(out: &str, name: &str) -> Value {
    let text = section(out, name).join("\n");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON ({e}):\n{text}"))
}

fn frames(cause: &Value) -> Vec<&str> {
    cause["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f.as_str().expect("frame"))
        .collect()
}

/// Each side of the ping-pong (two processes, each reading 200 times) has its own pipe waits:
/// exactly the reads that slept on that side (the workload counts each side's), each ended by
/// the other side.
fn check_pingpong(out: &str) {
    assert_eq!(rc(out, "pingpong"), "0", "{out}");
    let doc = json(out, "pingpong");
    let stderr = section(out, "pingpong stderr").join("\n");
    assert_eq!(common::reported_missing(&stderr), 0, "{stderr}");
    // The processes with pipe waits (by their waits, not their name: latprof keeps the name a
    // task had at its first sleep, and the parent may first sleep as the shell that forked it).
    let pipe_waits = |p: &Value| -> u64 {
        p["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .filter(|c| frames(c).first() == Some(&"pipe_read"))
            .map(|c| c["count"].as_u64().expect("count"))
            .sum()
    };
    let sides: Vec<&Value> = doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| pipe_waits(p) > 0)
        .collect();
    assert_eq!(
        sides.len(),
        2,
        "two ping-pong processes: {:#}",
        doc["processes"]
    );
    let parent = num(&section(out, "pingpong pids").join(""), "pid");
    let own = section(out, "pingpong workload").join(" ");
    for side in &sides {
        let pid = side["pid"].as_u64().expect("pid");
        let other = sides
            .iter()
            .map(|p| p["pid"].as_u64().expect("pid"))
            .find(|&p| p != pid)
            .expect("two sides");
        // Each read that slept, counted once: the parent's wait for the start line began
        // before latprof attached, and the child's for the end ends after latprof stopped.
        // Shorter than 1 us, a sleep is not counted (latencytop's rule), nor is an -rt
        // kernel's wait for a sleeping spinlock: latprof says how many of the guest's were.
        let slept = fact(
            &own,
            if pid == parent {
                "ping_slept"
            } else {
                "pong_slept"
            },
        );
        let waits = pipe_waits(side);
        assert!(
            waits <= slept && waits + not_sleeps(&doc, &stderr) >= slept,
            "{waits} pipe waits of side {pid} (the workload's own count: {own}; {stderr}): {side:#}"
        );
        // Each ended by the other side (issue 16).
        let woken = wakers_of(&doc, pid, "pipe_read");
        all_by(&doc, pid, &woken, |kind, waker| {
            kind == "task" && waker == Some(other)
        });
        assert_eq!(woken.iter().map(|w| w.2).sum::<u64>(), waits, "{woken:?}");
    }
    assert!(
        sides.iter().any(|p| p["pid"].as_u64() == Some(parent)),
        "the parent {parent} is not among {sides:#?}"
    );
}

/// `(kind, waker pid, count)` of the JSON's wakers of `sleeper`'s sleeps whose first frame
/// is `frame`.
fn wakers_of(doc: &Value, sleeper: u64, frame: &str) -> Vec<(String, Option<u64>, u64)> {
    doc["wakers"]
        .as_array()
        .expect("wakers")
        .iter()
        .filter(|w| w["sleeper_pid"].as_u64() == Some(sleeper) && frames(w).first() == Some(&frame))
        .map(|w| {
            (
                w["kind"].as_str().expect("kind").to_owned(),
                w["pid"].as_u64(),
                w["count"].as_u64().expect("count"),
            )
        })
        .collect()
}

/// The count of `wakers` (process `pid`'s) by what `who` accepts; every other one must be a
/// waking the kernel hid from the process's own sleeps (none in these guests, whose kernels
/// hide nothing), or the first traced sleep of one of its tasks, whose waking may have come
/// before latprof made the task's entry.
fn all_by(
    doc: &Value,
    pid: u64,
    wakers: &[(String, Option<u64>, u64)],
    who: impl Fn(&str, Option<u64>) -> bool,
) -> u64 {
    let total: u64 = wakers.iter().map(|w| w.2).sum();
    let theirs: u64 = wakers.iter().filter(|w| who(&w.0, w.1)).map(|w| w.2).sum();
    let unseen: u64 = wakers.iter().filter(|w| w.0 == "unseen").map(|w| w.2).sum();
    let known = common::own_unseen(doc, u32::try_from(pid).expect("pid"));
    assert!(
        theirs + unseen == total && unseen <= known,
        "{wakers:?} ({known} wakings hidden or at a task's first sleep)"
    );
    theirs
}

/// UDP on loopback: each receive that waited (the workload counts them) is woken by the
/// softirq, each of the sender's nanosleeps that slept by the timer, none by a task.
fn check_udp(out: &str) {
    assert_eq!(rc(out, "udp"), "0", "{out}");
    let doc = json(out, "udp");
    let pid = num(&section(out, "udp pid").join(""), "pid");
    let own = section(out, "udp workload").join(" ");
    // __skb_wait_for_more_packets, or __skb_recv_udp where the wait is inlined (by the first
    // frame: a cause is one or the other).
    let rx: Vec<_> = ["__skb_wait_for_more_packets", "__skb_recv_udp"]
        .iter()
        .flat_map(|f| wakers_of(&doc, pid, f))
        .collect();
    let stderr = section(out, "udp stderr").join("\n");
    assert_eq!(common::reported_missing(&stderr), 0, "{stderr}");
    let short = not_sleeps(&doc, &stderr);
    let exact = |n: u64, slept: u64, what: &str| {
        assert!(
            n <= slept && n + short >= slept,
            "{n} {what} for {slept} that slept ({short} of the guest's switches no sleep)"
        );
    };
    let n = all_by(&doc, pid, &rx, |kind, _| kind == "softirq");
    exact(n, fact(&own, "waited"), "receives woken by the softirq");
    let naps = wakers_of(&doc, pid, "hrtimer_nanosleep");
    let n = all_by(&doc, pid, &naps, |kind, _| kind == "timer");
    exact(n, fact(&own, "naps"), "nanosleeps woken by the timer");
}

/// The workload's voluntary switches (all its threads) when latprof attached and before it
/// stopped, from the section "STEP switches".
fn switches(out: &str, step: &str) -> (u64, u64) {
    let counts: Vec<u64> = section(out, &format!("{step} switches"))
        .join(" ")
        .split_whitespace()
        .map(|n| n.parse().expect("a switch count"))
        .collect();
    let [before, after] = counts[..] else {
        panic!("two switch counts for {step}: {counts:?}")
    };
    (before, after)
}

/// fsync's waits, its process only: every sleep of the workload's loop (it counts them)
/// counted, or left out as shorter than 1 us (latencytop's rule, which latprof says); at least
/// one per fsync under fsync's backtrace, uninterruptible (spikes' K column), with the reason
/// stats gives that backtrace.
fn check_fsync(out: &str) {
    assert_eq!(rc(out, "fsync"), "0 0", "{out}");
    let doc = json(out, "fsync");
    let stderr = section(out, "fsync stderr").join("\n");
    assert_eq!(common::reported_missing(&stderr), 0, "{stderr}");
    let all = doc["causes"].as_array().expect("causes");
    let sleeps: u64 = all
        .iter()
        .filter(|c| c["kind"] == "sleep")
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    // Every voluntary switch of the process while latprof watched (the script reads them from
    // /proc): a sleep counted, or one shorter than 1 us, or (PREEMPT_RT) a wait for a sleeping
    // spinlock, neither of which latencytop counts; and the last, its read of stdin after the
    // work, still asleep when latprof stopped. The workload's own count of its loop's sleeps
    // is at most that.
    let own = section(out, "fsync workload").join(" ");
    let (before, after) = switches(out, "fsync");
    let counter = |name: &str| doc["counters"][name].as_u64().expect("a counter");
    let seen = sleeps + counter("skipped_zero") + counter("rtlock_waits");
    assert_eq!(
        seen + 1,
        after - before,
        "the fsync workload's voluntary switches ({own}; {stderr}): {all:#?}"
    );
    assert!(seen >= fact(&own, "slept"), "{seen} switches seen: {own}");
    let causes: Vec<&Value> = all
        .iter()
        // do_fsync on most kernels; 5.10's inlines it into __x64_sys_fsync.
        .filter(|c| frames(c).iter().any(|f| f.contains("fsync")))
        .collect();
    let count: u64 = causes
        .iter()
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    // Each of the 20 fsyncs waits for its write at least once.
    assert!(count >= 20, "{count} waits under fsync: {causes:#?}");
    let reasons: Vec<&str> = causes
        .iter()
        .map(|c| c["reason"].as_str().expect("reason"))
        .collect();
    let spikes = section(out, "fsync spikes");
    let d_waits = spikes
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 9 && f[3] == common::WORKLOAD_COMM && f[4] == "D")
        // Time, pid, tid, comm, kind, duration, CPU, waker, then the reason.
        .filter(|f| reasons.contains(&f[8..].join(" ").as_str()))
        .count();
    assert!(
        d_waits >= 20,
        "{d_waits} uninterruptible fsync waits among the spikes ({reasons:?}):\n{}",
        spikes.join("\n")
    );
}

/// Wait chains (issue 31) on this kernel: the chain workload's reader waits on a pipe that a
/// second process writes after an fsync on the scratch disk; every read that slept is counted
/// (short only by those latprof says it left out), the parts of those waits add up to their
/// time, only the syncer woke them, the part it slept is its sleeps as latprof counts them,
/// most of it under the fsync's backtraces. Returns the share behind the fsync.
fn check_chains(out: &str) -> f64 {
    assert_eq!(rc(out, "chains"), "0", "{out}");
    let doc = json(out, "chains");
    let stderr = section(out, "chains stderr").join("\n");
    assert_eq!(common::reported_missing(&stderr), 0, "{stderr}");
    let pid = num(&section(out, "chains pid").join(""), "pid");
    let own = section(out, "chains workload").join(" ");
    let syncer = fact(&own, "syncer");
    let causes: Vec<&Value> = doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(pid))
        .flat_map(|p| p["causes"].as_array().expect("causes"))
        .filter(|c| frames(c).first() == Some(&"pipe_read"))
        .collect();
    assert_eq!(causes.len(), 1, "the reader's pipe waits: {doc:#}");
    let cause = causes[0];
    let (count, total) = (
        cause["count"].as_u64().expect("count"),
        cause["total_ns"].as_u64().expect("total"),
    );
    let waited = fact(&own, "waited");
    assert!(
        count <= waited && count + not_sleeps(&doc, &stderr) >= waited,
        "{count} pipe waits, the workload's own count: {own}; {stderr}"
    );
    let parts = cause["behind"].as_array().expect("behind");
    let sum: u64 = parts
        .iter()
        .map(|p| p["time_ns"].as_u64().expect("time"))
        .sum();
    assert_eq!(sum, total, "{cause:#}");
    let (mut slept, mut fsync) = (0, 0);
    for p in parts {
        assert_eq!(p["waker"]["pid"].as_u64(), Some(syncer), "{cause:#}");
        if p["kind"] == "slept" {
            let ns = p["time_ns"].as_u64().expect("time");
            slept += ns;
            if frames(p)
                .iter()
                .any(|f| f.contains("fsync") || f.contains("sync_file"))
            {
                fsync += ns;
            }
        }
    }
    // The syncer's sleeps as latprof counts them (it lives until the reader is done): each
    // in its fsyncs lies in one of the reader's waits (each fsync starts once the reader has
    // switched out), all behind it but those the workload saw outside its fsyncs or in rounds
    // with more sleeps than the kernel keeps a waker's, as tests/chains.rs says; most are the
    // fsync's.
    let counted: u64 = doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(syncer))
        .flat_map(|p| p["causes"].as_array().expect("causes"))
        .filter(|c| c["kind"] == "sleep")
        .map(|c| c["total_ns"].as_u64().expect("total"))
        .sum();
    let allowed = fact(&own, "outside_slept_ns") + fact(&own, "crowded_slept_ns");
    assert!(
        slept <= counted && counted - slept <= allowed,
        "{slept} ns behind the syncer, which latprof counted {counted} ns of sleeps ({allowed} \
         ns of them allowed elsewhere: {own}): {cause:#}"
    );
    assert!(
        fsync * 2 >= slept,
        "{fsync} of {slept} ns under fsync: {cause:#}"
    );
    #[expect(clippy::cast_precision_loss, reason = "a share")]
    let share = fsync as f64 / total as f64;
    share
}

/// The voluntary switches latprof saw in the guest and counted as no sleep: sleeps shorter
/// than 1 us (latencytop's rule) and PREEMPT_RT's waits for a sleeping spinlock (no sleep to
/// latencytop either), from a JSON document and its stderr.
fn not_sleeps(doc: &Value, stderr: &str) -> u64 {
    common::under_1us(stderr).unwrap_or_else(|| panic!("no summary line in {stderr}"))
        + doc["counters"]["rtlock_waits"]
            .as_u64()
            .expect("rtlock_waits")
}

/// A printed duration (`30ms`, `7.25ms`, `357us`, `1.2s`) in microseconds.
fn micros(text: &str) -> f64 {
    let (n, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or_else(|| panic!("no unit in {text:?}"), |i| text.split_at(i));
    let n: f64 = n
        .parse()
        .unwrap_or_else(|_| panic!("bad duration {text:?}"));
    match unit {
        "ns" => n / 1000.0,
        "us" => n,
        "ms" => n * 1000.0,
        "s" => n * 1e6,
        _ => panic!("unit of {text:?}"),
    }
}

/// The 5 nanosleeps of 30 ms, each a spike over 20 ms.
fn check_spikes(out: &str) {
    assert_eq!(rc(out, "spikes"), "0", "{out}");
    let lines = section(out, "spikes");
    let ours: Vec<Vec<&str>> = lines
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 9 && f[3] == common::WORKLOAD_COMM)
        .collect();
    assert_eq!(ours.len(), 5, "{}", lines.join("\n"));
    let own = section(out, "spikes workload").join(" ");
    #[expect(
        clippy::cast_precision_loss,
        reason = "microseconds of a test workload"
    )]
    let own_max_us = fact(&own, "max_ns") as f64 / 1000.0;
    for f in ours {
        assert_eq!(f[4], "S", "{f:?}");
        // Woken by the timer (the WAKER column, issue 16).
        assert_eq!(f[7], "timer", "{f:?}");
        assert_eq!(f[8..].join(" "), "Application requested delay", "{f:?}");
        let us = micros(f[5]);
        // From switch-out to wakeup: at most the workload's own longest sleep (printed with 3
        // significant digits), at least the 20 ms that make it a spike. 30 ms less the time
        // from arming the timer to leaving the CPU is all that is known below: that time was a
        // few hundred microseconds with one guest at a time, and 4 ms once with two guests
        // sharing the host's two CPUs (the 6.12 guest showed a 26 ms spike).
        assert!(
            (20_000.0..=own_max_us * 1.01).contains(&us),
            "{f:?} against the workload's own {own}"
        );
    }
}

/// `stats --counters`: the variant, nothing lost, and latprof's kernel time per program run.
/// Returns the ns per run over all programs.
fn check_counters(out: &str, variant: &str, cached: bool, kfuncs: bool) -> f64 {
    assert_eq!(rc(out, "counters"), "0", "{out}");
    let text = section(out, "counters");
    assert!(
        text.contains(&format!("programs: {variant}").as_str()),
        "{}",
        text.join("\n")
    );
    // The stack cache's plain loads where the kernel has bpf_rdonly_cast (6.2 on), else its
    // copy by a helper, said as a fallback.
    assert_eq!(
        text.iter()
            .any(|l| l.contains("lacks the bpf_rdonly_cast kfunc")),
        !kfuncs,
        "{}",
        text.join("\n")
    );
    let counter = |name: &str| -> u64 {
        text.iter()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&name)).then(|| num(f[1], name))
            })
            .unwrap_or_else(|| panic!("no counter {name}:\n{}", text.join("\n")))
    };
    assert_eq!(counter("sleep_lost"), 0, "{}", text.join("\n"));
    assert_eq!(counter("sleeps_recovered"), 0, "{}", text.join("\n"));
    assert_eq!(counter("stack_missing"), 0, "{}", text.join("\n"));
    // Every voluntary switch of the ping-pong's threads while latprof watched (the script
    // reads them from /proc): counted, or left out as shorter than 1 us, or (PREEMPT_RT) a wait
    // for a sleeping spinlock, which is no sleep to latencytop either; and the two last, each
    // thread's wait after the work, still asleep when latprof stopped. The workload's own
    // count of the ping-pong's sleeps is at most that.
    let own = section(out, "counters workload").join(" ");
    let (before, after) = switches(out, "counters");
    let seen = counter("counted") + counter("skipped_zero") + counter("rtlock_waits");
    assert_eq!(
        seen + 2,
        after - before,
        "the ping-pong's voluntary switches ({own})\n{}",
        text.join("\n")
    );
    assert!(seen >= fact(&own, "slept"), "{seen} switches seen: {own}");
    if cached {
        assert!(counter("stack_cache_hits") >= 1000, "{}", text.join("\n"));
    }
    let all = text
        .iter()
        .find_map(|l| l.strip_prefix("all "))
        .unwrap_or_else(|| panic!("no run-time statistics:\n{}", text.join("\n")));
    let f: Vec<&str> = all.split_whitespace().collect();
    f[1].parse()
        .unwrap_or_else(|_| panic!("ns per run {all:?}"))
}

/// The forced rejection: a non-zero exit, one error line naming the program and quoting the
/// verifier's reason, which is the last line of the whole log in the file it names.
fn check_reject(out: &str) {
    assert_ne!(rc(out, "reject"), "0", "{out}");
    let errors: Vec<&str> = section(out, "reject")
        .into_iter()
        .filter(|l| l.starts_with("latprof: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{out}");
    let error = errors[0];
    assert!(error.contains("verifier rejected sched_switch"), "{error}");
    let last = section(out, "reject log").join("\n");
    assert!(!last.starts_with("no log file"), "{last}\n{error}");
    assert!(
        error.contains(&format!(": {last} (at ")),
        "the error does not quote the log's reason {last:?}: {error}"
    );
}

/// `--user-stacks` on a ping-pong (issue 17): the same programs load with the user walk, and
/// the pipe waits carry the workload's frames (its std read path), named and demangled.
fn check_ustacks(out: &str, variant: &str) {
    let stderr = section(out, "ustacks stderr").join("\n");
    assert_eq!(rc(out, "ustacks"), "0", "{stderr}");
    assert!(
        stderr.contains(&format!("latprof: programs: {variant}\n")),
        "--user-stacks: not the expected programs ({variant}):\n{stderr}"
    );
    // record's programs (top's and serve's) load the same variant with the user walk, and
    // fall back from nothing stats does not.
    let record = section(out, "ustacks record stderr").join("\n");
    assert_eq!(rc(out, "ustacks record"), "0", "{record}");
    assert!(
        record.contains(&format!("latprof: programs: {variant}\n")),
        "record --user-stacks: not the expected programs ({variant}):\n{record}"
    );
    let fallbacks = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("not the best variant"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        fallbacks(&record),
        fallbacks(&stderr),
        "record --user-stacks falls back where stats does not"
    );
    let json: Value = serde_json::from_str(&section(out, "ustacks").join("\n"))
        .unwrap_or_else(|e| panic!("ustacks JSON: {e}\n{out}"));
    let causes = json["causes"].as_array().expect("causes");
    // The parent's (--pid's) every read that slept, each under its user frames (two CPUs
    // apart: each read waits for the other's answer, unless that side lost its CPU between
    // its write and its read).
    let reads: u64 = causes
        .iter()
        .filter(|c| c["frames"].to_string().contains("pipe_read"))
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    let slept = fact(&section(out, "ustacks workload").join(" "), "ping_slept");
    assert!(
        reads <= slept && reads + not_sleeps(&json, &stderr) >= slept,
        "{reads} pipe reads counted of the {slept} that slept:\n{stderr}"
    );
    let pipe: Vec<Vec<String>> = causes
        .iter()
        .filter(|c| c["frames"].to_string().contains("pipe_read"))
        .map(common::ustacks::user_frames)
        .collect();
    // The workload is Rust built without frame pointers, linked statically with musl: its
    // frames come from unwinding (libc's syscall wrapper, musl's `__syscall_cp_c`, whose
    // other name at the same address is `sccp`, either of which may name it, then its std's
    // read path at least, `alloc::io::read::...` or `std::io::...`), named and demangled.
    assert!(
        pipe.iter().any(|frames| {
            frames
                .first()
                .is_some_and(|f| f.contains("read") || f.contains("syscall") || f == "sccp")
                && frames
                    .iter()
                    .any(|f| f.contains("::read") && (f.contains("std::") || f.contains("alloc::")))
        }),
        "the pipe waits' user frames do not name the workload's read: {pipe:#?}\n{stderr}\ncauses: {:?}",
        causes
            .iter()
            .map(|c| format!("{} {}", c["count"], c["frames"]))
            .collect::<Vec<_>>()
    );
    for frames in &pipe {
        assert!(
            !frames
                .iter()
                .any(|f| f.starts_with("_ZN") || f.starts_with("_R")),
            "mangled: {frames:?}"
        );
    }
    // Frame by frame against the workload's real call chain: libc's syscall wrapper, std's
    // read path, then the chain the workload took itself to its read (std's backtrace, taken
    // in the function that reads and printed before `done`) out to its `main`. Where the
    // kernel has bpf_loop (every variant here but 5.10's) the unwind tables step through
    // every frame: each wait shows the workload's whole chain. Without it (5.10) the walk is
    // by frame pointers, which this Rust does not keep, and the stack words kept at the
    // stack pointer: it may stop in std's read path, before the workload's own frames
    // (docs/guide/user-stacks.md: "two or three frames"), and must then say so,
    // `[truncated]`, as latprof says it walks by frame pointers only there; every frame it
    // shows is still the right one, in the right place.
    let tables = variant != BOUNDED_NOCAS;
    assert_eq!(
        stderr.contains("user frames are walked by frame pointers only"),
        !tables,
        "--user-stacks: the walk latprof says it loaded, against this kernel's (bpf_loop: \
         {tables}):\n{stderr}"
    );
    let own: Vec<String> = section(out, "ustacks workload")
        .iter()
        .filter_map(|l| l.strip_prefix("stack: "))
        .map(normalized)
        .collect();
    let (from, to) = (
        own.iter().position(|f| f == READER),
        own.iter().position(|f| f == WORKLOAD_MAIN),
    );
    let own = match (from, to) {
        (Some(from), Some(to)) if from < to => &own[from..=to],
        _ => panic!("the workload's own call chain, {READER} to {WORKLOAD_MAIN}: {own:#?}"),
    };
    for frames in &pipe {
        check_workload_chain(frames, own, tables);
    }
}

/// One pipe wait's user frames (`frames`) against the workload's own chain (`own`, its reader
/// out to its `main`): libc's syscall wrapper, std's read path, then the workload's frames in
/// order, all of them where the kernel walks by the unwind tables (`tables`).
fn check_workload_chain(frames: &[String], own: &[String], tables: bool) {
    let names: Vec<String> = frames
        .iter()
        .map(|f| normalized(common::ustacks::function(f)))
        .collect();
    let wrapper = names
        .first()
        .is_some_and(|f| f.contains("read") || f.contains("syscall") || f == "sccp");
    let std_path = names
        .iter()
        .skip(1)
        .take_while(|f| {
            f.starts_with("alloc::io::") || f.starts_with("std::") || f.starts_with("<std::")
        })
        .count();
    let rest = &names[1 + std_path..];
    let shown = rest
        .iter()
        .take_while(|f| *f != latprof::ustacks::TRUNCATED)
        .count();
    // Up to the workload's main, the workload's own chain; past it (where the unwind
    // tables reach: musl saves and reuses the frame pointer register, so the static
    // workload has a table on kernels with bpf_loop) std's and musl's start, which its
    // own backtrace leaves out.
    let mine = shown.min(own.len());
    assert!(
        wrapper && std_path >= 1 && rest[..mine] == own[..mine],
        "latprof's user frames {names:#?} against the workload's own chain {own:#?}"
    );
    // Whole to the workload's main (and on): every one of its own frames, in order. Only
    // without the tables may the walk stop before them, cut short and saying so.
    if tables {
        assert!(
            shown >= own.len(),
            "the workload's whole chain by the unwind tables: latprof's {names:#?} \
             against the workload's own {own:#?}"
        );
    } else {
        assert!(
            shown >= own.len()
                || rest.get(shown).map(String::as_str) == Some(latprof::ustacks::TRUNCATED),
            "{names:#?}"
        );
    }
    assert!(
        rest[mine..shown]
            .iter()
            .all(|f| f.starts_with("std::") || f == "main" || f.contains("libc_start")),
        "past the workload's main: {names:#?}"
    );
}

/// tests/fixtures/ustacks/server.c built for arm64 as the guests run it, static (the guest has
/// no C library), optimized, with Debian's cross compiler: `server` without frame pointers,
/// `server-fp` with them and without unwind tables of its own (so the walk takes its frames by
/// frame pointer, between the C library's, which have tables).
fn build_arm64_servers(dir: &std::path::Path) -> [std::path::PathBuf; 2] {
    std::fs::create_dir_all(dir).expect("temp dir");
    let build = |name: &str, flags: &[&str]| {
        let out = dir.join(name);
        let status = std::process::Command::new("aarch64-linux-gnu-gcc")
            .args(["-static", "-O2"])
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(common::ustacks::server_source())
            .status()
            .unwrap_or_else(|e| panic!("aarch64-linux-gnu-gcc did not run ({e}): `cargo xtask setup` installs gcc-aarch64-linux-gnu"));
        assert!(
            status.success(),
            "aarch64-linux-gnu-gcc failed building {name}"
        );
        out
    };
    [
        build("server", &["-fomit-frame-pointer"]),
        build(
            "server-fp",
            &[
                "-fno-omit-frame-pointer",
                "-fno-optimize-sibling-calls",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ],
        ),
    ]
}

/// A C server (`check_kernel`'s arm64 guests: `name` is `server` or `server-fp`): every pipe
/// read of its main thread that slept is counted under its whole user backtrace, `read`
/// (glibc's wrapper, a leaf whose caller is in the link register) then `wait_for_request`,
/// `serve_requests`, `main`, and on to the C library's start (not `[truncated]`): through the
/// tables alone (`server`), or by frame pointers between the C library's tables
/// (`server-fp`, whose walk goes from a frame-pointer step back to a table's rule).
fn check_c_server(out: &str, name: &str) {
    let stderr = section(out, &format!("ustacks {name} stderr")).join("\n");
    assert_eq!(rc(out, &format!("ustacks {name}")), "0 0", "{stderr}");
    let own = section(out, &format!("ustacks {name} workload")).join(" ");
    let waited = fact(&own, "waited");
    assert!(
        waited >= 150,
        "the server's reads slept only {waited} times: {own}"
    );
    let json: Value = serde_json::from_str(&section(out, &format!("ustacks {name}")).join("\n"))
        .unwrap_or_else(|e| panic!("ustacks {name} JSON: {e}\n{out}"));
    let whole = common::ustacks::causes_where(&json, "pipe_read", |frames| {
        common::ustacks::has_server_chain(frames)
            && frames.last().map(String::as_str) != Some(latprof::ustacks::TRUNCATED)
    });
    let counted: u64 = whole
        .iter()
        .map(|c| c["count"].as_u64().expect("count"))
        .sum();
    let all: Vec<String> = json["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .map(|c| format!("{} {:?}", c["count"], common::ustacks::user_frames(c)))
        .collect();
    assert_eq!(
        counted, waited,
        "{name}: the server's slept reads under their whole backtrace ({own}):\n{all:#?}\n{stderr}"
    );
}

/// The workload's function that reads the pipe (`bounce`, never inlined), and its main.
const READER: &str = "latprof_bench::workload::bounce";
const WORKLOAD_MAIN: &str = "latprof_workload::main";

/// A Rust function's name as both namers print it: no hash, no generic arguments, closures
/// as `{closure}` (the legacy and v0 manglings print them apart).
fn normalized(name: &str) -> String {
    let name = name.trim();
    let name = match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            head
        }
        _ => name,
    };
    let mut out = String::new();
    let mut depth = 0;
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if depth == 0 && rest.starts_with("::<") {
            depth = 1;
            rest = &rest[3..];
            continue;
        }
        if depth > 0 {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    let mut text = out.replace("{{closure}}", "{closure}");
    while let Some(at) = text.find("{closure#") {
        let end = text[at..].find('}').map_or(text.len(), |e| at + e + 1);
        text.replace_range(at..end, "{closure}");
    }
    text
}

#[test]
fn names_compare_without_hash_generics_or_closure_numbers() {
    assert_eq!(
        normalized(
            "latprof_bench::workload::pingpong::<latprof_bench::workload::run::{closure#0}>"
        ),
        "latprof_bench::workload::pingpong"
    );
    assert_eq!(
        normalized("std::rt::lang_start::{{closure}}::h0123456789abcdef"),
        "std::rt::lang_start::{closure}"
    );
    assert_eq!(
        normalized("std::rt::lang_start::<std::process::ExitCode>::{closure#0}"),
        "std::rt::lang_start::{closure}"
    );
    assert_eq!(normalized("main"), "main");
}

/// `kfuncs`: the kernel has those latprof calls (`bpf_rdonly_cast`, Linux 6.2).
fn check_kernel(kernel: &str, release: &str, variant: &str, cached: bool, kfuncs: bool) {
    // The arm64 guests also run the C server built for arm64 without frame pointers.
    let dir = std::env::temp_dir().join(format!(
        "latprof-vm-kernels-{}-{kernel}",
        std::process::id()
    ));
    let servers = kernel
        .starts_with("arm64-")
        .then(|| build_arm64_servers(&dir));
    let mut vm_args = vec!["--kernel", kernel, "--smp", "2"];
    for server in servers.iter().flatten() {
        vm_args.extend(["--file", server.to_str().expect("a UTF-8 temp path")]);
    }
    let booted = boot(SCRIPT, "sh /work/kernels.sh", &vm_args);
    let _ = std::fs::remove_dir_all(&dir);
    let Some(out) = booted else {
        return;
    };
    assert_eq!(section(&out, "uname"), [release], "{out}");
    check_nanosleep(&out, "lazy", variant);
    check_nanosleep(&out, "normal", variant);
    check_pingpong(&out);
    check_udp(&out);
    check_fsync(&out);
    let chains = check_chains(&out);
    eprintln!("{kernel}: {chains:.3} of the reader's pipe waits behind the syncer's fsync");
    check_spikes(&out);
    check_cgroups(&out);
    check_ustacks(&out, variant);
    if servers.is_some() {
        check_c_server(&out, "server");
        check_c_server(&out, "server-fp");
    }
    let ns = check_counters(&out, variant, cached, kfuncs);
    eprintln!("{kernel}: latprof's BPF programs {ns:.0} ns per run on the ping-pong");
    check_reject(&out);
    let left = section(&out, "loaded programs");
    assert!(left.is_empty(), "programs left loaded: {left:?}");
}

#[test]
#[ignore = "needs root and ../shared/vm: run `cargo xtask test`"]
fn linux_6_12() {
    check_kernel("6.12", "6.12.117", CACHED, true, true);
}

#[test]
#[ignore = "needs root and ../shared/vm: run `cargo xtask test`"]
fn debian_12_stock_6_1() {
    check_kernel("debian-6.1", "6.1.0-57-amd64", CACHED, true, false);
}

#[test]
#[ignore = "needs root and ../shared/vm: run `cargo xtask test`"]
fn debian_12_stock_6_1_rt() {
    check_kernel("debian-6.1-rt", "6.1.0-57-rt-amd64", CACHED, true, false);
}

#[test]
#[ignore = "needs root and ../shared/vm: run `cargo xtask test`"]
fn debian_11_stock_5_10() {
    check_kernel("debian-5.10", "5.10.0-46-amd64", BOUNDED_NOCAS, true, false);
}

// arm64: Debian's stock kernels, as a Graviton or Ampere machine runs them. No stack cache
// there (it knows x86-64's kernel stacks only), so no kfunc fallback to report either.

#[test]
#[ignore = "needs root and qemu-system-aarch64: run `cargo xtask test`"]
fn arm64_debian_12_stock_6_1() {
    check_kernel("arm64-debian-12", "6.1.0-57-arm64", WALKED, false, true);
}

#[test]
#[ignore = "needs root and qemu-system-aarch64: run `cargo xtask test`"]
fn arm64_debian_13_stock_6_12() {
    check_kernel(
        "arm64-debian-13",
        "6.12.117+deb13-arm64",
        WALKED,
        false,
        true,
    );
}

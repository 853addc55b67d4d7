//! `latprof record`: snapshots at every interval, appended to a recording until Ctrl-C,
//! SIGTERM, --duration or --max-size; the file is finished cleanly in each case.
use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::session::{self, Needs, Session};
use super::stalls::Stalls;
use crate::{
    cli::{Cli, RecordArgs},
    collect::{Snapshot, Spike},
    probe::KernelFacts,
    store::{
        KEY_EVERY, RecordingInfo,
        writer::{Appended, NewFile, Options, Stats, Writer},
    },
    symbols::Kallsyms,
    time,
};

fn uname() -> (String, String, String) {
    // SAFETY: utsname is plain bytes; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return Default::default();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| u8::from_ne_bytes(c.to_ne_bytes()))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.nodename), field(&u.release), field(&u.version))
}

/// Facts of this machine and run, stored in every key frame.
#[must_use]
pub fn info(
    cli: &Cli,
    interval: Duration,
    details: bool,
    syms: &Kallsyms,
    kernel: KernelFacts,
) -> RecordingInfo {
    let (hostname, kernel_release, kernel_version) = uname();
    // SAFETY: sysconf has no memory effects.
    let cpus = u32::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(0);
    let (sched_text, lock_text) = syms.ranges();
    RecordingInfo {
        latprof_version: env!("CARGO_PKG_VERSION").to_owned(),
        hostname,
        kernel_release,
        kernel_version,
        cpus,
        mode: cli.mode,
        interval_ns: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
        stack_depth: cli.depth(),
        details,
        kernel,
        spike_ns: u64::try_from(cli.spike.as_nanos()).unwrap_or(u64::MAX),
        wakers: cli.wakers_on(),
        waker_stacks: cli.waker_stacks,
        user_stacks: cli.user_stacks,
        chains: cli.chains,
        sched_text,
        lock_text,
    }
}

/// With `--rotate`, the rotated files that exist already (`FILE.1` ... `FILE.K`), which a
/// rotation would replace; links count, dangling or not.
fn rotated_files(args: &RecordArgs) -> Vec<String> {
    if args.rotate.is_none() {
        return Vec::new();
    }
    (1..=args.keep)
        .map(|n| format!("{}.{n}", args.output.display()))
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect()
}

/// When the snapshot after one taken at `now` is due: the next tick of the schedule, or, where
/// ticks were missed (the process was stopped, or a snapshot took longer than the interval),
/// one interval from now. Catching up instead wrote a burst of snapshots 1 ms apart, each
/// with its fdatasync, after a SIGSTOP.
fn next_tick(next: Instant, interval: Duration, now: Instant) -> Instant {
    let next = next + interval;
    if next > now { next } else { now + interval }
}

pub fn run(cli: &Cli, args: &RecordArgs) -> Result<()> {
    check_args(args)?;
    let details = !args.lean;
    let needs = Needs {
        details,
        spikes: true,
        run_time_stats: true,
        exit_log: true,
        ..Needs::default()
    };
    let checked = session::preflight(cli, &needs)?;
    // The file is created before the programs load (a second or more): no one can put a link
    // in its place meanwhile. It is removed again if they do not load.
    let file = NewFile::create(&args.output, args.force, cli.user_stacks)?;
    let mut session = match Session::start_checked(cli, needs, checked) {
        Ok(session) => session,
        Err(e) => {
            file.remove();
            return Err(e);
        }
    };
    let mut writer = Writer::start(
        file,
        info(
            cli,
            args.interval,
            details,
            &session.syms,
            session.kernel.clone(),
        ),
        Options {
            compress: !args.no_compress,
            rotate: args.rotate,
            keep: args.keep,
            max_size: args.max_size,
        },
    );
    // Said once the collector runs: with --user-stacks it read the processes there are first
    // (their sleeps from now on step through their libc by the unwind tables).
    let mut collector = session.collector(true)?;
    say_recording(cli, args);
    session.announce();
    let Session {
        probe,
        spikes: reader,
        mut log,
        syms,
        stop,
        run_time_stats,
        ..
    } = session;
    let mut reader = reader.context("the session has no spike reader")?;
    let mut spikes = Vec::new();
    let started = Instant::now();
    let mut reason = "stopped by a signal";
    let (mut next, _stalls) = (started, Stalls::watch(args.interval));
    // Spikes first (the longest --max-spikes of the interval), then the snapshot that names
    // their backtraces.
    let mut not_recorded = 0u64;
    let max_spikes = args.max_spikes;
    // What the last snapshot lost or approximated, said when the recording ends (as stats
    // does): a recording's reader sees the counters, the person who ran it sees this.
    let mut end_lines = Vec::new();
    // Set for the last snapshot: it waits for every user backtrace to be named.
    let last = std::cell::Cell::new(false);
    let mut save =
        |writer: &mut Writer, spikes: &mut Vec<Spike>, sleeps: u64| -> Result<Appended> {
            if spikes.len() > max_spikes {
                spikes.sort_by_key(|s| std::cmp::Reverse(s.duration_ns));
                not_recorded += (spikes.len() - max_spikes) as u64;
                spikes.truncate(max_spikes);
            }
            if !spikes.is_empty()
                && writer.append_spikes(spikes, sleeps, not_recorded)? == Appended::Full
            {
                return Ok(Appended::Full);
            }
            spikes.clear();
            if last.get() {
                collector.patient();
            }
            let snap = collector.snapshot(&probe)?;
            end_lines = said_at_end(&snap);
            writer.append(&snap, &syms)
        };
    // Bytes of the file after its first snapshot (header and first key frame).
    let mut first_bytes = None;
    loop {
        if save(&mut writer, &mut spikes, reader.sleeps)? == Appended::Full {
            reason = "--max-size reached";
            break;
        }
        first_bytes.get_or_insert(writer.stats.bytes);
        next = next_tick(next, args.interval, Instant::now());
        let end = args.duration.map(|d| started + d);
        // Sleep until the next snapshot, a signal, or the end of --duration.
        let done = loop {
            if stop.load(Ordering::Relaxed) {
                break true;
            }
            let now = Instant::now();
            if end.is_some_and(|e| now >= e) {
                reason = "--duration reached";
                break true;
            }
            if now >= next {
                break false;
            }
            // Waiting here is the spike reader's sleep: the kernel wakes it for spikes.
            reader.read((next - now).min(Duration::from_millis(50)), &mut spikes)?;
            log.flush();
        };
        if done {
            // The last snapshot holds everything up to the end, every user backtrace named.
            reader.read(Duration::ZERO, &mut spikes)?;
            last.set(true);
            if save(&mut writer, &mut spikes, reader.sleeps)? == Appended::Full {
                reason = "--max-size reached";
            }
            break;
        }
    }
    log.flush();
    drop(save);
    drop(probe);
    drop(run_time_stats);
    let stats = writer.finish(reason)?;
    summary(&stats, reason, started, args.interval, first_bytes);
    for line in end_lines {
        eprintln!("latprof: {line}");
    }
    Ok(())
}

/// What the last snapshot leaves to say after the summary: the sleeps under 1 us not counted
/// by process, then the warnings.
fn said_at_end(snap: &Snapshot) -> Vec<String> {
    let warnings = snap.losses().into_iter().map(|l| format!("warning: {l}"));
    snap.hidden
        .short_by_process()
        .into_iter()
        .chain(warnings)
        .collect()
}

/// The recording's first line: where, how often, in which mode, for how long.
fn say_recording(cli: &Cli, args: &RecordArgs) {
    eprintln!(
        "latprof: recording to {} every {} ({} mode){}; Ctrl-C to stop",
        args.output.display(),
        time::format_duration(args.interval),
        cli.mode.as_str(),
        args.duration
            .map(|d| format!(" for {}", time::format_duration(d)))
            .unwrap_or_default()
    );
}

/// Says before anything loads (a second or two) that the output cannot be created, or that
/// `--rotate` would replace files without `--force`.
/// The interval and the output's folder, refused before anything loads (loading takes a
/// second or two).
fn check_args(args: &RecordArgs) -> Result<()> {
    if args.interval < Duration::from_millis(10) {
        bail!("--interval must be at least 10ms");
    }
    let dir = args
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        bail!(
            "cannot create {}: no directory {}",
            args.output.display(),
            dir.display()
        );
    }
    let rotated = rotated_files(args);
    if !args.force && !rotated.is_empty() {
        bail!(
            "{} exist{} and --rotate would replace {}; choose another name or pass --force",
            rotated.join(", "),
            if rotated.len() == 1 { "s" } else { "" },
            if rotated.len() == 1 { "it" } else { "them" },
        );
    }
    Ok(())
}

/// The recording's last line: why it stopped, its size, and its rate per hour.
fn summary(
    stats: &Stats,
    reason: &str,
    started: Instant,
    interval: Duration,
    first_bytes: Option<u64>,
) {
    let secs = started.elapsed().as_secs_f64();
    let per_snapshot = stats.bytes as f64 / stats.snapshots.max(1) as f64;
    let rate = per_hour(
        stats.bytes,
        first_bytes.unwrap_or(stats.bytes),
        stats.snapshots,
        interval,
    )
    .map_or_else(
        || "too short to estimate a rate per hour".to_owned(),
        |mb| format!("{mb:.1} MB per hour at this rate"),
    );
    eprintln!(
        "latprof: {reason}: {} snapshots in {:.1}s, {} bytes ({per_snapshot:.0} per snapshot, {rate}{})",
        stats.snapshots,
        secs,
        stats.bytes,
        if stats.rotations > 0 {
            format!(", {} rotations", stats.rotations)
        } else {
            String::new()
        }
    );
}

/// MB per hour at the rate of a recording of `snapshots` snapshots every `interval`, `bytes`
/// in all of which `first` are the file's header and first key frame: what the snapshots after
/// the first took per interval, plus the share of a key frame that a longer recording repeats
/// every [`KEY_EVERY`] snapshots. `None` under two intervals recorded: that says nothing of a
/// rate (`--duration 1ns`, 3 KB in 20 ms, was extrapolated to 507 MB per hour).
fn per_hour(bytes: u64, first: u64, snapshots: u64, interval: Duration) -> Option<f64> {
    if snapshots < 3 || interval.is_zero() {
        return None;
    }
    let later = bytes.saturating_sub(first) as f64 / (snapshots - 1) as f64;
    let keys = if snapshots > KEY_EVERY {
        // Already among the later frames.
        0.0
    } else {
        first as f64 / KEY_EVERY as f64
    };
    Some((later + keys) * 3600.0 / interval.as_secs_f64() / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_per_hour_need_whole_intervals() {
        // --duration 1ns: the first snapshot and the last, taken at once.
        assert_eq!(per_hour(3_000, 2_900, 2, Duration::from_secs(1)), None);
        // A key frame of 3 KB, then 100 bytes a second: 0.36 MB of deltas and 0.18 of key
        // frames per hour.
        let mb = per_hour(3_000 + 9 * 100, 3_000, 10, Duration::from_secs(1)).unwrap();
        assert!((mb - 0.54).abs() < 0.01, "{mb}");
    }

    #[test]
    fn missed_ticks_are_skipped_not_caught_up() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // On time, or a little late: the schedule holds (no drift).
        assert_eq!(next_tick(t0, ms(100), t0 + ms(3)), t0 + ms(100));
        assert_eq!(next_tick(t0 + ms(100), ms(100), t0 + ms(150)), t0 + ms(200));
        // Stopped for a second: one interval after the late snapshot, not ten at once.
        assert_eq!(
            next_tick(t0 + ms(100), ms(100), t0 + ms(1150)),
            t0 + ms(1250)
        );
    }
}

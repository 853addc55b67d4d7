//! Time as latprof reads and writes it: the clocks, durations on the command line, durations in
//! tables, and wall-clock times as people read them (RFC 3339 in UTC for files, local time of
//! day on screen).
use std::time::Duration;

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
#[must_use]
pub fn wall_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// CLOCK_MONOTONIC in nanoseconds (the clock of bpf_ktime_get_ns).
#[must_use]
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The wall-clock time (ns since the epoch) of a CLOCK_MONOTONIC time, given a (wall,
/// monotonic) pair read together (live, or a snapshot's `wall_ns` and `taken_ns`).
#[must_use]
pub fn wall_of(mono_ns: u64, clock: (u64, u64)) -> u64 {
    let (wall_now, mono_now) = clock;
    u64::try_from(i128::from(wall_now) + i128::from(mono_ns) - i128::from(mono_now)).unwrap_or(0)
}

/// `12:03:10.123456` local time of a monotonic time, given (wall, monotonic) read together.
#[must_use]
pub fn local_hms_us(mono_ns: u64, clock: (u64, u64)) -> String {
    let wall = wall_of(mono_ns, clock);
    format!("{}.{:06}", local_hms(wall), (wall / 1000) % 1_000_000)
}

/// Time since the start as `H:MM:SS`.
#[must_use]
pub fn fmt_elapsed(secs: f64) -> String {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "whole seconds of a positive time"
    )]
    let s = secs as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// A duration for a table cell: `850us`, `2.07ms`, `413ms`, `1.23s`.
#[must_use]
pub fn fmt_ns(ns: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "three significant digits shown")]
    let us = ns as f64 / 1e3;
    if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 10_000.0 {
        format!("{:.2}ms", us / 1e3)
    } else if us < 1_000_000.0 {
        format!("{:.0}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// Parses a duration on the command line: `500ms`, `5s`, `2m`, `1h`, `250us`; a bare number
/// is seconds. The error is one line for clap to print.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 500ms, 5s, 2m)"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "'{text}' has an unknown unit '{unit}' (use ns, us, ms, s, m or h)"
            ));
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("'{text}' is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration the way `parse_duration` reads it.
#[must_use]
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0s".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// `2026-11-30T12:03:10.123Z` from nanoseconds since the Unix epoch.
#[must_use]
pub fn rfc3339_utc(wall_ns: u64) -> String {
    let secs = wall_ns / 1_000_000_000;
    let ms = (wall_ns / 1_000_000) % 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Seconds since local midnight of a wall-clock time, and the local midnight itself (ns).
#[must_use]
pub fn local_day(wall_ns: u64) -> (u64, u64) {
    // time_t is i64 on x86-64 (glibc and musl alike).
    let secs = i64::try_from(wall_ns / 1_000_000_000).unwrap_or(0);
    // SAFETY: zeroed tm is a valid out value; localtime_r only writes it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers for the duration of the call.
    let ok = !unsafe { libc::localtime_r(&raw const secs, &raw mut tm) }.is_null();
    let of_day = if ok {
        u64::try_from(tm.tm_hour * 3600 + tm.tm_min * 60 + tm.tm_sec).unwrap_or(0)
    } else {
        (wall_ns / 1_000_000_000) % 86_400
    };
    let midnight = (wall_ns / 1_000_000_000).saturating_sub(of_day) * 1_000_000_000;
    (of_day, midnight)
}

/// `12:03:10` in local time.
#[must_use]
pub fn local_hms(wall_ns: u64) -> String {
    let (s, _) = local_day(wall_ns);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn rejects_garbage_with_one_line() {
        for bad in ["", "s", "5 parsecs", "-1s", "1e999", "abc"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for d in ["5s", "500ms", "250us", "7ns", "0s"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
    }

    #[test]
    fn utc_dates() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000Z");
        // 2026-11-30T23:49:24.5Z
        assert_eq!(
            rfc3339_utc(1_796_082_564_500_000_000),
            "2026-11-30T23:49:24.500Z"
        );
        assert_eq!(
            rfc3339_utc(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn local_time_of_day_is_within_a_day() {
        let now = 1_796_082_564_500_000_000;
        let (s, midnight) = local_day(now);
        assert!(s < 86_400);
        assert_eq!(
            midnight + s * 1_000_000_000,
            now / 1_000_000_000 * 1_000_000_000
        );
        assert_eq!(local_hms(now).len(), 8);
    }
}

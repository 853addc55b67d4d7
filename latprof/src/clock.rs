//! Wall-clock times as people read them: RFC 3339 in UTC for files, local time of day on screen.

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
    let secs = libc::time_t::try_from(wall_ns / 1_000_000_000).unwrap_or(0);
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

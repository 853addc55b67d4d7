//! The snapshot a user names: `start`, `end`, an offset, a local time or an index.

use super::Recording;

impl Recording {
    /// The snapshot a user means by `spec`: `start`, `end`, `+30s` (after the first snapshot),
    /// `-10s` (before the last), `12:03` or `12:03:10` (local time), `#N` (index). A time
    /// between two snapshots means the last one taken at or before it.
    pub fn find(&self, spec: &str) -> Result<usize, String> {
        let spec = spec.trim();
        let last = self.len() - 1;
        let (first_mono, first_wall) = self.times(0);
        let (last_mono, _) = self.times(last);
        let at_or_before = |pick: &dyn Fn(usize) -> u64, t: u64| -> Result<usize, String> {
            let n = (0..self.len()).take_while(|&i| pick(i) <= t).count();
            n.checked_sub(1)
                .ok_or_else(|| format!("'{spec}' is before the recording starts"))
        };
        let mono = |i: usize| self.times(i).0;
        match spec {
            "start" => return Ok(0),
            "end" => return Ok(last),
            _ => {}
        }
        if let Some(n) = spec.strip_prefix('#') {
            let n: usize = n
                .parse()
                .map_err(|_| format!("'{spec}': # takes a snapshot number"))?;
            return if n <= last {
                Ok(n)
            } else {
                Err(format!(
                    "'{spec}': the recording has {} snapshots",
                    last + 1
                ))
            };
        }
        if let Some(d) = spec.strip_prefix('+') {
            let d = crate::time::parse_duration(d)?;
            // The snapshot nearest to the time asked for, not one interval early.
            let t = first_mono
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .saturating_add(self.info.interval_ns / 2);
            if t > last_mono + self.info.interval_ns {
                return Err(format!(
                    "'{spec}' is after the recording ends (+{})",
                    crate::time::format_duration(std::time::Duration::from_nanos(
                        last_mono - first_mono
                    ))
                ));
            }
            return at_or_before(&mono, t);
        }
        if let Some(d) = spec.strip_prefix('-') {
            let d = crate::time::parse_duration(d)?;
            let t = last_mono
                .checked_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .ok_or_else(|| format!("'{spec}' is before the recording starts"))?
                .saturating_add(self.info.interval_ns / 2);
            return at_or_before(&mono, t);
        }
        let parts: Vec<&str> = spec.split(':').collect();
        let nums: Option<Vec<u64>> = parts.iter().map(|p| p.parse().ok()).collect();
        match nums.as_deref() {
            Some(&[h, m] | &[h, m, _]) if h < 24 && m < 60 => {
                let s = if parts.len() == 3 {
                    nums.as_ref().map_or(0, |n| n[2])
                } else {
                    0
                };
                if s >= 60 {
                    return Err(format!("'{spec}' is not a time of day"));
                }
                let (start_of_day, midnight) = crate::time::local_day(first_wall);
                let mut secs = h * 3600 + m * 60 + s;
                // A time earlier in the day than the start means the next day.
                if secs < start_of_day {
                    secs += 86_400;
                }
                let wall = |i: usize| self.times(i).1;
                let target = midnight + secs * 1_000_000_000;
                if target > wall(last) + self.info.interval_ns {
                    return Err(format!(
                        "'{spec}' is outside the recording ({} to {})",
                        crate::time::local_hms(first_wall),
                        crate::time::local_hms(wall(last))
                    ));
                }
                at_or_before(&wall, target + 999_999_999)
            }
            _ => Err(format!(
                "'{spec}' is not a time (examples: +30s, -10s, 12:03:10, start, end, #5)"
            )),
        }
    }
}

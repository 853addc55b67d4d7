//! The kernel's CPU lists (`0-3,5,7-8`): the online CPUs, the possible ones (what per-CPU maps
//! are sized for), the nohz_full ones. One parser for all of them.

/// A kernel cpulist (`0-3,5,7-8`; `(null)` or empty for none). A range over 65,536 CPUs or
/// backwards is refused, not expanded.
pub fn parse_list(text: &str) -> Result<Vec<u32>, String> {
    let text = text.trim();
    if text.is_empty() || text == "(null)" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in text.split(',') {
        let bad = || format!("'{text}' is not a CPU list");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 65_536 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(out)
}

/// The CPUs of the list in `path`, `None` where it is unreadable, malformed or empty.
fn read_list(path: &str) -> Option<Vec<u32>> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| parse_list(&text).ok())
        .filter(|cpus| !cpus.is_empty())
}

/// The online CPUs; CPU 0 if the list is unreadable.
#[must_use]
pub fn online() -> Vec<usize> {
    read_list("/sys/devices/system/cpu/online").map_or_else(
        || vec![0],
        |cpus| cpus.into_iter().map(|c| c as usize).collect(),
    )
}

/// One past the highest possible CPU's number: an array indexed by CPU number needs that many
/// entries (the possible CPUs may be numbered with gaps).
#[must_use]
pub fn possible_numbers() -> u64 {
    read_list("/sys/devices/system/cpu/possible")
        .and_then(|cpus| cpus.into_iter().max())
        .map_or_else(possible, |highest| u64::from(highest) + 1)
}

/// How many CPUs the kernel sizes per-CPU maps for: the possible ones, often more than are
/// online (a VM that may hot-add CPUs).
#[must_use]
pub fn possible() -> u64 {
    read_list("/sys/devices/system/cpu/possible")
        .map_or_else(
            || {
                // SAFETY: sysconf has no memory effects.
                u64::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(1)
            },
            |cpus| cpus.len() as u64,
        )
        .max(1)
}

/// The nohz_full CPUs (none where the kernel has no such list).
#[must_use]
pub fn nohz_full() -> Vec<u32> {
    read_list("/sys/devices/system/cpu/nohz_full").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::parse_list;

    #[test]
    fn lists_parse() {
        assert_eq!(parse_list("(null)\n"), Ok(vec![]));
        assert_eq!(parse_list(""), Ok(vec![]));
        assert_eq!(parse_list("1\n"), Ok(vec![1]));
        assert_eq!(parse_list("0-1\n"), Ok(vec![0, 1]));
        assert_eq!(parse_list("0-2,5,7-8"), Ok(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_list("0-3,8-11").map(|c| c.len()), Ok(8));
        assert!(parse_list("3-1").is_err());
        assert!(parse_list("a").is_err());
        assert!(parse_list("x").is_err());
        assert!(parse_list("0-4000000000").is_err());
    }
}

//! `perf-PID.map` files: the symbols a just-in-time compiler (a JVM with perf-map-agent,
//! Node's `--perf-basic-prof`, .NET, LuaJIT, Python's `-X perf`) writes for the code it
//! generated, one `START SIZE name` line each (hexadecimal, `0x` optional), in `/tmp` of the
//! process's own mount namespace, named by its pid there.

use std::path::PathBuf;

/// One JIT symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// Where process `tgid`'s perf map is, seen from here: its `/tmp` through its root (another
/// mount namespace: a container), named by its innermost pid (`NSpid`).
#[must_use]
pub fn path(tgid: u32) -> PathBuf {
    let inner = std::fs::read_to_string(format!("/proc/{tgid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|l| l.split_whitespace().last().map(str::to_owned))
        })
        .unwrap_or_else(|| tgid.to_string());
    PathBuf::from(format!("/proc/{tgid}/root/tmp/perf-{inner}.map"))
}

/// Parses a perf map, sorted by start; lines it cannot read are skipped.
#[must_use]
pub fn parse(text: &str) -> Vec<Symbol> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut out: Vec<Symbol> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            let name = parts.next()?.trim();
            (!name.is_empty()).then(|| Symbol {
                start,
                size,
                name: name.to_owned(),
            })
        })
        .collect();
    out.sort_by_key(|s| s.start);
    out
}

/// The symbol holding `addr`; of overlapping ones (code regenerated at the same place) the
/// one written last.
#[must_use]
pub fn find(symbols: &[Symbol], addr: u64) -> Option<&Symbol> {
    symbols
        .iter()
        .filter(|s| s.start <= addr && addr - s.start < s.size.max(1))
        .max_by_key(|s| s.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lines_with_and_without_0x() {
        let symbols = parse(
            "7f0000001000 40 LazyCompile:~handler app.js:10\n\
             0x7f0000002000 0x20 Interpreter\n\
             garbage line\n\
             7f0000003000 10 \n",
        );
        assert_eq!(symbols.len(), 2, "{symbols:?}");
        assert_eq!(
            find(&symbols, 0x7f00_0000_1010).map(|s| s.name.as_str()),
            Some("LazyCompile:~handler app.js:10")
        );
        assert_eq!(
            find(&symbols, 0x7f00_0000_201f).map(|s| s.name.as_str()),
            Some("Interpreter")
        );
        assert_eq!(find(&symbols, 0x7f00_0000_2020), None);
        assert_eq!(find(&symbols, 0x10), None);
    }

    #[test]
    fn own_process_path_uses_its_pid() {
        let pid = std::process::id();
        assert_eq!(
            path(pid),
            PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{pid}.map"))
        );
    }
}

//! The standard `process_*` metrics of latprof's own process (the names every Prometheus
//! client library exports), read from /proc at each scrape, and `latprof_build_info`: a fleet
//! watches latprof's own cost and versions the way it watches any exporter's.

use std::fmt::Write as _;

use super::{Flavor, family_in, label};

/// latprof's own process, as /proc/self says it now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Process {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    /// When it started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: u64,
}

impl Process {
    /// This process, now; `None` where /proc cannot say (not mounted).
    #[must_use]
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let btime: u64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        // SAFETY: sysconf and getrlimit only read; the rlimit is written into our own value.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0 {
            limit.rlim_cur
        } else {
            0
        };
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        Self::of_stat(
            &stat,
            btime,
            u64::try_from(ticks).ok()?,
            u64::try_from(page).ok()?,
        )
        .map(|p| Self {
            open_fds,
            max_fds,
            ..p
        })
    }

    /// The times and sizes in a /proc/PID/stat line: `btime` is the boot time (seconds since
    /// the epoch), `ticks` the clock ticks per second, `page` the page size.
    #[expect(
        clippy::cast_precision_loss,
        reason = "seconds as floats, as Prometheus keeps them"
    )]
    fn of_stat(stat: &str, btime: u64, ticks: u64, page: u64) -> Option<Self> {
        // The name, in parentheses, may hold spaces and parentheses: fields follow the last.
        let (_, rest) = stat.rsplit_once(") ")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Fields from the state (field 3 of proc(5)): utime 14, stime 15, starttime 22,
        // vsize 23, rss 24.
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        let ticks = ticks.max(1);
        Some(Self {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks as f64,
            resident_bytes: field(24)? * page,
            virtual_bytes: field(23)?,
            start_time_seconds: btime as f64 + field(22)? as f64 / ticks as f64,
            open_fds: 0,
            max_fds: 0,
        })
    }
}

/// The `process_*` families of `p`, and `latprof_build_info`.
pub(super) fn render(out: &mut String, p: Option<&Process>, flavor: Flavor) {
    if let Some(p) = p {
        let metrics: [(&str, &str, Option<&str>, &str, String); 6] = [
            (
                "process_cpu_seconds",
                "counter",
                Some("seconds"),
                "Total user and system CPU time spent in seconds.",
                p.cpu_seconds.to_string(),
            ),
            (
                "process_resident_memory_bytes",
                "gauge",
                Some("bytes"),
                "Resident memory size in bytes.",
                p.resident_bytes.to_string(),
            ),
            (
                "process_virtual_memory_bytes",
                "gauge",
                Some("bytes"),
                "Virtual memory size in bytes.",
                p.virtual_bytes.to_string(),
            ),
            (
                "process_start_time_seconds",
                "gauge",
                Some("seconds"),
                "Start time of the process since unix epoch in seconds.",
                p.start_time_seconds.to_string(),
            ),
            (
                "process_open_fds",
                "gauge",
                None,
                "Number of open file descriptors.",
                p.open_fds.to_string(),
            ),
            (
                "process_max_fds",
                "gauge",
                None,
                "Maximum number of open file descriptors.",
                p.max_fds.to_string(),
            ),
        ];
        for (name, kind, unit, help, value) in metrics {
            family_in(flavor, out, name, kind, unit, help);
            let sample = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            let _ = writeln!(out, "{sample} {value}");
        }
    }
    family_in(
        flavor,
        out,
        "latprof_build_info",
        "gauge",
        None,
        "latprof's version and the git commit it was built from (1).",
    );
    let _ = writeln!(
        out,
        "latprof_build_info{{version=\"{}\",revision=\"{}\"}} 1",
        label(env!("CARGO_PKG_VERSION")),
        label(env!("LATPROF_REVISION"))
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_times_and_sizes() {
        // A name with spaces and a parenthesis, as any process may give itself.
        let stat = "4242 (latprof (x) y) S 1 4242 4242 0 -1 4194560 5000 0 0 0 \
                    250 50 0 0 20 0 3 0 1000 104857600 2560 18446744073709551615";
        let p = Process::of_stat(stat, 1_700_000_000, 100, 4096).expect("parsed");
        assert!((p.cpu_seconds - 3.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.resident_bytes, 2560 * 4096);
        assert_eq!(p.virtual_bytes, 104_857_600);
        assert!(
            (p.start_time_seconds - 1_700_000_010.0).abs() < 1e-6,
            "{p:?}"
        );
        assert_eq!(Process::of_stat("garbage", 0, 100, 4096), None);
    }

    #[test]
    fn this_process_is_read() {
        let p = Process::now().expect("/proc");
        assert!(
            p.resident_bytes > 0 && p.open_fds > 0 && p.max_fds >= p.open_fds,
            "{p:?}"
        );
        let mut out = String::new();
        render(&mut out, Some(&p), Flavor::Prometheus);
        assert!(out.contains("\nprocess_cpu_seconds_total "), "{out}");
        assert!(out.contains("latprof_build_info{version=\""), "{out}");
    }
}

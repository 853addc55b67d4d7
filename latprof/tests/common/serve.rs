//! `latprof serve` run by a test: the real binary on a free loopback port, and a minimal
//! HTTP client of the test's own.
use std::{
    io::{BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, ChildStderr, Command, Stdio},
    time::{Duration, Instant},
};

use super::LATPROF;

/// The reason of a nanosleep.
pub const NANOSLEEP: &str = "Application requested delay";

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A directory of the test's own under the system's temporary one.
pub fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "latprof-serve-{what}-{}-{}",
        std::process::id(),
        latprof::time::monotonic_ns()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// An HTTP answer.
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A test's own minimal HTTP/1.1 client (one request, `Connection: close`).
pub fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Reply {
    let accept = accept.map(|a| ("Accept", a));
    request(addr, path, accept.as_slice())
}

/// A GET of `path` with `headers` (one request, `Connection: close`).
pub fn request(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let headers = headers
        .iter()
        .fold(String::new(), |mut out, (name, value)| {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
            out
        });
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    )
    .expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read reply");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut out = Vec::new();
        let mut rest = body.as_slice();
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("chunk size");
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..eol])
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )
            .expect("chunk size");
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = out;
    }
    Reply {
        status,
        content_type: header("content-type").unwrap_or_default(),
        body,
    }
}

/// A running `latprof serve`; killed if a test leaves it running.
pub struct Serve {
    child: Option<Child>,
    pub addr: SocketAddr,
    stderr: Option<BufReader<ChildStderr>>,
}

impl Serve {
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_fd_limit(args, None)
    }

    /// As `start`, under a soft and hard RLIMIT_NOFILE of `nofile` where given.
    pub fn start_with_fd_limit(args: &[&str], nofile: Option<u64>) -> Self {
        use std::os::unix::process::CommandExt as _;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut cmd = Command::new(LATPROF);
        cmd.args(["serve", "--listen", &addr.to_string()])
            .args(args)
            .stdout(Stdio::null());
        if let Some(n) = nofile {
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe; it runs in the child before exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let (child, stderr) = super::start(&mut cmd, "serving");
        Self {
            child: Some(child),
            addr,
            stderr: Some(stderr),
        }
    }

    /// A `latprof serve` started by the test's own command line (`super::start`), listening
    /// on `addr`.
    pub fn adopt(child: Child, stderr: BufReader<ChildStderr>, addr: SocketAddr) -> Self {
        Self {
            child: Some(child),
            addr,
            stderr: Some(stderr),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn get(&self, path: &str) -> Reply {
        http_get(self.addr, path, None)
    }

    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
    }

    /// Polls /metrics until `done` holds for it; fails after `secs` with the last text.
    pub fn wait_for(&self, secs: u64, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.metrics();
            if done(&text) {
                return text;
            }
            if Instant::now() >= deadline {
                // The histograms' buckets left out: a log keeps the counters whole.
                let short: Vec<&str> = text.lines().filter(|l| !l.contains("_bucket{")).collect();
                panic!("{what} not seen in {secs}s:\n{}", short.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends `signal`; returns the exit status and what latprof wrote to stderr after its
    /// first line.
    pub fn stop(mut self, signal: i32) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let status = child.wait().expect("wait for latprof serve");
        let mut rest = String::new();
        if let Some(mut stderr) = self.stderr.take() {
            let _ = stderr.read_to_string(&mut rest);
        }
        (status, rest)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The value of the sample named exactly `series` (name and labels as rendered) in a text
/// exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "counts exposed as floats, far below 2^52"
)]
pub fn count(text: &str, series: &str) -> u64 {
    sample(text, series).map_or(0, |v| v as u64)
}

/// Sleeps the metrics say were lost or recovered without their backtrace; accepted only
/// where the kernel hid switches and the check of each against the hidden switches explained
/// them all (as `common::lost_where_hidden`).
pub fn missing(metrics: &str) -> u64 {
    check_hidden(metrics);
    missing_so_far(metrics)
}

/// The sleeps lost or recovered without a backtrace so far, unchecked: for polls, where a
/// sleep may still wait for its verdict (`missing` checks it once the wait is over).
pub fn missing_so_far(metrics: &str) -> u64 {
    count(
        metrics,
        "latprof_pipeline_events_total{counter=\"sleep_lost\"}",
    ) + count(
        metrics,
        // Under 1 us: not counted (`common::under_1us`); every serve here traces one pid.
        "latprof_pipeline_events_total{counter=\"skipped_zero\"}",
    ) + count(
        metrics,
        "latprof_sleeps_total{reason=\"[wakeup hidden from tracing]\",state=\"SD\"}",
    )
}

/// Every sleep lost or recovered overlapped a stretch where the kernel hid switches (latprof
/// checks each one and exports the verdicts), as `common::lost_where_hidden` requires.
pub fn check_hidden(metrics: &str) {
    let c = |name: &str| {
        let series = format!("latprof_pipeline_events_total{{counter=\"{name}\"}}");
        assert!(
            sample(metrics, &series).is_some(),
            "no {series} in\n{metrics}"
        );
        count(metrics, &series)
    };
    let (lost, recovered, hidden) = (c("sleep_lost"), c("sleeps_recovered"), c("switches_hidden"));
    let (explained, unexplained) = (c("hidden_sleeps_explained"), c("hidden_sleeps_unexplained"));
    assert!(
        sample(metrics, "latprof_hidden_sleeps_waiting").is_some(),
        "no latprof_hidden_sleeps_waiting in\n{metrics}"
    );
    let waiting = count(metrics, "latprof_hidden_sleeps_waiting");
    assert_eq!(
        (unexplained, waiting, c("hidden_log_full")),
        (0, 0, 0),
        "sleeps lost or recovered that no hidden switch explains (unexplained, waiting, log full)"
    );
    assert!(
        explained >= lost + recovered,
        "{lost} lost and {recovered} recovered, {explained} checked"
    );
    assert!(
        lost + recovered == 0 || hidden > 0,
        "{lost} sleeps lost and {recovered} recovered but no switch was hidden"
    );
}

pub fn nanosleeps(metrics: &str) -> u64 {
    count(
        metrics,
        &format!("latprof_sleeps_total{{reason=\"{NANOSLEEP}\",state=\"S\"}}"),
    )
}

/// A Prometheus server of the test's own, scraping `targets` every second (job `latprof`).
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    pub fn start(targets: &[SocketAddr]) -> Self {
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let dir = temp_dir("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: latprof\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("log file"))
            .spawn()
            .expect("prometheus (cargo xtask test installs Debian's prometheus package)");
        let p = Self { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(p.addr).is_err()
            || http_get(p.addr, "/-/ready", None).status != 200
        {
            assert!(
                Instant::now() < deadline,
                "prometheus did not get ready: {}",
                std::fs::read_to_string(p.dir.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// An instant query's samples: (labels, value).
    pub fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let encoded = query_encoded(promql);
        let r = http_get(self.addr, &format!("/api/v1/query?query={encoded}"), None);
        assert_eq!(r.status, 200, "query {promql}: {}", r.text());
        let json: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
        json["data"]["result"]
            .as_array()
            .expect("result")
            .iter()
            .map(|s| {
                let v = s["value"][1]
                    .as_str()
                    .expect("value")
                    .parse()
                    .expect("number");
                (s["metric"].clone(), v)
            })
            .collect()
    }

    /// The single value of `promql`, if it has one.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "counts as floats, far below 2^52"
    )]
    pub fn value(&self, promql: &str) -> Option<u64> {
        let samples = self.query(promql);
        assert!(samples.len() <= 1, "{promql}: {samples:?}");
        samples.first().map(|(_, v)| *v as u64)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `promql` percent-encoded for a query string (RFC 3986's unreserved bytes kept).
pub fn query_encoded(promql: &str) -> String {
    promql
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

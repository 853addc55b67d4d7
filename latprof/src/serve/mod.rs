//! `latprof serve`'s HTTP side: the routes and their answers. Handlers render the latest
//! value the collection published ([`state::Published`]); none of them waits for the
//! collection or holds anything it needs, so a slow, stuck or numerous client cannot stall it.
pub mod cgroup_series;
pub mod chains;
pub mod conn;
pub mod losses;
pub mod peer;
pub mod pulls;
pub mod rendered;
pub mod retire;
pub mod state;
mod tables;
mod threads;

use std::{sync::Arc, time::Duration};

use axum::{
    Extension, Router,
    extract::{RawQuery, State},
    http::{HeaderMap, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::sync::watch;

use crate::export::openmetrics::{self, Flavor};
use state::{MAX_SECONDS, Published};

/// What every handler shares.
#[derive(Clone)]
pub struct Shared {
    pub latest: watch::Receiver<Arc<Published>>,
    /// How often the collection reads; /healthz fails when the latest read is much older.
    pub interval: Duration,
    /// Each scraper's previous profile pull.
    pub pulls: Arc<pulls::Pulls>,
}

impl Shared {
    fn latest(&self) -> Arc<Published> {
        Arc::clone(&self.latest.borrow())
    }
}

/// Where the collection publishes and the handlers read.
pub struct Publisher(watch::Sender<Arc<Published>>);

impl Publisher {
    /// Replaces what the handlers answer from; never waits for them.
    pub fn publish(&self, value: Published) {
        self.0.send_replace(Arc::new(value));
    }
}

/// A publisher and what the handlers share, starting from `first`.
#[must_use]
pub fn channel(first: Published, interval: Duration) -> (Publisher, Shared) {
    let (tx, rx) = watch::channel(Arc::new(first));
    (
        Publisher(tx),
        Shared {
            latest: rx,
            interval,
            pulls: Arc::default(),
        },
    )
}

/// The HTTP server on its own threads (two workers: the answers are small), and at most
/// [`BLOCKING_THREADS`] building profiles and finding peers: a flood of pulls waits for them
/// instead of starting hundreds of threads (the unit's `TasksMax=` holds all of latprof's).
pub struct Server {
    runtime: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Threads for the HTTP server's blocking work (tokio's default is 512).
const BLOCKING_THREADS: usize = 8;

impl Server {
    /// Builds the runtime; nothing is served until [`Server::serve`].
    pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
        use anyhow::Context as _;
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(BLOCKING_THREADS)
            .thread_name("latprof-http")
            .enable_io()
            .enable_time()
            .build()
            .context("start the HTTP runtime")
    }

    /// Serves the routes on `listener` (already bound: a port in use was said before anything
    /// else started).
    pub fn serve(
        runtime: tokio::runtime::Runtime,
        listener: std::net::TcpListener,
        shared: Shared,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        listener
            .set_nonblocking(true)
            .context("set the listener non-blocking")?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener).context("listen")?
        };
        let app = router(shared);
        // The cap is taken from the descriptors left now, with the programs loaded.
        let limits = conn::Limits::for_this_process();
        let task = runtime.spawn(conn::serve(listener, app, limits));
        Ok(Self { runtime, task })
    }

    /// Whether the server ended (it only does on an error of the listener).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops serving: connections still open are cut (their tasks go with the accept loop's),
    /// so no client keeps latprof up.
    pub fn stop(self) {
        self.task.abort();
        self.runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

/// The routes.
pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/debug/pprof/offcpu", get(offcpu))
        .fallback(not_found)
        .with_state(shared)
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

const INDEX: &str = "<!DOCTYPE html>
<html><head><title>latprof</title></head><body>
<h1>latprof serve</h1>
<ul>
<li><a href=\"/metrics\">/metrics</a>: Prometheus metrics (OpenMetrics 1.0 when the Accept header asks for application/openmetrics-text, else Prometheus text 0.0.4)</li>
<li><a href=\"/debug/pprof/offcpu?seconds=10\">/debug/pprof/offcpu?seconds=N</a>: the sleeps that ended since this scraper's previous pull (its first: in the last N seconds, from one --interval to 300, default 10) as a gzipped pprof profile</li>
<li><a href=\"/healthz\">/healthz</a>: ok while the kernel's tables are being read</li>
</ul>
</body></html>
";

async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

async fn healthz(State(shared): State<Shared>) -> Response {
    let age_ns = crate::time::monotonic_ns().saturating_sub(shared.latest().taken_ns);
    let limit = (shared.interval * 3).max(Duration::from_secs(5));
    if Duration::from_nanos(age_ns) > limit {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stale: the last read of the kernel's tables was {} ago\n",
                crate::time::format_duration(Duration::from_nanos(age_ns))
            ),
        );
    }
    text(StatusCode::OK, "ok\n".to_owned())
}

async fn metrics(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    let flavor = Flavor::accepting(
        headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
    );
    let latest = shared.latest();
    let process = openmetrics::Process::now();
    let answer = latest
        .rendered
        .metrics(&latest.live, process.as_ref(), flavor);
    (
        [(header::CONTENT_TYPE, flavor.content_type())],
        axum::body::Body::new(answer),
    )
        .into_response()
}

/// The fewest `seconds` a profile may ask for: one read of the kernel's tables (`--interval`,
/// in whole seconds rounded up). A shorter span would hold no read, or one that covers more
/// than asked.
#[must_use]
pub fn min_seconds(interval: Duration) -> u32 {
    let ceil = interval.as_secs() + u64::from(interval.subsec_nanos() > 0);
    u32::try_from(ceil)
        .unwrap_or(MAX_SECONDS)
        .clamp(1, MAX_SECONDS)
}

/// A query's key or value, percent-decoded.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// `seconds` of `/debug/pprof/offcpu` from its query, percent-decoded (other keys are
/// ignored, as Go's handlers ignore them, and so are later `seconds`, as Go's `FormValue`
/// takes the first: Parca can send it twice), from `min` to [`MAX_SECONDS`].
pub fn profile_seconds(query: Option<&str>, min: u32) -> Result<u32, String> {
    let first = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| decode(key) == "seconds");
    let Some((_, value)) = first else {
        return Ok(10.max(min));
    };
    let value = decode(value);
    let max = MAX_SECONDS;
    value
        .parse::<u32>()
        .ok()
        .filter(|s| (min..=max).contains(s))
        .ok_or_else(|| {
            let shown: String = crate::text::printable(&value).chars().take(40).collect();
            let why = if min > 1 {
                format!(" (one read of the kernel's tables every {min}s)")
            } else {
                String::new()
            };
            format!("seconds must be a whole number from {min} to {max}{why}, not '{shown}'")
        })
}

/// The sleeps that ended since this scraper's previous pull (`pulls`), or in the last
/// `seconds` for its first.
async fn offcpu(
    State(shared): State<Shared>,
    RawQuery(query): RawQuery,
    peer: Option<Extension<peer::Peer>>,
    headers: HeaderMap,
) -> Response {
    let seconds = match profile_seconds(query.as_deref(), min_seconds(shared.interval)) {
        Ok(s) => s,
        Err(why) => return text(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let name = pulls::scraper_name(query.as_deref(), agent);
    let peer = peer.map(|Extension(p)| p).unwrap_or_default();
    // The kernel's socket tables: read off the threads that answer the other requests.
    let identity = tokio::task::spawn_blocking(move || peer.identity())
        .await
        .unwrap_or_else(|_| "?".to_owned());
    let latest = shared.latest();
    let now = crate::time::monotonic_ns();
    let span = shared.pulls.next(
        &identity,
        &name,
        seconds,
        now,
        latest.window_from_ns(),
        latest.taken_ns,
    );
    // Encoding is CPU work: off the threads that answer the other requests.
    match tokio::task::spawn_blocking(move || latest.profile(span.after_ns)).await {
        Ok(body) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"offcpu.pb.gz\"",
                ),
            ],
            body,
        )
            .into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("profile failed: {e}\n"),
        ),
    }
}

async fn not_found(uri: Uri) -> Response {
    let path: String = crate::text::printable(uri.path())
        .chars()
        .take(200)
        .collect();
    text(
        StatusCode::NOT_FOUND,
        format!("not found: {path} (/ lists the endpoints)\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_seconds_are_checked() {
        assert_eq!(profile_seconds(None, 1), Ok(10));
        assert_eq!(profile_seconds(Some("seconds=30"), 1), Ok(30));
        assert_eq!(profile_seconds(Some("debug=1&seconds=300"), 1), Ok(300));
        // Percent-encoded, as any URL may be.
        assert_eq!(profile_seconds(Some("seconds=%33%30"), 1), Ok(30));
        assert_eq!(profile_seconds(Some("%73econds=7"), 1), Ok(7));
        // The first seconds only (Parca can repeat it).
        assert_eq!(profile_seconds(Some("seconds=10&seconds=x"), 1), Ok(10));
        for bad in [
            "seconds=0",
            "seconds=301",
            "seconds=-1",
            "seconds=ten",
            "seconds=",
            "seconds=%ff%00",
            "seconds=1%00",
        ] {
            assert!(profile_seconds(Some(bad), 1).is_err(), "{bad}");
        }
        let long = format!("seconds={}", "9".repeat(1000));
        let why = profile_seconds(Some(&long), 1).unwrap_err();
        assert!(why.len() < 160, "{why}");
        assert!(!why.contains('\0'), "{why}");
        // Reads every 5 s: no profile shorter than one read, and the default is at least one.
        assert_eq!(profile_seconds(Some("seconds=5"), 5), Ok(5));
        assert_eq!(profile_seconds(None, 15), Ok(15));
        let why = profile_seconds(Some("seconds=4"), 5).unwrap_err();
        assert!(why.contains("from 5 to 300"), "{why}");
    }

    /// /healthz: 200 while the latest read is recent, 503 with one line once it is more than
    /// three intervals (at least 5 s) old.
    #[test]
    fn healthz_fails_when_reads_stop() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let now = crate::time::monotonic_ns();
        let answer = |taken_ns: u64| {
            let (_publisher, shared) = channel(
                Published {
                    taken_ns,
                    ..Published::default()
                },
                Duration::from_secs(1),
            );
            runtime.block_on(healthz(State(shared))).status()
        };
        assert_eq!(answer(now), StatusCode::OK);
        // 5 s is the cutoff at a 1 s interval: a test thread stalled for a second or two on a
        // busy machine must not move either answer across it.
        assert_eq!(answer(now.saturating_sub(2_000_000_000)), StatusCode::OK);
        assert_eq!(
            answer(now.saturating_sub(10_000_000_000)),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn the_shortest_profile_is_one_read() {
        assert_eq!(min_seconds(Duration::from_millis(100)), 1);
        assert_eq!(min_seconds(Duration::from_secs(1)), 1);
        assert_eq!(min_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(min_seconds(Duration::from_secs(60)), 60);
    }

    #[test]
    fn openmetrics_only_when_asked() {
        assert_eq!(
            Flavor::accepting(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            ),
            Flavor::OpenMetrics
        );
        // What Prometheus sends.
        assert_eq!(
            Flavor::accepting(
                "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
            ),
            Flavor::OpenMetrics
        );
        assert_eq!(Flavor::accepting("*/*"), Flavor::Prometheus);
        assert_eq!(Flavor::accepting(""), Flavor::Prometheus);
        // q=0: not acceptable; a lower q than text's: text preferred.
        assert_eq!(
            Flavor::accepting("application/openmetrics-text;q=0,text/plain"),
            Flavor::Prometheus
        );
        assert_eq!(
            Flavor::accepting("application/openmetrics-text; q=0.0"),
            Flavor::Prometheus
        );
        assert_eq!(
            Flavor::accepting("text/plain;q=0.9, application/openmetrics-text;q=0.1"),
            Flavor::Prometheus
        );
        assert_eq!(
            Flavor::accepting("Application/OpenMetrics-Text; Q=0.5, text/plain;q=0.4"),
            Flavor::OpenMetrics
        );
        // A q that is no number counts as 1 (as if absent).
        assert_eq!(
            Flavor::accepting("application/openmetrics-text;q=x"),
            Flavor::OpenMetrics
        );
    }
}

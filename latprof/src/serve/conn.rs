//! `latprof serve`'s connections: the accept loop and what bounds each connection, so that
//! clients who connect and send nothing, or send a request one byte at a time (slowloris),
//! cannot take the descriptors a scrape needs (issue 29, N9).
//!
//! - At most [`Limits::cap`] connections (64, fewer where the descriptor limit would leave
//!   less than [`RESERVE_FDS`] descriptors for latprof itself). One more is accepted
//!   and, at once, the connection quiet the longest that has no request in flight is closed:
//!   an idle one, or one still sending its headers (a slowloris never reaches the service),
//!   quiet for at least [`Limits::quiet`] (by the kernel's count, which includes the time a
//!   connection waited in the listen queue). A connection whose request waits unread in its
//!   socket is spared for [`Limits::stuck`]. Where none can go, accepting waits (the listen
//!   queue holds the newcomers) until one ends or can go.
//! - A request's headers must be complete within [`Limits::header_timeout`] of the connection
//!   opening or of its previous answer (hyper's header timer, which runs while a connection
//!   waits for its next request); a connection with no request in flight for
//!   [`Limits::idle_timeout`] is closed whatever hyper waits for (an answer that the client
//!   does not read included).
//! - No connection lives longer than [`Limits::lifetime`]: then it takes no new request, and
//!   one still answering is cut [`Limits::linger`] later.
//! - Out of descriptors (EMFILE), accepting does not spin: it frees one where a connection
//!   can go and waits a little.
use std::{
    collections::HashMap,
    convert::Infallible,
    os::fd::{AsRawFd as _, RawFd},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{Router, body::Body};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpStream},
    task::{AbortHandle, Id, JoinError, JoinSet},
    time::Instant,
};

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Descriptors the cap leaves free for latprof itself: the collection's reads of /proc and of
/// binaries, the listener's next accept.
pub const RESERVE_FDS: u64 = 32;

/// The fewest connections the cap allows, however low the descriptor limit.
const MIN_CONNECTIONS: usize = 4;

/// What bounds the connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once (one more only while one is being closed for it).
    pub cap: usize,
    /// Request headers complete within this of the connection's opening or previous answer.
    pub header_timeout: Duration,
    /// No request in flight for this long: closed.
    pub idle_timeout: Duration,
    /// The longest a connection lives.
    pub lifetime: Duration,
    /// How long an answer in flight at `lifetime` may still take.
    pub linger: Duration,
    /// At the cap, a connection quiet this long with no request in flight may be closed.
    pub quiet: Duration,
    /// ... and one whose request waits unread in its socket, after this long.
    pub stuck: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            cap: MAX_CONNECTIONS,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(120),
            linger: Duration::from_secs(10),
            quiet: Duration::from_millis(100),
            stuck: Duration::from_secs(2),
        }
    }
}

impl Limits {
    /// The defaults, with the cap this process's descriptor limit leaves room for.
    #[must_use]
    pub fn for_this_process() -> Self {
        Self {
            cap: cap_for(fd_limit(), fds_in_use()),
            ..Self::default()
        }
    }

    /// How often a connection looks at its clocks.
    fn tick(&self) -> Duration {
        (self.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// The cap under a descriptor limit of `limit` with `in_use` open: [`MAX_CONNECTIONS`] where
/// that leaves [`RESERVE_FDS`] free, fewer where not (at least [`MIN_CONNECTIONS`]).
#[must_use]
pub fn cap_for(limit: u64, in_use: u64) -> usize {
    // One more than the cap is open while one is being closed for it.
    let room = limit.saturating_sub(in_use).saturating_sub(RESERVE_FDS + 1);
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// RLIMIT_NOFILE's soft limit (1024 where it cannot be read).
fn fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    }
}

/// Descriptors open now.
fn fds_in_use() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// What a connection's task tells the accept loop and its own watchdog.
struct Activity {
    /// Requests being answered (from their headers to the end of their answer's body).
    in_flight: AtomicU32,
    /// Requests begun.
    requests: AtomicU64,
    /// CLOCK_MONOTONIC of the accept, or of the latest start or end of a request.
    last_ns: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            last_ns: AtomicU64::new(crate::time::monotonic_ns()),
        }
    }

    /// How long it has had no request in flight (zero while it has one).
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(
            crate::time::monotonic_ns().saturating_sub(self.last_ns.load(Ordering::Acquire)),
        )
    }
}

/// A request in flight, from its headers until its answer's body is dropped (sent, or the
/// connection gone).
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.requests.fetch_add(1, Ordering::AcqRel);
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity
            .last_ns
            .store(crate::time::monotonic_ns(), Ordering::Release);
        Self(Arc::clone(activity))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .last_ns
            .store(crate::time::monotonic_ns(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request in flight until hyper drops it.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// One open connection, as the accept loop sees it.
struct Open {
    fd: RawFd,
    activity: Arc<Activity>,
    abort: AbortHandle,
}

impl Open {
    /// How long it has been quiet where it may be closed for a newcomer; `None` while it must
    /// stay (a request in flight, or one that came in just now).
    fn quiet_for(&self, limits: &Limits) -> Option<Duration> {
        let a = &self.activity;
        if a.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = a.idle_for();
        if unread(self.fd) > 0 {
            // A request waits in the socket for hyper to read it (a busy runtime), or a client
            // that pipelines and never reads its answers: hyper reads no more.
            return (since >= limits.stuck).then_some(since);
        }
        // The kernel counts from the handshake (the time in the listen queue included) or
        // from the latest byte: a slowloris's bytes keep it at most as long as they come.
        let kernel = last_data_received(self.fd).unwrap_or(since);
        let quiet = if a.requests.load(Ordering::Acquire) == 0 {
            kernel
        } else {
            kernel.min(since)
        };
        (quiet >= limits.quiet).then_some(quiet)
    }
}

/// Bytes received and not read yet (0 where unknown).
fn unread(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; a closed or reused descriptor only answers wrong.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &raw mut n) };
    if rc == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// How long since the peer's last data (since the handshake where it sent none).
fn last_data_received(fd: RawFd) -> Option<Duration> {
    // SAFETY: tcp_info is plain integers; all zeros is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(size_of::<libc::tcp_info>()).ok()?;
    // SAFETY: getsockopt writes at most `len` bytes into `info`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    (rc == 0).then(|| Duration::from_millis(u64::from(info.tcpi_last_data_recv)))
}

/// The connection to close for a newcomer: the quietest that may go.
fn victim(open: &HashMap<Id, Open>, limits: &Limits) -> Option<Id> {
    open.iter()
        .filter_map(|(id, o)| o.quiet_for(limits).map(|q| (q, *id)))
        .max_by_key(|(q, _)| *q)
        .map(|(_, id)| id)
}

/// Whether an accept failed for want of descriptors or memory (the connection stays queued).
fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Whether an accept failed for that connection only (gone before it was taken, refused by a
/// firewall rule): the next one is taken as usual.
fn connection_failed(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::ECONNRESET
                | libc::EPROTO
                | libc::EPERM
                | libc::EINTR
                | libc::EAGAIN
                | libc::ETIMEDOUT
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ENETDOWN
                | libc::ENONET
                | libc::EHOSTDOWN
                | libc::EOPNOTSUPP
        )
    )
}

/// How long accepting waits before it looks again, at the cap with no connection that may go
/// or out of descriptors.
const WAIT: Duration = Duration::from_millis(20);

/// Serves `router` on `listener` within `limits` until dropped (dropping cuts every
/// connection). Ends only on an error of the listener itself.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits) -> std::io::Result<()> {
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut open: HashMap<Id, Open> = HashMap::new();
    let forget = |open: &mut HashMap<Id, Open>, done: Result<(Id, ()), JoinError>| {
        let id = match done {
            Ok((id, ())) => id,
            Err(e) => e.id(),
        };
        open.remove(&id);
    };
    loop {
        // Over the cap (the newest made it so): the quietest connection that may go, goes;
        // where none may, the newcomers wait in the listen queue.
        while open.len() > limits.cap {
            if let Some(o) = victim(&open, &limits).and_then(|id| open.remove(&id)) {
                o.abort.abort();
                continue;
            }
            tokio::select! {
                Some(done) = tasks.join_next_with_id() => forget(&mut open, done),
                () = tokio::time::sleep(WAIT) => {}
            }
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let fd = stream.as_raw_fd();
                    let activity = Arc::new(Activity::new());
                    let abort = tasks.spawn(connection(
                        stream,
                        router.clone(),
                        Arc::clone(&activity),
                        limits,
                    ));
                    open.insert(abort.id(), Open { fd, activity, abort });
                }
                Err(e) if out_of_resources(&e) => {
                    if let Some(o) = victim(&open, &limits).and_then(|id| open.remove(&id)) {
                        o.abort.abort();
                    }
                    tokio::select! {
                        Some(done) = tasks.join_next_with_id() => forget(&mut open, done),
                        () = tokio::time::sleep(WAIT) => {}
                    }
                }
                Err(e) if connection_failed(&e) => {}
                Err(e) => return Err(e),
            },
            Some(done) = tasks.join_next_with_id() => forget(&mut open, done),
        }
    }
}

/// Serves one connection until it ends or a limit ends it.
async fn connection(stream: TcpStream, router: Router, activity: Arc<Activity>, limits: Limits) {
    let born = Instant::now();
    let peer = super::peer::Peer {
        addr: stream.peer_addr().ok(),
        local: stream.local_addr().ok(),
    };
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(peer);
            let busy = Busy::new(&activity);
            let mut router = router.clone();
            async move {
                let response =
                    tower_service::Service::call(&mut router, request.map(Body::new)).await?;
                Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy }))
            }
        })
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let end = born + limits.lifetime;
    let mut closing = false;
    loop {
        let cut = if closing { end + limits.linger } else { end };
        let wake = (Instant::now() + limits.tick()).min(cut);
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if activity.idle_for() >= limits.idle_timeout || now >= end + limits.linger {
            return;
        }
        if now >= end && !closing {
            // No new request; the one in flight (if any) may finish.
            conn.as_mut().graceful_shutdown();
            closing = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::{SocketAddr, TcpStream},
    };

    use axum::routing::get;

    use super::*;

    #[test]
    fn the_cap_leaves_descriptors_free() {
        assert_eq!(cap_for(1024, 40), MAX_CONNECTIONS);
        assert_eq!(cap_for(256, 100), MAX_CONNECTIONS);
        // 256 - 180 - 33: 43.
        assert_eq!(cap_for(256, 180), 43);
        assert_eq!(cap_for(256, 250), MIN_CONNECTIONS);
        assert_eq!(cap_for(0, 10), MIN_CONNECTIONS);
        assert_eq!(cap_for(u64::MAX, 0), MAX_CONNECTIONS);
    }

    /// A server on a loopback port of its own (its runtime dropped at the end of the test).
    fn start(limits: Limits) -> (tokio::runtime::Runtime, SocketAddr) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_io()
            .enable_time()
            .build()
            .expect("runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("addr");
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).expect("listener")
        };
        let router = Router::new().route("/metrics", get(|| async { "ok\n" }));
        runtime.spawn(serve(listener, router, limits));
        (runtime, addr)
    }

    /// GET /metrics on a new connection: the status line, and how long it took.
    fn get_metrics(addr: SocketAddr) -> (String, Duration) {
        let t0 = std::time::Instant::now();
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("send");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw);
        (text.lines().next().unwrap_or("").to_owned(), t0.elapsed())
    }

    /// Whether the server closed `s` (EOF or reset; whatever it sent before, read) within
    /// `within`.
    fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        let mut buf = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            s.set_read_timeout(Some(left)).expect("timeout");
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    );
                }
            }
        }
    }

    /// Far more idle connections than the cap, and as many slowloris ones: a scrape still
    /// answers at once (the quietest go), and the idle ones left are closed by the idle
    /// timeout.
    #[test]
    fn idle_and_slow_connections_do_not_lock_out_a_scrape() {
        let limits = Limits {
            cap: 8,
            idle_timeout: Duration::from_secs(2),
            header_timeout: Duration::from_secs(2),
            ..Limits::default()
        };
        let (_runtime, addr) = start(limits);
        let mut idle: Vec<TcpStream> = (0..60)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        let mut slow: Vec<TcpStream> = (0..30)
            .map(|_| {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .expect("send");
                s
            })
            .collect();
        // A hang bound, not a benchmark: the lockout this checks lasted for as long as the
        // connections were held.
        let (status, took) = get_metrics(addr);
        assert_eq!(status, "HTTP/1.1 200 OK", "after {took:?}");
        assert!(took < Duration::from_secs(1), "answered after {took:?}");
        // Everything held is closed within the idle timeout (and a tick), by eviction or by
        // the timeouts.
        for s in idle.iter_mut().chain(slow.iter_mut()) {
            assert!(
                closed_within(s, Duration::from_secs(4)),
                "a connection outlived the idle timeout"
            );
        }
    }

    /// Below the cap, an idle connection is closed by the idle timeout, not before a second
    /// request of a keep-alive client can come.
    #[test]
    fn idle_connections_are_closed_by_the_idle_timeout() {
        let limits = Limits {
            idle_timeout: Duration::from_secs(1),
            header_timeout: Duration::from_secs(5),
            ..Limits::default()
        };
        let (_runtime, addr) = start(limits);
        let mut s = TcpStream::connect(addr).expect("connect");
        let t0 = std::time::Instant::now();
        assert!(
            closed_within(&mut s, Duration::from_secs(5)),
            "still open after 5 s"
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(900),
            "{:?}",
            t0.elapsed()
        );
        // Keep-alive: two requests on one connection, then closed when idle.
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        for _ in 0..2 {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("send");
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).expect("answer");
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        }
        assert!(closed_within(&mut s, Duration::from_secs(5)));
    }
}

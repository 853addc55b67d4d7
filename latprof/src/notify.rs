//! The service manager's readiness protocol (`sd_notify(3)`, `Type=notify`): one datagram per
//! message to the socket systemd names in `NOTIFY_SOCKET` (a path, or an abstract name after
//! `@`). latprof says `READY=1` once it serves real data, `STOPPING=1` when a signal asks it to
//! stop, and `WATCHDOG=1` from its read loop when the unit sets `WatchdogSec=` (systemd restarts
//! a reader that stalls). Without `NOTIFY_SOCKET` (not started by systemd) every call does
//! nothing.

use std::{
    os::unix::net::{SocketAddr, UnixDatagram},
    time::{Duration, Instant},
};

/// Where to tell the service manager, if anyone listens.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    /// Half the watchdog's interval, when the unit set one for this process.
    watchdog: Option<Duration>,
    last_ping: Option<Instant>,
}

impl Notifier {
    /// From the environment systemd sets: `NOTIFY_SOCKET`, `WATCHDOG_USEC` (and
    /// `WATCHDOG_PID`, which must be this process when set).
    #[must_use]
    pub fn from_env() -> Self {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|name| {
            let name = name.into_encoded_bytes();
            let addr = if let Some(abstract_name) = name.strip_prefix(b"@") {
                use std::os::linux::net::SocketAddrExt as _;
                SocketAddr::from_abstract_name(abstract_name).ok()?
            } else {
                use std::os::unix::ffi::OsStrExt as _;
                SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(&name)).ok()?
            };
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .is_none_or(|pid| pid.trim().parse() == Ok(std::process::id()));
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|us| us.trim().parse::<u64>().ok())
            .filter(|&us| us > 0 && for_us && target.is_some())
            .map(|us| Duration::from_micros(us / 2));
        Self {
            target,
            watchdog,
            last_ping: None,
        }
    }

    /// Sends `message` (`KEY=value` lines); a service manager that went away is not an error.
    fn send(&self, message: &str) {
        if let Some((socket, addr)) = &self.target {
            let _ = socket.send_to_addr(message.as_bytes(), addr);
        }
    }

    /// latprof is ready: its programs are attached and what it serves is real data.
    pub fn ready(&self, status: &str) {
        self.send(&format!(
            "READY=1\nSTATUS={status}\nMAINPID={}",
            std::process::id()
        ));
    }

    /// latprof is stopping (a signal came): it detaches and exits.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }

    /// The read loop is alive: a watchdog ping, at most once per half interval.
    pub fn alive(&mut self) {
        let Some(every) = self.watchdog else {
            return;
        };
        if self.last_ping.is_none_or(|t| t.elapsed() >= every) {
            self.send("WATCHDOG=1");
            self.last_ping = Some(Instant::now());
        }
    }

    /// How often the read loop must call `alive` at the least (`None`: no watchdog).
    #[must_use]
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_the_socket_in_order() {
        let dir = std::env::temp_dir().join(format!("latprof-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut notifier = Notifier {
            target: Some((
                UnixDatagram::unbound().unwrap(),
                SocketAddr::from_pathname(&path).unwrap(),
            )),
            watchdog: Some(Duration::from_secs(3600)),
            last_ping: None,
        };
        notifier.ready("serving");
        notifier.alive();
        // Within the interval: no second ping.
        notifier.alive();
        notifier.stopping();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        for _ in 0..3 {
            let n = listener.recv(&mut buf).unwrap();
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert!(got[0].starts_with("READY=1\nSTATUS=serving"), "{got:?}");
        assert_eq!(got[1], "WATCHDOG=1");
        assert!(got[2].starts_with("STOPPING=1"), "{got:?}");
        listener.set_nonblocking(true).unwrap();
        assert!(listener.recv(&mut buf).is_err(), "one ping per interval");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

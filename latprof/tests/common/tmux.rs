//! A real terminal for a test: tmux runs a command in a detached session; the test types keys
//! and reads the screen as a person would.
//!
//! Each terminal has a tmux server of its own (`-L`): on one shared server, a test closing
//! the last session stops the server while another test's `new-session` is connecting to it
//! ("server exited unexpectedly", seen in a fresh-clone CI run).
use std::{
    process::Command,
    time::{Duration, Instant},
};

pub struct Tmux {
    socket: String,
    session: String,
    /// The server's socket file, which tmux leaves behind when its server is killed.
    socket_path: String,
}

impl Tmux {
    /// `command` in a new 100x30 terminal.
    pub fn start(command: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = format!("latprof-test-{}-{n}", std::process::id());
        let mut tmux = Self {
            socket: session.clone(),
            session,
            socket_path: String::new(),
        };
        let status = tmux
            .command()
            .args([
                "new-session",
                "-d",
                "-s",
                &tmux.session,
                "-x",
                "100",
                "-y",
                "30",
            ])
            .arg(command)
            .status()
            .expect("tmux (install it, or run `cargo xtask test`)");
        assert!(status.success(), "tmux new-session failed");
        tmux.socket_path = tmux.display("#{socket_path}");
        tmux
    }

    /// tmux, talking to this terminal's own server.
    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket]);
        command
    }

    /// `#{format}` of this terminal's pane, e.g. `pane_pid`.
    pub fn display(&self, format: &str) -> String {
        let out = self
            .command()
            .args(["display-message", "-p", "-t", &self.session, format])
            .output()
            .expect("tmux display-message");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    pub fn screen(&self) -> String {
        let out = self
            .command()
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        let status = self
            .command()
            .args(["send-keys", "-t", &self.session])
            .args(keys)
            .status()
            .expect("tmux send-keys");
        assert!(status.success());
    }

    /// Closes the terminal as a person closing its window does: its programs get a hangup.
    pub fn close(&self) {
        let status = self
            .command()
            .args(["kill-session", "-t", &self.session])
            .status()
            .expect("tmux kill-session");
        assert!(status.success());
    }

    /// Waits until the screen contains all of `needles` (at most 20 s).
    pub fn wait_for(&self, needles: &[&str]) -> String {
        self.wait_until(|screen| {
            if needles.iter().all(|n| screen.contains(n)) {
                Ok(screen.to_owned())
            } else {
                Err(format!("waited for {needles:?}"))
            }
        })
    }

    /// Waits until `check` accepts the screen (at most 20 s) and returns what it found; the
    /// panic says why the last screen was refused. A capture may catch a frame half drawn:
    /// the next one is checked again.
    pub fn wait_until<T>(&self, check: impl Fn(&str) -> Result<T, String>) -> T {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            match check(&screen) {
                Ok(found) => return found,
                Err(why) => assert!(Instant::now() < deadline, "{why}, screen:\n{screen}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn alternate_screen(&self) -> bool {
        self.display("#{alternate_on}") == "1"
    }

    /// In `top`, with process `pid`'s causes shown: pauses (the order then holds still), goes
    /// to its cause whose row starts with `cause` and opens its detail.
    pub fn open_cause(&self, pid: &str, cause: &str) {
        self.keys(&["Space"]);
        let at = self.wait_until(|screen| {
            if !screen.contains("PAUSED") {
                return Err("not paused".to_owned());
            }
            screen
                .lines()
                .skip_while(|l| !l.contains(&format!("Causes of {pid}")))
                .skip(2)
                .position(|l| {
                    l.split_once("││")
                        .is_some_and(|(_, row)| row.starts_with(cause))
                })
                .ok_or_else(|| format!("no {cause:?} among the causes of {pid}"))
        });
        self.keys(&["Tab"]);
        self.keys(&["Tab"]);
        for _ in 0..at {
            self.keys(&["Down"]);
        }
        self.keys(&["Enter"]);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").status();
        if !self.socket_path.is_empty() {
            let _ = std::fs::remove_file(&self.socket_path);
        }
    }
}

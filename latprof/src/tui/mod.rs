//! The screens of `top` and `replay`: the App's state and keys (app.rs), the replay's time
//! navigation over a recording (replay.rs), drawing (ui.rs), and the terminal they own.
pub mod app;
pub mod replay;
pub mod ui;

use std::io::Stdout;

use anyhow::{Context as _, Result};
use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        cursor, execute,
        terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
    },
};

/// Owns the terminal while the TUI runs; gives it back on drop, panics included.
pub struct TerminalGuard {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen, cursor::Show);
}

impl TerminalGuard {
    pub fn new() -> Result<Self> {
        terminal::enable_raw_mode().context("the terminal cannot enter raw mode (not a tty?)")?;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        execute!(std::io::stdout(), EnterAlternateScreen, cursor::Hide)
            .context("setting up the terminal")?;
        let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
        Ok(Self { terminal })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Whether the terminal went away (its window closed, `tmux kill-session`): standard input
/// then reports a hangup, and reading it returns end of file at once, for ever. Checked
/// before each wait for a key, as no signal may come.
#[must_use]
pub fn terminal_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: 0,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let ready = unsafe { libc::poll(&raw mut fd, 1, 0) };
    ready == 1 && fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

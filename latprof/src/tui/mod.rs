//! The screens of `top` and `replay`: the App's state and keys (app.rs), the replay's time
//! navigation over a recording (replay.rs), drawing (ui.rs), and the terminal they own.
pub mod app;
mod detail;
pub mod events;
mod keys;
mod pane;
pub mod replay;
pub mod ui;

use std::io::Stdout;

use anyhow::{Context as _, Result};
use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        cursor,
        event::KeyEvent,
        execute,
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

/// What the terminal gave while `next_input` waited.
#[derive(Debug)]
pub enum Input {
    /// Keys typed (several when they came together).
    Keys(Vec<KeyEvent>),
    /// Nothing (the wait ended, a signal came, or the input was no key: a resize).
    Nothing,
    /// The terminal went away (its window closed, `tmux kill-session`, an SSH drop): the
    /// input reports a hangup or an end of file, for ever.
    Gone,
}

/// The descriptor keys come from: standard input when it is a terminal, else the controlling
/// terminal, which is what crossterm reads too.
fn input_fd() -> libc::c_int {
    static FD: std::sync::OnceLock<libc::c_int> = std::sync::OnceLock::new();
    *FD.get_or_init(|| {
        // SAFETY: isatty and open with a NUL-terminated path have no other preconditions.
        unsafe {
            if libc::isatty(0) == 1 {
                0
            } else {
                libc::open(c"/dev/tty".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC)
            }
        }
    })
}

/// Waits up to `timeout` for keys. latprof waits on the terminal itself and asks crossterm
/// only for bytes that are there: crossterm's own wait loops for ever, at full CPU and deaf to
/// signals, on a terminal that hung up (its reads return end of file at once).
pub fn next_input(timeout: std::time::Duration) -> Result<Input> {
    use ratatui::crossterm::event::{self, Event};
    let fd = input_fd();
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&raw mut poll, 1, ms) };
    if ready <= 0 {
        // The wait ended, or a signal came (its flag is the caller's to check).
        return Ok(Input::Nothing);
    }
    if poll.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Ok(Input::Gone);
    }
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let asked = unsafe { libc::ioctl(fd, libc::FIONREAD, &raw mut waiting) };
    if asked == 0 && waiting == 0 {
        // Readable with nothing to read: the end of the input.
        return Ok(Input::Gone);
    }
    let mut keys = Vec::new();
    while event::poll(std::time::Duration::ZERO)? {
        if let Event::Key(key) = event::read()? {
            keys.push(key);
        }
    }
    Ok(if keys.is_empty() {
        Input::Nothing
    } else {
        Input::Keys(keys)
    })
}

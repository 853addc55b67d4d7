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

//! The frame every pane of `top` and `replay` is drawn in: borders and a title, cyan where the
//! pane has the focus.

use ratatui::{
    style::{Color, Style},
    widgets::{Block, Borders},
};

/// A pane titled `title`, its border highlighted when `focused`.
pub(super) fn block(title: &str, focused: bool) -> Block<'_> {
    let style = if focused {
        Style::default().fg(Color::Cyan)
    } else {
        Style::default()
    };
    Block::default()
        .borders(Borders::ALL)
        .border_style(style)
        .title(title.to_owned())
}

//! Drawing the detail of a cause: its backtraces (kernel, user or both), its live processes,
//! who woke it, and its latency histogram.

use ratatui::{
    Frame,
    layout::{Constraint, Direction, Layout, Rect},
    style::{Modifier, Style},
    text::{Line, Span},
    widgets::{Paragraph, Wrap},
};

use super::{
    app::{App, Detail, DetailView, TraceLine},
    pane::block,
};
use crate::{model::Row, time::fmt_ns};

pub(super) fn render_detail(
    f: &mut Frame<'_>,
    app: &App,
    detail: &Detail,
    view: &DetailView,
    area: Rect,
) {
    let row = &detail.row;
    let parts = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(55), Constraint::Percentage(45)])
        .split(area);
    let mut text = trace_text(app, row);
    behind_text(view, &mut text);
    // The frames shown, where there is a choice.
    let title = if app.derived.user_frames {
        format!("Detail: {} (u: next, Esc: back)", app.frames.name())
    } else {
        "Detail (Esc: back)".to_owned()
    };
    f.render_widget(
        Paragraph::new(text)
            .block(block(&title, true))
            .wrap(Wrap { trim: false }),
        parts[0],
    );
    let right = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Percentage(30),
            Constraint::Percentage(30),
            Constraint::Percentage(40),
        ])
        .split(parts[1]);
    let mut lines = Vec::new();
    for (tgid, comm, r) in &view.processes {
        lines.push(Line::from(format!(
            "{tgid:>7} {comm:<16} {:>6} {:>8}",
            r.count,
            fmt_ns(r.total_ns)
        )));
    }
    if lines.is_empty() {
        lines.push(Line::from("(no live process; exited ones are merged)"));
    }
    f.render_widget(
        Paragraph::new(lines).block(block("Processes", false)),
        right[0],
    );
    let mut lines = Vec::new();
    for w in &view.wakers {
        let share = (w.total_ns * 100).checked_div(row.total_ns).unwrap_or(0);
        lines.push(Line::from(format!(
            "{:<26} {:>6} {:>3}% {:>8}",
            w.label(),
            w.count,
            share,
            fmt_ns(w.total_ns)
        )));
    }
    if lines.is_empty() {
        lines.push(Line::from(if app.settings.wakers {
            "(no waker: run-queue waits, or nothing counted yet)"
        } else {
            "(wakers not collected: run with --wakers)"
        }));
    }
    let title = match view.of_process {
        Some(tgid) => format!("Woken by (pid {tgid}'s sleeps; count, share of time, total)"),
        None => "Woken by (count, share of time, total)".to_owned(),
    };
    f.render_widget(Paragraph::new(lines).block(block(&title, false)), right[1]);
    let mut lines = Vec::new();
    if let Some(hist) = &view.histogram {
        let max = hist.iter().copied().max().unwrap_or(0).max(1);
        let first = hist.iter().position(|&n| n > 0).unwrap_or(0);
        let last = hist.iter().rposition(|&n| n > 0).unwrap_or(0);
        let width = usize::from(right[1].width.saturating_sub(24)).max(1);
        for (i, n) in hist.iter().enumerate().take(last + 1).skip(first) {
            let lo = if i == 0 { 0 } else { 1u64 << i };
            let bar = "#".repeat((*n as usize * width).div_ceil(max as usize).min(width));
            lines.push(Line::from(format!(
                "{:>7} {:>7} {bar}",
                fmt_ns(lo * 1000),
                n
            )));
        }
    }
    // A recording keeps the histograms summed over cgroups: say so rather than show every
    // cgroup's under one cgroup's title.
    let title = if view.histogram_all_cgroups {
        "Latency histogram, all cgroups (from, count)"
    } else {
        "Latency histogram (from, count)"
    };
    f.render_widget(Paragraph::new(lines).block(block(title, false)), right[2]);
}

/// With `--chains`: the "Behind it" section under the backtraces: each part of the waits with
/// time of its own (share of the waits, time), leaf first, then the wakers' sleeps it was
/// behind, nearest first.
fn behind_text(view: &DetailView, text: &mut Vec<Line<'static>>) {
    if view.behind.is_empty() {
        return;
    }
    text.push(Line::from(""));
    text.push(Line::from(Span::styled(
        "Behind it (share of the wait, time; what it was behind)",
        Style::default().add_modifier(Modifier::UNDERLINED),
    )));
    for b in &view.behind {
        text.push(Line::from(format!(
            "{:>3}% {:>8} {}",
            b.share_pct,
            fmt_ns(b.own_ns),
            b.leaf
        )));
        for via in &b.via {
            text.push(Line::from(Span::styled(
                format!("              < {via}"),
                Style::default().add_modifier(Modifier::DIM),
            )));
        }
    }
}

/// The detail's left side: the row's numbers and its backtraces, with the frames chosen.
fn trace_text(app: &App, row: &Row) -> Vec<Line<'static>> {
    let mut text = vec![
        Line::from(Span::styled(
            row.reason.clone(),
            Style::default().add_modifier(Modifier::BOLD),
        )),
        Line::from(format!(
            "count {}  total {}  average {}  max {}",
            row.count,
            fmt_ns(row.total_ns),
            fmt_ns(row.average_ns()),
            fmt_ns(row.max_ns)
        )),
    ];
    let dim = Style::default().add_modifier(Modifier::DIM);
    for line in app.frames.lines(&row.backtraces) {
        match line {
            TraceLine::Heading(n) => {
                text.push(Line::from(""));
                text.push(Line::from(Span::styled(
                    format!("Backtrace {n}"),
                    Style::default().add_modifier(Modifier::UNDERLINED),
                )));
            }
            TraceLine::Kernel(frame) | TraceLine::User(frame) => {
                text.push(Line::from(format!("  {frame}")));
            }
            TraceLine::UserHeading => text.push(Line::from(Span::styled(" user:", dim))),
            TraceLine::Truncated => text.push(Line::from(Span::styled(
                format!(
                    "  {} (the outer frames are unknown)",
                    crate::ustacks::TRUNCATED
                ),
                dim,
            ))),
            TraceLine::NoUser => text.push(Line::from(Span::styled("  (no user frames)", dim))),
        }
    }
    text
}

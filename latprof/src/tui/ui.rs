//! Rendering only: the App's state onto a frame.
use ratatui::{
    Frame,
    layout::{Constraint, Direction, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Cell, Clear, Paragraph, Row as TableRow, Table, TableState},
};

use super::{
    app::{self, App, Focus},
    detail::render_detail,
    pane::block,
};
use crate::{
    model::{Group, Row},
    time::{self, fmt_ns},
};

pub fn render(f: &mut Frame<'_>, app: &App) {
    let area = f.area();
    let chunks = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(if app.status.is_some() { 2 } else { 1 }),
            Constraint::Min(4),
            Constraint::Length(u16::try_from(app::SPIKE_LINES + 2).unwrap_or(6)),
            Constraint::Length(1),
        ])
        .split(area);
    render_spikes(f, app, chunks[2]);
    render_header(f, app, chunks[0]);
    if app.counters {
        let text = &app.derived.counters_text;
        f.render_widget(
            Paragraph::new(text.lines().map(Line::from).collect::<Vec<_>>()).block(block(
                "Counters (rates since the previous snapshot; c: back)",
                true,
            )),
            chunks[1],
        );
    } else if let (Some(detail), Some(view)) = (&app.detail, &app.derived.detail) {
        render_detail(f, app, detail, view, chunks[1]);
    } else {
        let body = Layout::default()
            .direction(Direction::Vertical)
            .constraints([Constraint::Percentage(50), Constraint::Percentage(50)])
            .split(chunks[1]);
        let bottom = Layout::default()
            .direction(Direction::Horizontal)
            .constraints([Constraint::Percentage(45), Constraint::Percentage(55)])
            .split(body[1]);
        let by = match app.group {
            Group::Reason => "",
            Group::Backtrace => " (by backtrace)",
        };
        let title = match &app.cgroup {
            Some((_, name)) => format!("Causes in cgroup {name}{by} (Esc: all)"),
            None => format!("Global causes{by}"),
        };
        if app.cgroups_view {
            render_cgroups(f, app, body[0]);
        } else {
            render_rows(f, app, &app.global, Focus::Global, &title, body[0]);
        }
        render_procs(f, app, bottom[0]);
        let sel = app.procs.get(app.selected[1]).map_or_else(
            || "Causes".to_owned(),
            |p| match p.tid {
                Some(tid) => format!("Causes of thread {tid} {}", p.comm),
                None => format!("Causes of {} {}", p.tgid, p.comm),
            },
        );
        render_rows(f, app, &app.causes, Focus::Causes, &sel, bottom[1]);
    }
    render_footer(f, app, chunks[3]);
    if app.help {
        render_help(f, app, area);
    }
}

fn render_header(f: &mut Frame<'_>, app: &App, area: Rect) {
    let h = &app.header;
    let mut spans = vec![
        Span::styled("latprof", Style::default().add_modifier(Modifier::BOLD)),
        // First, where a narrow terminal still shows it.
        Span::styled(
            if app.paused { " PAUSED" } else { "" },
            Style::default().fg(Color::Yellow),
        ),
        Span::raw(format!(
            " {}{} {}ms up {} {:.0} ev/s ",
            app.settings.mode.as_str(),
            app.settings
                .kernel
                .programs
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default(),
            app.settings.interval_ms,
            time::fmt_elapsed(h.elapsed_s),
            h.events_per_s
        )),
    ];
    let drops = format!("drops {}", h.drops);
    spans.push(if h.drops > 0 {
        Span::styled(drops, Style::default().fg(Color::White).bg(Color::Red))
    } else {
        Span::raw(drops)
    });
    spans.push(Span::raw(match (h.cost_ns_per_event, h.cpu_percent) {
        (Some(ns), Some(cpu)) => format!(" cost {ns:.0}ns/ev {cpu:.2}%CPU"),
        (None, Some(cpu)) => format!(" cost {cpu:.2}%CPU"),
        _ => " cost n/a".to_owned(),
    }));
    // The spike pipeline: events, reader wakeups sent/suppressed, drops, reader sleeps.
    if let Some(cur) = &app.cur {
        let (submitted, woken, suppressed, dropped) = cur.counters.spike_pipeline();
        spans.push(Span::raw(format!(
            " spikes {submitted} wake {woken}/{suppressed} drop {dropped} sleep {}",
            app.reader_sleeps
        )));
    }
    let mut lines = vec![Line::from(spans)];
    if let Some(status) = &app.status {
        lines.push(Line::from(Span::styled(
            status.clone(),
            Style::default().fg(Color::Cyan),
        )));
    }
    f.render_widget(Paragraph::new(lines), area);
}

fn render_rows(f: &mut Frame<'_>, app: &App, rows: &[Row], focus: Focus, title: &str, area: Rect) {
    let total: u64 = rows.iter().map(|r| r.total_ns).sum();
    // Narrow panes keep the reason, count, total and share; wide ones add average and max.
    let wide = area.width >= 64;
    let names: &[&str] = if wide {
        &["Reason", "Count", "Total", "Average", "Max", "%"]
    } else {
        &["Reason", "Count", "Total", "%"]
    };
    let header =
        TableRow::new(names.iter().copied()).style(Style::default().add_modifier(Modifier::BOLD));
    let lines = rows.iter().map(|r| {
        let pct = if total > 0 {
            r.total_ns as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        let mut cells = vec![
            Cell::from(r.label.clone()),
            Cell::from(r.count.to_string()),
            Cell::from(fmt_ns(r.total_ns)),
        ];
        if wide {
            cells.push(Cell::from(fmt_ns(r.average_ns())));
            cells.push(Cell::from(fmt_ns(r.max_ns)));
        }
        cells.push(Cell::from(format!("{pct:.1}%")));
        TableRow::new(cells)
    });
    let widths: &[Constraint] = if wide {
        &[
            Constraint::Min(16),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(6),
        ]
    } else {
        &[
            Constraint::Min(12),
            Constraint::Length(6),
            Constraint::Length(7),
            Constraint::Length(6),
        ]
    };
    let focused = app.focus == focus;
    let table = Table::new(lines, widths.iter().copied())
        .header(header)
        .block(block(title, focused))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default();
    if focused && !rows.is_empty() {
        state.select(Some(app.selected[App::pane(focus)]));
    }
    f.render_stateful_widget(table, area, &mut state);
}

/// The cgroups pane: each cgroup v2's sleeps since the baseline, most first.
fn render_cgroups(f: &mut Frame<'_>, app: &App, area: Rect) {
    let header = TableRow::new(["Cgroup", "Count", "Total", "Max", "Top cause"])
        .style(Style::default().add_modifier(Modifier::BOLD));
    let lines = app.cgroup_lines.iter().map(|c| {
        let name = if c.removed {
            format!("{} (removed)", c.name)
        } else {
            c.name.clone()
        };
        TableRow::new(vec![
            Cell::from(name),
            Cell::from(c.count.to_string()),
            Cell::from(fmt_ns(c.total_ns)),
            Cell::from(fmt_ns(c.max_ns)),
            Cell::from(c.top.clone()),
        ])
    });
    let widths = [
        Constraint::Min(20),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Min(16),
    ];
    let title = if app.cgroup_lines.is_empty() {
        "Cgroups: none (no cgroup v2 here, or no sleep yet; C: back)"
    } else {
        "Cgroups (Enter: show only this one; C: back)"
    };
    let focused = app.focus == Focus::Global;
    let table = Table::new(lines, widths)
        .header(header)
        .block(block(title, focused))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default();
    if focused && !app.cgroup_lines.is_empty() {
        state.select(Some(app.selected[0]));
    }
    f.render_stateful_widget(table, area, &mut state);
}

fn render_procs(f: &mut Frame<'_>, app: &App, area: Rect) {
    // The cgroup column where any process has one.
    let cgroups = app.procs.iter().any(|p| !p.cgroup.is_empty());
    let names: &[&str] = if cgroups {
        &["PID", "Command", "Total", "Cgroup", "Top cause"]
    } else {
        &["PID", "Command", "Total", "Top cause"]
    };
    let header =
        TableRow::new(names.iter().copied()).style(Style::default().add_modifier(Modifier::BOLD));
    let lines = app.procs.iter().map(|p| {
        let (pid, name) = if let Some(tid) = p.tid {
            (format!("  {tid}"), format!("  {}", p.comm))
        } else {
            let mark = if p.threads > 1 {
                if app.expanded.contains(&p.tgid) {
                    "-"
                } else {
                    "+"
                }
            } else {
                " "
            };
            (format!("{mark}{}", p.tgid), p.comm.clone())
        };
        let mut cells = vec![
            Cell::from(pid),
            Cell::from(name),
            Cell::from(fmt_ns(p.total_ns)),
        ];
        if cgroups {
            cells.push(Cell::from(p.cgroup.clone()));
        }
        cells.push(Cell::from(p.top.clone()));
        TableRow::new(cells)
    });
    let widths: &[Constraint] = if cgroups {
        &[
            Constraint::Length(8),
            Constraint::Length(16),
            Constraint::Length(8),
            Constraint::Length(18),
            Constraint::Min(10),
        ]
    } else {
        &[
            Constraint::Length(8),
            Constraint::Length(16),
            Constraint::Length(8),
            Constraint::Min(10),
        ]
    };
    let mut title = if app.filter.is_empty() {
        "Processes".to_owned()
    } else {
        format!("Processes matching '{}'", app.filter)
    };
    if let Some((_, name)) = &app.cgroup {
        title = format!("{title} in {name}");
    }
    let focused = app.focus == Focus::Processes;
    let table = Table::new(lines, widths.iter().copied())
        .header(header)
        .block(block(&title, focused))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default();
    if !app.procs.is_empty() {
        state.select(Some(app.selected[1]));
    }
    f.render_stateful_widget(table, area, &mut state);
}

/// The recent spikes, newest first, with the pipeline's counters in the title.
fn render_spikes(f: &mut Frame<'_>, app: &App, area: Rect) {
    let (submitted, woken, suppressed, dropped) = app
        .cur
        .as_ref()
        .map_or((0, 0, 0, 0), |s| s.counters.spike_pipeline());
    // Spikes carry no cgroup: with one cgroup shown, the title says they are everyone's.
    let all = if app.cgroup.is_some() {
        " (all cgroups)"
    } else {
        ""
    };
    let title = if app.settings.spike_ns == u64::MAX {
        "Recent spikes: none recorded (a recording made before spikes existed)".to_owned()
    } else {
        format!(
            "Recent spikes{all} >= {}: {submitted} sent, wakeups {woken} ({suppressed} suppressed), {dropped} dropped, reader slept {}",
            fmt_ns(app.settings.spike_ns),
            app.reader_sleeps
        )
    };
    let lines: Vec<Line<'_>> = app
        .derived
        .spikes
        .iter()
        .map(|s| {
            Line::from(format!(
                "{}.{:03} {:>7} {:<15} {} {:>9} {:<22} {}",
                time::local_hms(s.wall_ns),
                (s.wall_ns / 1_000_000) % 1000,
                s.tgid,
                s.comm,
                s.kind,
                fmt_ns(s.duration_ns),
                s.waker,
                s.reason
            ))
        })
        .collect();
    f.render_widget(Paragraph::new(lines).block(block(&title, false)), area);
}

fn render_footer(f: &mut Frame<'_>, app: &App, area: Rect) {
    if app.editing.is_none()
        && let Some(notice) = &app.notice
    {
        f.render_widget(
            Paragraph::new(notice.clone()).style(Style::default().fg(Color::Yellow)),
            area,
        );
        return;
    }
    let text = match (&app.editing, &app.footer) {
        (Some(t), _) => format!("filter (pid or name): {t}_   Enter: apply  Esc: cancel"),
        (None, Some(footer)) => footer.clone(),
        (None, None) => format!(
            "q quit ? help Tab pane Enter detail u frames / filter s sort:{} g group C cgroups c counters space pause r reset",
            app.sort.name()
        ),
    };
    f.render_widget(
        Paragraph::new(text).style(Style::default().add_modifier(Modifier::DIM)),
        area,
    );
}

fn render_help(f: &mut Frame<'_>, app: &App, area: Rect) {
    // Replay replaces the footer's key hints; top's status line may say other things.
    let replay = app.footer.is_some();
    let w = area.width.min(60);
    let h = area.height.min(if replay { 22 } else { 18 });
    let popup = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let time: &[&str] = if replay {
        &[
            "] / [       next / previous snapshot",
            "} / {       10 snapshots forward / back",
            "p, space    play / pause",
            "t           jump to +30s, -10s, 12:03:10, start, end, #N",
            "m, r        mark A here: show what happened since A",
            "M           clear A: show everything since the start",
        ]
    } else {
        &[
            "space       pause / resume",
            "r           reset: count from now",
        ]
    };
    let panes = [
        "Tab         next pane (global, processes, causes)",
        "Up/Down j/k move",
        "Enter       details of a cause; expand a process",
        "u           detail's frames: kernel + user, kernel, user",
        "Right/Left  expand/fold a process's threads",
        "Esc         back; clear the filter",
        "/           filter processes by pid or name",
        "s           sort by total, max, count, average",
        "g           group by reason or by backtrace",
        "c           counters: pipeline, ticks and tick_stop per CPU",
        "C           cgroups; Enter on one shows only it (Esc: all)",
    ];
    let text: Vec<&str> = std::iter::once("q, Ctrl-C   quit")
        .chain(time.iter().copied())
        .chain(panes)
        .chain(["?           this help"])
        .collect();
    f.render_widget(Clear, popup);
    f.render_widget(
        Paragraph::new(text.iter().map(|l| Line::from(*l)).collect::<Vec<_>>())
            .block(block("Help", true)),
        popup,
    );
}

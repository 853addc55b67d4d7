//! The keys of `top` and `replay`: what each one changes in the App's state (no I/O).

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::app::{App, Detail, Focus};
use crate::model::Group;

impl App {
    /// One key: the state it changes, then what the panes show from that state.
    pub fn handle_key(&mut self, key: KeyEvent) {
        self.key(key);
        self.derive();
    }

    fn key(&mut self, key: KeyEvent) {
        if key.kind != KeyEventKind::Press {
            return;
        }
        self.notice = None;
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if let Some(text) = self.editing.as_mut() {
            match key.code {
                KeyCode::Enter => {
                    self.filter = self.editing.take().unwrap_or_default();
                    self.selected[1] = 0;
                    self.refresh();
                }
                KeyCode::Esc => self.editing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            return;
        }
        if self.help {
            if matches!(key.code, KeyCode::Esc | KeyCode::Char('?' | 'q')) {
                self.help = false;
            }
            return;
        }
        if !self.view_key(key.code) && self.detail.is_none() {
            self.pane_key(key.code);
        }
    }

    /// Keys that change what is shown (any pane, the detail too); false for any other.
    fn view_key(&mut self, code: KeyCode) -> bool {
        match code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Esc => {
                if self.detail.is_some() {
                    self.detail = None;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                    self.refresh();
                } else if self.cgroups_view {
                    self.cgroups_view = false;
                } else if self.cgroup.is_some() {
                    self.cgroup = None;
                    self.selected = [0; 3];
                    self.refresh();
                }
            }
            KeyCode::Char('C') => {
                self.cgroups_view = !self.cgroups_view;
                self.detail = None;
                self.focus = Focus::Global;
                self.selected[0] = 0;
            }
            KeyCode::Char(' ') => {
                self.paused = !self.paused;
                if !self.paused
                    && let Some(snap) = self.pending.take()
                {
                    self.apply(snap);
                }
            }
            KeyCode::Char('r') => {
                self.baseline.clone_from(&self.cur);
                self.refresh();
            }
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                self.refresh();
            }
            KeyCode::Char('g') => {
                self.group = match self.group {
                    Group::Reason => Group::Backtrace,
                    Group::Backtrace => Group::Reason,
                };
                self.detail = None;
                self.refresh();
            }
            KeyCode::Char('/') => self.editing = Some(self.filter.clone()),
            KeyCode::Char('c') => self.counters = !self.counters,
            KeyCode::Char('u') => {
                if self.has_user_frames() {
                    self.frames = self.frames.next();
                    // Seen in the detail's title; elsewhere said once.
                    if self.detail.is_none() {
                        self.notice = Some(format!("u: the detail shows {}", self.frames.name()));
                    }
                } else {
                    self.notice = Some(
                        "u: no user frames here (run top or record with --user-stacks)".to_owned(),
                    );
                }
            }
            _ => return false,
        }
        true
    }

    /// Keys that move in the panes and open the detail.
    fn pane_key(&mut self, code: KeyCode) {
        match code {
            KeyCode::Tab => {
                self.focus = match self.focus {
                    Focus::Global => Focus::Processes,
                    Focus::Processes => Focus::Causes,
                    Focus::Causes => Focus::Global,
                };
            }
            KeyCode::BackTab => {
                self.focus = match self.focus {
                    Focus::Global => Focus::Causes,
                    Focus::Processes => Focus::Global,
                    Focus::Causes => Focus::Processes,
                };
            }
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::PageDown => self.move_by(10),
            KeyCode::PageUp => self.move_by(-10),
            KeyCode::Home => self.move_by(-(isize::MAX / 2)),
            KeyCode::End => self.move_by(isize::MAX / 2),
            KeyCode::Right | KeyCode::Char('l' | '+') => self.expand(true),
            KeyCode::Left | KeyCode::Char('h' | '-') => self.expand(false),
            KeyCode::Enter if self.cgroups_view && self.focus == Focus::Global => {
                if let Some(line) = self.cgroup_lines.get(self.selected[0]) {
                    self.cgroup = Some((line.id, line.name.clone()));
                    self.cgroups_view = false;
                    self.selected = [0; 3];
                    self.refresh();
                }
            }
            KeyCode::Enter => {
                if self.focus == Focus::Processes {
                    let open = self
                        .procs
                        .get(self.selected[1])
                        .is_some_and(|p| p.tid.is_none() && !self.expanded.contains(&p.tgid));
                    self.expand(open);
                } else if let Some(row) = self.selected_row() {
                    self.detail = Some(Detail {
                        row: row.clone(),
                        from: self.focus,
                    });
                }
            }
            _ => {}
        }
    }

    fn expand(&mut self, open: bool) {
        if self.focus != Focus::Processes {
            return;
        }
        if let Some(p) = self.procs.get(self.selected[1]) {
            let tgid = p.tgid;
            if open {
                self.expanded.insert(tgid);
            } else {
                self.expanded.remove(&tgid);
                // Keep the cursor on the process line.
                if let Some(i) = self
                    .procs
                    .iter()
                    .position(|l| l.tgid == tgid && l.tid.is_none())
                {
                    self.selected[1] = i;
                }
            }
            self.refresh();
        }
    }
}

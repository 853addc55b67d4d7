//! The `top` screens over a recording, with time navigation. The App gets exactly the
//! snapshots the live view had at the same moment.
use std::{fmt::Write as _, time::Duration};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::app::{App, Settings};
use crate::{collect::Snapshot, store::reader::Recording, time};

pub const FOOTER: &str = "q quit ? help ]/[ step }/{ x10 p play t jump m mark A M clear A c counters Tab pane Enter detail u frames";

/// A recording and where the user is in it.
pub struct Replay {
    pub rec: Recording,
    pub app: App,
    pub pos: usize,
    /// Snapshot A: numbers are shown since A (the difference of A and the current one).
    pub mark: Option<usize>,
    pub playing: bool,
    /// The text of a "jump to" being typed.
    pub prompt: Option<String>,
    /// The last complaint (a time that is not in the recording).
    pub message: Option<String>,
    /// The recording could not be read again (it changed since it was opened): the replay
    /// ends with this error.
    pub failed: Option<anyhow::Error>,
    first: Snapshot,
    mark_snap: Option<Snapshot>,
}

impl Replay {
    pub fn new(
        rec: Recording,
        settings: Settings,
        at: usize,
        mark: Option<usize>,
    ) -> anyhow::Result<Self> {
        let first = rec.snapshot(0)?;
        let mut replay = Self {
            app: App::new(settings, String::new()),
            pos: 0,
            mark: None,
            playing: false,
            prompt: None,
            message: None,
            failed: None,
            first,
            mark_snap: None,
            rec,
        };
        replay.app.footer = Some(FOOTER.to_owned());
        replay.set_mark(mark);
        replay.goto(at);
        match replay.failed.take() {
            Some(e) => Err(e),
            None => Ok(replay),
        }
    }

    /// Snapshot `i`; when it cannot be read, the replay ends with the error.
    fn snapshot(&mut self, i: usize) -> Option<Snapshot> {
        match self.rec.snapshot(i) {
            Ok(snap) => Some(snap),
            Err(e) => {
                self.failed.get_or_insert(e);
                self.app.quit = true;
                None
            }
        }
    }

    fn set_mark(&mut self, mark: Option<usize>) {
        self.mark = mark;
        self.mark_snap = mark.and_then(|m| self.snapshot(m));
    }

    /// Shows snapshot `pos` (clamped to the recording).
    pub fn goto(&mut self, pos: usize) {
        let pos = pos.min(self.rec.len() - 1);
        let prev = match pos.checked_sub(1) {
            Some(p) => match self.snapshot(p) {
                Some(s) => Some(s),
                None => return,
            },
            None => None,
        };
        let Some(cur) = self.snapshot(pos) else {
            return;
        };
        // The spikes the live view had received by then, named from this snapshot's
        // backtraces: charged with it.
        let (spikes, sleeps) = self
            .rec
            .spikes_until(cur.taken_ns, crate::tui::app::MAX_SPIKES);
        if let Err(e) = self.rec.check_views(&cur, &spikes) {
            self.failed
                .get_or_insert(e.context(format!("snapshot #{pos}")));
            self.app.quit = true;
            return;
        }
        self.pos = pos;
        self.app
            .show(self.first.clone(), prev, cur, self.mark_snap.clone());
        self.app.spikes.clear();
        self.app.on_spikes(spikes, sleeps);
        self.app.status = Some(self.status());
    }

    fn step(&mut self, by: isize) {
        let pos = self.pos.saturating_add_signed(by);
        self.goto(pos);
    }

    /// Where we are: the time, the offset, the snapshot number, and A when marked.
    #[must_use]
    pub fn status(&self) -> String {
        let (mono, wall) = self.rec.times(self.pos);
        let (first_mono, _) = self.rec.times(0);
        let offset =
            |m: u64| time::format_duration(Duration::from_secs((m - first_mono) / 1_000_000_000));
        let mut s = format!(
            "replay {} +{} #{}/{}{}",
            time::local_hms(wall),
            offset(mono),
            self.pos,
            self.rec.len() - 1,
            if self.playing { " PLAYING" } else { "" }
        );
        match self.mark {
            Some(a) => {
                let (a_mono, a_wall) = self.rec.times(a);
                let _ = write!(
                    s,
                    "  showing A {} (+{}) -> now: {}",
                    time::local_hms(a_wall),
                    offset(a_mono),
                    time::format_duration(Duration::from_millis(
                        mono.saturating_sub(a_mono) / 1_000_000
                    ))
                );
            }
            None => s.push_str("  showing: since the start"),
        }
        if let Some(p) = &self.prompt {
            s = format!("jump to (+30s, -10s, 12:03:10, start, end, #N): {p}_");
        } else if let Some(m) = &self.message {
            s.push_str("  ! ");
            s.push_str(m);
        }
        s
    }

    /// Keys of the replay first, then the App's. `r` (reset) marks A here, like `m`.
    pub fn handle_key(&mut self, key: KeyEvent) {
        if key.kind != KeyEventKind::Press {
            return;
        }
        if let Some(text) = self.prompt.as_mut() {
            match key.code {
                KeyCode::Enter => {
                    let spec = self.prompt.take().unwrap_or_default();
                    match self.rec.find(&spec) {
                        Ok(pos) => {
                            self.message = None;
                            self.goto(pos);
                        }
                        Err(e) => self.message = Some(e),
                    }
                }
                KeyCode::Esc => self.prompt = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                    text.push(c);
                }
                _ => {}
            }
            self.app.status = Some(self.status());
            return;
        }
        let app_busy = self.app.editing.is_some() || self.app.help;
        if !app_busy {
            let handled = match key.code {
                KeyCode::Char(']' | '.') => {
                    self.step(1);
                    true
                }
                KeyCode::Char('[' | ',') => {
                    self.step(-1);
                    true
                }
                KeyCode::Char('}') => {
                    self.step(10);
                    true
                }
                KeyCode::Char('{') => {
                    self.step(-10);
                    true
                }
                KeyCode::Char('p' | ' ') => {
                    self.playing = !self.playing;
                    if self.playing && self.pos + 1 >= self.rec.len() {
                        self.goto(0);
                    }
                    true
                }
                KeyCode::Char('t') => {
                    self.prompt = Some(String::new());
                    true
                }
                KeyCode::Char('m' | 'r') => {
                    self.set_mark(Some(self.pos));
                    self.goto(self.pos);
                    true
                }
                KeyCode::Char('M') => {
                    self.set_mark(None);
                    self.goto(self.pos);
                    true
                }
                _ => false,
            };
            if handled {
                self.message = None;
                self.app.status = Some(self.status());
                return;
            }
        }
        self.app.handle_key(key);
    }

    /// While playing: the next snapshot; stops at the end.
    pub fn tick(&mut self) {
        if !self.playing {
            return;
        }
        if self.pos + 1 >= self.rec.len() {
            self.playing = false;
        } else {
            self.pos += 1;
        }
        self.goto(self.pos);
    }
}

#[cfg(test)]
mod tests {
    use ratatui::{Terminal, backend::TestBackend};

    use super::*;
    use crate::{
        reasons::Reasons,
        store::{
            tests::{KALLSYMS, named, record, snapshots},
            writer::Options,
        },
        symbols::Kallsyms,
        tui::ui,
    };

    fn key(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
    }

    fn settings(syms: Kallsyms) -> Settings {
        Settings {
            mode: crate::probe::Mode::Lazy,
            interval_ms: 1000,
            depth: 12,
            syms,
            reasons: Reasons::builtin(),
            kernel: crate::probe::KernelFacts::default(),
            spike_ns: 10_000_000,
            wakers: true,
            chain_depth: 4,
        }
    }

    fn screen(app: &App) -> String {
        let mut t = Terminal::new(TestBackend::new(120, 40)).unwrap();
        t.draw(|f| ui::render(f, app)).unwrap();
        let buf = t.backend().buffer().clone();
        buf.content()
            .chunks(120)
            .map(|row| {
                row.iter()
                    .map(ratatui::buffer::Cell::symbol)
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The live App fed snapshot by snapshot and the replay at the same index draw the same
    /// screen (the replay's extra status line aside).
    #[test]
    fn replay_shows_what_the_live_view_showed() {
        let snaps = snapshots(75);
        let rec = Recording::from_bytes(record(&snaps, Options::default())).unwrap();
        let rec_syms = rec.syms.clone();
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut live = App::new(settings(syms), String::new());
        let mut replay = Replay::new(rec, settings(rec_syms), 0, None).unwrap();
        for (i, snap) in snaps.iter().enumerate() {
            live.on_snapshot(snap.clone());
            replay.goto(i);
            replay.app.status = None;
            replay.app.footer = None;
            // Backtrace ids differ (a recording writes its own); what they name does not.
            let rows = |rows: &[crate::model::Row]| -> Vec<crate::model::Row> {
                rows.iter()
                    .map(|r| crate::model::Row {
                        stacks: Vec::new(),
                        ..r.clone()
                    })
                    .collect()
            };
            assert_eq!(rows(&live.global), rows(&replay.app.global), "snapshot {i}");
            assert_eq!(live.procs, replay.app.procs, "snapshot {i}");
            assert_eq!(live.header, replay.app.header, "snapshot {i}");
            assert_eq!(screen(&live), screen(&replay.app), "snapshot {i}");
        }
    }

    #[test]
    fn time_keys_move_and_mark() {
        let snaps = snapshots(30);
        let rec = Recording::from_bytes(record(&snaps, Options::default())).unwrap();
        let rec_syms = rec.syms.clone();
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let shown = |s: Option<&Snapshot>, r: &Replay| named(s.unwrap(), &r.rec.syms);
        let mut r = Replay::new(rec, settings(rec_syms), 29, None).unwrap();
        assert_eq!(shown(r.app.cur.as_ref(), &r), named(&snaps[29], &syms));
        r.handle_key(key('['));
        assert_eq!(r.pos, 28);
        r.handle_key(key('{'));
        assert_eq!(r.pos, 18);
        r.handle_key(key('}'));
        r.handle_key(key('}'));
        assert_eq!(r.pos, 29, "clamped at the end");
        // Jump to +10s: the snapshot taken 10 s after the first.
        r.handle_key(key('t'));
        for c in "+10s".chars() {
            r.handle_key(key(c));
        }
        r.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
        assert_eq!(r.pos, 10);
        assert_eq!(shown(r.app.cur.as_ref(), &r), named(&snaps[10], &syms));
        // A bad time leaves the position and says why.
        r.handle_key(key('t'));
        for c in "+99m".chars() {
            r.handle_key(key(c));
        }
        r.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
        assert_eq!(r.pos, 10);
        assert!(
            r.app
                .status
                .as_ref()
                .unwrap()
                .contains("after the recording ends")
        );
        // Mark A at 10, go to 20: the App shows the difference.
        r.handle_key(key('m'));
        for _ in 0..10 {
            r.handle_key(key(']'));
        }
        assert_eq!(shown(r.app.baseline.as_ref(), &r), named(&snaps[10], &syms));
        let sleeper = r.app.procs.iter().find(|p| p.tgid == 100).unwrap();
        // The sleeper's nanosleep record grew by 10 per snapshot: 100 sleeps from 10 to 20.
        let runq = 10; // and one run-queue wait per snapshot
        assert_eq!(sleeper.count, 100 + runq);
        assert!(r.app.status.as_ref().unwrap().contains("-> now: 10s"));
        r.handle_key(key('M'));
        assert_eq!(r.app.baseline, None);
        // Play runs to the end and stops.
        r.handle_key(key('p'));
        for _ in 0..20 {
            r.tick();
        }
        assert_eq!(r.pos, 29);
        assert!(!r.playing);
        // Other keys still reach the App.
        r.handle_key(key('s'));
        assert_eq!(r.app.sort, crate::model::SortKey::Max);
        r.handle_key(key('q'));
        assert!(r.app.quit);
    }
}

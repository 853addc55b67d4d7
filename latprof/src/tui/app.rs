//! The state of the TUI and its key handling: no I/O, so it is tested without a terminal.
use std::collections::BTreeSet;

use latprof_common::{GlobalRecord, Histogram};

use crate::{
    collect::{Snapshot, Spike},
    model::{self, Group, Header, ProcLine, Row, SortKey, Trace, ViewContext, WakerLine},
    probe::Mode,
    reasons::Reasons,
    symbols::Kallsyms,
};

/// Which pane has the keyboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    Global,
    Processes,
    Causes,
}

/// A drill-down: the row it shows and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detail {
    pub row: Row,
    pub from: Focus,
}

/// Which frames the detail's backtraces show (`u` cycles, where there are user frames).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Frames {
    /// The kernel's frames, then the user frames under them.
    #[default]
    Both,
    Kernel,
    User,
}

impl Frames {
    #[must_use]
    pub fn next(self) -> Self {
        match self {
            Self::Both => Self::Kernel,
            Self::Kernel => Self::User,
            Self::User => Self::Both,
        }
    }

    /// As the detail's title says it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Both => "kernel + user frames",
            Self::Kernel => "kernel frames only",
            Self::User => "user frames only",
        }
    }

    /// The detail's backtrace lines for `traces` (each innermost first): the kernel's frames,
    /// then under a `user:` heading the user frames, or one kind only.
    #[must_use]
    pub fn lines(self, traces: &[Trace]) -> Vec<TraceLine> {
        let mut out = Vec::new();
        for (i, trace) in traces.iter().enumerate() {
            out.push(TraceLine::Heading(i + 1));
            if self != Self::User {
                out.extend(
                    trace
                        .kernel
                        .lines()
                        .into_iter()
                        .map(|f| TraceLine::Kernel(f.to_owned())),
                );
            }
            if self == Self::Kernel {
                continue;
            }
            if trace.user.is_empty() {
                if self == Self::User {
                    out.push(TraceLine::NoUser);
                }
                continue;
            }
            if self == Self::Both {
                out.push(TraceLine::UserHeading);
            }
            out.extend(trace.user.iter().map(|f| {
                if f == crate::ustacks::TRUNCATED {
                    TraceLine::Truncated
                } else {
                    TraceLine::User(f.clone())
                }
            }));
        }
        out
    }
}

/// One line of the detail's backtraces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceLine {
    /// `Backtrace N`.
    Heading(usize),
    Kernel(String),
    /// The user frames start here (both kinds shown).
    UserHeading,
    User(String),
    /// The user backtrace was cut short: its outer frames are unknown.
    Truncated,
    /// User frames only, and this backtrace has none (a kernel thread, a wait for the CPU).
    NoUser,
}

/// Spikes kept for the recent-spikes pane.
pub const MAX_SPIKES: usize = 200;

/// Fixed for the session.
pub struct Settings {
    pub mode: Mode,
    pub interval_ms: u64,
    pub depth: usize,
    pub syms: Kallsyms,
    pub reasons: Reasons,
    /// The kernel's tick facts, for the counters tab.
    pub kernel: crate::probe::KernelFacts,
    /// The spike threshold (`--spike`), for the pane's title.
    pub spike_ns: u64,
    /// Sleeps are attributed to their wakers (`--wakers`, in this run or the recording's).
    pub wakers: bool,
    /// Levels of the wait chains the detail shows (`--chain-depth`; chains are shown where
    /// the snapshots have them, `--chains`).
    pub chain_depth: usize,
}

pub struct App {
    pub settings: Settings,
    /// First snapshot (elapsed time), previous (rates), current.
    pub first: Option<Snapshot>,
    pub prev: Option<Snapshot>,
    pub cur: Option<Snapshot>,
    /// Numbers are shown since this snapshot ('r' resets).
    pub baseline: Option<Snapshot>,
    /// While paused, the newest snapshot waits here.
    pub pending: Option<Snapshot>,
    pub paused: bool,
    pub group: Group,
    pub sort: SortKey,
    pub filter: String,
    /// Set while the user types a filter.
    pub editing: Option<String>,
    pub focus: Focus,
    pub selected: [usize; 3],
    pub expanded: BTreeSet<u32>,
    pub detail: Option<Detail>,
    pub help: bool,
    /// Which frames the detail shows.
    pub frames: Frames,
    /// A one-off answer to the last key (shown in the footer until the next key).
    pub notice: Option<String>,
    /// The counters tab (pipeline and tick counters) instead of the causes.
    pub counters: bool,
    pub quit: bool,
    /// A second header line (replay: where in the recording, and the interval shown; top: that
    /// cgroup views are not available).
    pub status: Option<String>,
    /// Replaces the key hints in the footer.
    pub footer: Option<String>,
    /// Recent spikes, newest last (at most `MAX_SPIKES`).
    pub spikes: std::collections::VecDeque<Spike>,
    /// Times the spike reader went to sleep (user-side counter of the pipeline).
    pub reader_sleeps: u64,
    // Derived from the above by `refresh`.
    pub header: Header,
    pub global: Vec<Row>,
    pub procs: Vec<ProcLine>,
    pub causes: Vec<Row>,
    /// The top pane lists the cgroups instead of the causes ('C').
    pub cgroups_view: bool,
    /// Every pane shows one cgroup only (Enter on a cgroup; Esc clears): its id and name.
    pub cgroup: Option<(u64, String)>,
    /// The cgroups since the baseline, most latency first (derived by `refresh`).
    pub cgroup_lines: Vec<CgroupLine>,
    /// What the panes show beside the rows (derived by `derive`).
    pub derived: Derived,
}

/// Spike lines the spikes pane shows (its height is this plus its borders).
pub const SPIKE_LINES: usize = 4;
/// Lines the detail's processes and wakers lists keep.
const DETAIL_LINES: usize = 50;

/// What the panes show beside the rows, derived from the state by `App::derive` (after each
/// snapshot, spike batch and key): drawing reads it and computes nothing.
#[derive(Default)]
pub struct Derived {
    /// The counters tab's text (while it is shown).
    pub counters_text: String,
    /// The newest spikes, newest first.
    pub spikes: Vec<SpikeLine>,
    /// The open detail's processes, wakers and histogram.
    pub detail: Option<DetailView>,
    /// The snapshot shown has user frames (`--user-stacks`, in this run or the recording's).
    pub user_frames: bool,
}

/// One line of the spikes pane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpikeLine {
    /// When it ended, wall-clock ns.
    pub wall_ns: u64,
    pub tgid: u32,
    pub comm: String,
    pub kind: &'static str,
    pub duration_ns: u64,
    pub waker: String,
    pub reason: String,
}

/// One part of a detail's waits with time of its own (`--chains`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BehindLine {
    pub share_pct: u64,
    pub own_ns: u64,
    /// What it was: the waker and its sleep, or what it did.
    pub leaf: String,
    /// The waker sleeps it was behind, from the nearest to the row's own wakers'.
    pub via: Vec<String>,
}

/// The detail's right-hand side.
#[derive(Clone, Debug, Default)]
pub struct DetailView {
    /// Live processes (pid, command, numbers since the baseline), largest first.
    pub processes: Vec<(u32, String, GlobalRecord)>,
    /// Who ended the row's sleeps, the most time first.
    pub wakers: Vec<WakerLine>,
    /// From the causes pane: the selected process, whose sleeps alone the wakers are.
    pub of_process: Option<u32>,
    /// With `--chains`: what the row's wakers were doing meanwhile, each part with time of
    /// its own, the largest first (`behind_lines`).
    pub behind: Vec<BehindLine>,
    /// The latency histogram since the baseline.
    pub histogram: Option<Histogram>,
    /// A cgroup is shown but the snapshot keeps histograms summed over cgroups (a
    /// recording's): the histogram is every cgroup's.
    pub histogram_all_cgroups: bool,
}

/// A line of the cgroups pane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLine {
    pub id: u64,
    pub name: String,
    pub removed: bool,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The reason with the largest total in it.
    pub top: String,
}

impl App {
    #[must_use]
    pub fn new(settings: Settings, filter: String) -> Self {
        Self {
            settings,
            first: None,
            prev: None,
            cur: None,
            baseline: None,
            pending: None,
            paused: false,
            group: Group::Reason,
            sort: SortKey::Total,
            filter,
            editing: None,
            focus: Focus::Global,
            selected: [0; 3],
            expanded: BTreeSet::new(),
            detail: None,
            help: false,
            frames: Frames::Both,
            notice: None,
            counters: false,
            quit: false,
            status: None,
            footer: None,
            spikes: std::collections::VecDeque::new(),
            reader_sleeps: 0,
            header: Header::default(),
            global: Vec::new(),
            procs: Vec::new(),
            causes: Vec::new(),
            cgroups_view: false,
            cgroup: None,
            cgroup_lines: Vec::new(),
            derived: Derived::default(),
        }
    }

    /// A new snapshot from the collector (or from a recording).
    pub fn on_snapshot(&mut self, snap: Snapshot) {
        if self.paused {
            self.pending = Some(snap);
            return;
        }
        self.apply(snap);
    }

    /// New spikes from the reader (or a recording), and its sleep count.
    pub fn on_spikes(&mut self, spikes: Vec<Spike>, reader_sleeps: u64) {
        self.spikes.extend(spikes);
        while self.spikes.len() > MAX_SPIKES {
            self.spikes.pop_front();
        }
        self.reader_sleeps = reader_sleeps;
        self.derived.spikes = self.spike_lines();
    }

    /// Shows a moment of a recording: the same three snapshots the live view held then, and
    /// the numbers since `baseline` (or since the start).
    pub fn show(
        &mut self,
        first: Snapshot,
        prev: Option<Snapshot>,
        cur: Snapshot,
        baseline: Option<Snapshot>,
    ) {
        self.first = Some(first);
        self.prev = prev;
        self.cur = Some(cur);
        self.baseline = baseline;
        self.pending = None;
        self.refresh();
        self.derive();
    }

    pub(super) fn apply(&mut self, snap: Snapshot) {
        if self.first.is_none() {
            self.first = Some(snap.clone());
        }
        self.prev = self.cur.replace(snap);
        self.refresh();
        self.derive();
    }

    fn ctx(&self) -> ViewContext<'_> {
        ViewContext {
            syms: &self.settings.syms,
            reasons: &self.settings.reasons,
            depth: self.settings.depth,
            group: self.group,
            sort: self.sort,
        }
    }

    /// Recomputes the rows of every pane from the snapshots and the settings (`derive` then
    /// computes what the panes show beside them: after a snapshot here, after a key in
    /// `handle_key`, so once each).
    pub(super) fn refresh(&mut self) {
        let (Some(cur), Some(first)) = (self.cur.as_ref(), self.first.as_ref()) else {
            return;
        };
        let base = self.baseline.as_ref();
        let ctx = self.ctx();
        let cgroup = self.cgroup.as_ref().map(|(id, _)| *id);
        let cgroup_rows = model::cgroups_since(cur, base, true);
        let records = match cgroup {
            Some(id) => cgroup_rows
                .iter()
                .find(|row| row.id == id)
                .map_or_else(Vec::new, |row| row.records.clone()),
            None => model::since(
                cur.global_records(),
                base.map(Snapshot::global_records).as_ref(),
            ),
        };
        let global = model::rows(&records, cur, &ctx);
        let cgroup_lines = cgroup_rows
            .into_iter()
            .map(|row| {
                let top = model::rows(&row.records, cur, &ctx)
                    .into_iter()
                    .max_by_key(|r| r.total_ns)
                    .map(|r| r.reason)
                    .unwrap_or_default();
                CgroupLine {
                    id: row.id,
                    name: row.name,
                    removed: row.removed,
                    count: row.count,
                    total_ns: row.total_ns,
                    max_ns: row.max_ns,
                    top,
                }
            })
            .collect();
        let procs = model::processes(cur, base, &ctx, &self.filter, &self.expanded, cgroup);
        let header = model::header(first, self.prev.as_ref(), cur);
        let selected = self.selected[1].min(procs.len().saturating_sub(1));
        let causes = match procs.get(selected) {
            Some(p) => model::selection_rows(cur, base, &ctx, p.tgid, p.tid),
            None => Vec::new(),
        };
        self.global = global;
        self.cgroup_lines = cgroup_lines;
        self.procs = procs;
        self.causes = causes;
        self.header = header;
        self.clamp();
        if let Some(detail) = &self.detail {
            // Follow the same row in the new numbers.
            let list = match detail.from {
                Focus::Global | Focus::Processes => &self.global,
                Focus::Causes => &self.causes,
            };
            if let Some(row) = list.iter().find(|r| r.label == detail.row.label) {
                self.detail = Some(Detail {
                    row: row.clone(),
                    from: detail.from,
                });
            }
        }
    }

    /// Derives what the panes show beside the rows (`derived`) from the state.
    pub fn derive(&mut self) {
        self.derived = Derived {
            counters_text: if self.counters {
                self.counters_text()
            } else {
                String::new()
            },
            spikes: self.spike_lines(),
            detail: self.detail.as_ref().map(|d| self.detail_view(d)),
            user_frames: self.has_user_frames(),
        };
    }

    fn detail_view(&self, detail: &Detail) -> DetailView {
        let (mut wakers, of_process) = self.row_wakers(detail);
        wakers.truncate(DETAIL_LINES);
        let mut processes = self.row_processes(&detail.row);
        processes.truncate(DETAIL_LINES);
        let behind = self.behind_lines(detail, of_process);
        DetailView {
            processes,
            wakers,
            of_process,
            behind,
            histogram: self.row_histogram(&detail.row),
            histogram_all_cgroups: self.cgroup.is_some() && !self.histograms_by_cgroup(),
        }
    }

    fn len(&self, focus: Focus) -> usize {
        match focus {
            Focus::Global if self.cgroups_view => self.cgroup_lines.len(),
            Focus::Global => self.global.len(),
            Focus::Processes => self.procs.len(),
            Focus::Causes => self.causes.len(),
        }
    }

    fn clamp(&mut self) {
        for (i, focus) in [Focus::Global, Focus::Processes, Focus::Causes]
            .into_iter()
            .enumerate()
        {
            let len = self.len(focus);
            self.selected[i] = self.selected[i].min(len.saturating_sub(1));
        }
    }

    /// Index of a pane in `selected`.
    #[must_use]
    pub fn pane(focus: Focus) -> usize {
        match focus {
            Focus::Global => 0,
            Focus::Processes => 1,
            Focus::Causes => 2,
        }
    }

    pub(super) fn move_by(&mut self, delta: isize) {
        let i = Self::pane(self.focus);
        let len = self.len(self.focus);
        let cur = self.selected[i].cast_signed();
        let max = len.saturating_sub(1).cast_signed();
        self.selected[i] = (cur + delta).clamp(0, max.max(0)).cast_unsigned();
        if self.focus == Focus::Processes {
            self.selected[2] = 0;
            self.refresh();
        }
    }

    /// The counters pane's text: pipeline and tick counters with rates since the previous
    /// snapshot.
    fn counters_text(&self) -> String {
        match &self.cur {
            Some(cur) => {
                crate::export::counters::render(&self.settings.kernel, self.prev.as_ref(), cur)
            }
            None => "waiting for the first snapshot".to_owned(),
        }
    }

    /// Who ended the detail's sleeps since the baseline, the most time first; from the causes
    /// pane, only the selected process's sleeps (its pid is returned).
    fn row_wakers(&self, detail: &Detail) -> (Vec<model::WakerLine>, Option<u32>) {
        let sleeper = match detail.from {
            Focus::Causes => self.procs.get(self.selected[1]).map(|p| p.tgid),
            Focus::Global | Focus::Processes => None,
        };
        let lines = self.cur.as_ref().map_or_else(Vec::new, |cur| {
            model::row_wakers(cur, self.baseline.as_ref(), &detail.row, sleeper)
        });
        (lines, sleeper)
    }

    /// With `--chains`: the parts of the detail's waits (of the process `sleeper`, or all)
    /// that have time of their own, leaf first, the largest first.
    fn behind_lines(&self, detail: &Detail, sleeper: Option<u32>) -> Vec<BehindLine> {
        let Some(cur) = &self.cur else {
            return Vec::new();
        };
        if cur.chains.is_empty() || self.settings.chain_depth == 0 {
            return Vec::new();
        }
        let chains = model::Chains::new(
            cur,
            self.baseline.as_ref(),
            &self.settings.syms,
            self.settings.depth,
            self.settings.chain_depth,
        );
        let parts = chains.of_ids(&detail.row.stacks, sleeper);
        let whole: u64 = parts.iter().map(|p| p.time_ns).sum();
        let label = |b: &model::Behind| model::part_label(b, |bt| self.settings.reasons.reason(bt));
        let mut lines: Vec<BehindLine> = model::Behind::leaves(&parts)
            .into_iter()
            .map(|(path, leaf, own)| BehindLine {
                share_pct: (own * 100).checked_div(whole).unwrap_or(0),
                own_ns: own,
                leaf: label(leaf),
                via: path.iter().rev().map(|b| label(b)).collect(),
            })
            .collect();
        lines.sort_by(|a, b| b.own_ns.cmp(&a.own_ns).then_with(|| a.leaf.cmp(&b.leaf)));
        lines.truncate(DETAIL_LINES);
        lines
    }

    /// A row's live processes (pid, command, numbers since the baseline), largest first.
    fn row_processes(&self, row: &Row) -> Vec<(u32, String, GlobalRecord)> {
        self.cur.as_ref().map_or_else(Vec::new, |cur| {
            model::row_processes(cur, self.baseline.as_ref(), row)
        })
    }

    /// Whether the snapshots keep histograms per cgroup (live ones do; a recording keeps the
    /// sums), so that a cgroup's histogram is its own.
    fn histograms_by_cgroup(&self) -> bool {
        self.cur
            .as_ref()
            .is_some_and(|c| !c.cgroup_histograms.is_empty())
    }

    /// A row's latency histogram since the baseline (in the cgroup shown, where the snapshot
    /// keeps histograms per cgroup).
    fn row_histogram(&self, row: &Row) -> Option<Histogram> {
        let cur = self.cur.as_ref()?;
        Some(match &self.cgroup {
            Some((id, _)) if !cur.cgroup_histograms.is_empty() => {
                model::row_histogram_in(cur, self.baseline.as_ref(), row, *id)
            }
            _ => model::row_histogram(cur, self.baseline.as_ref(), row),
        })
    }

    /// The newest spikes the pane shows, newest first, each with its wall-clock time and
    /// reason.
    fn spike_lines(&self) -> Vec<SpikeLine> {
        let Some(cur) = &self.cur else {
            return Vec::new();
        };
        self.spikes
            .iter()
            .rev()
            .take(SPIKE_LINES)
            .map(|s| SpikeLine {
                wall_ns: crate::time::wall_of(s.end_ns, (cur.wall_ns, cur.taken_ns)),
                tgid: s.tgid,
                comm: s.comm.clone(),
                kind: s.kind_letter(),
                duration_ns: s.duration_ns,
                waker: s.waker_word(),
                reason: model::spike_reason(
                    s,
                    cur,
                    &self.settings.syms,
                    &self.settings.reasons,
                    self.settings.depth,
                ),
            })
            .collect()
    }

    /// Whether the snapshot shown has user frames (`--user-stacks`, in this run or the
    /// recording's): from the data, so that `top` and `replay` decide alike.
    #[must_use]
    pub fn has_user_frames(&self) -> bool {
        self.cur.as_ref().is_some_and(|c| !c.user_parts.is_empty())
    }

    /// The row the cursor is on in a causes pane.
    #[must_use]
    pub fn selected_row(&self) -> Option<&Row> {
        match self.focus {
            Focus::Global if self.cgroups_view => None,
            Focus::Global => self.global.get(self.selected[0]),
            Focus::Causes => self.causes.get(self.selected[2]),
            Focus::Processes => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use latprof_common::{GlobalRecord, LatencyRecord, RUNQ_STACK};
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    use super::*;
    use crate::collect::TaskSnapshot;

    use crate::store::tests::KALLSYMS;

    fn rec(stack_id: u64, count: u64, total_ns: u64) -> LatencyRecord {
        LatencyRecord {
            stack_id,
            count,
            total_ns,
            max_ns: total_ns / count.max(1),
            cgroup: 0,
        }
    }

    /// pid 100 "sleeper" sleeps a lot, few times; pid 200 "piper" (two threads) often, briefly.
    fn snapshot(scale: u64) -> Snapshot {
        let mut snap = Snapshot {
            mode: Mode::Lazy,
            skip_kthreads: true,
            taken_ns: scale * 1_000_000_000,
            ..Snapshot::default()
        };
        snap.stacks
            .insert(1, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8120_0010]);
        snap.stacks
            .insert(2, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8130_0010]);
        snap.tasks = vec![
            TaskSnapshot {
                tid: 100,
                tgid: 100,
                comm: "sleeper".into(),
                kthread: false,
                task_only: 0,
                records: vec![rec(1, 10 * scale, 50_000_000 * scale)],
            },
            TaskSnapshot {
                tid: 200,
                tgid: 200,
                comm: "piper".into(),
                kthread: false,
                task_only: 0,
                records: vec![
                    rec(2, 500 * scale, 5_000_000 * scale),
                    rec(RUNQ_STACK, 3, 3000),
                ],
            },
            TaskSnapshot {
                tid: 201,
                tgid: 200,
                comm: "piper-helper".into(),
                kthread: false,
                task_only: 0,
                records: vec![rec(2, 400 * scale, 4_000_000 * scale)],
            },
        ];
        snap.global = vec![(
            1,
            GlobalRecord {
                count: 1,
                total_ns: 1,
                max_ns: 1,
            },
        )];
        snap
    }

    fn app() -> App {
        let mut app = App::new(
            Settings {
                mode: Mode::Lazy,
                interval_ms: 1000,
                depth: 12,
                syms: Kallsyms::parse(KALLSYMS).unwrap(),
                reasons: Reasons::builtin(),
                kernel: crate::probe::KernelFacts::default(),
                spike_ns: 10_000_000,
                wakers: true,
                chain_depth: 4,
            },
            String::new(),
        );
        app.on_snapshot(snapshot(1));
        app
    }

    fn key(app: &mut App, code: KeyCode) {
        app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
    }

    fn labels(rows: &[Row]) -> Vec<&str> {
        rows.iter().map(|r| r.label.as_str()).collect()
    }

    #[test]
    fn global_rows_have_reasons_sorted_by_total() {
        let app = app();
        assert_eq!(
            labels(&app.global),
            [
                "Application requested delay",
                "Waiting for a pipe",
                "Waiting for CPU"
            ]
        );
        assert_eq!(app.global[0].count, 11, "live tasks plus merged exits");
        assert_eq!(app.procs[0].comm, "sleeper");
        assert_eq!(app.procs[1].comm, "piper");
        assert_eq!(app.procs[1].threads, 2);
    }

    #[test]
    fn sort_cycles_through_columns() {
        let mut app = app();
        key(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort, SortKey::Max);
        assert_eq!(app.global[0].label, "Application requested delay");
        key(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort, SortKey::Count);
        assert_eq!(app.global[0].label, "Waiting for a pipe");
        key(&mut app, KeyCode::Char('s'));
        key(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort, SortKey::Total);
    }

    #[test]
    fn filter_by_name_or_pid() {
        let mut app = app();
        key(&mut app, KeyCode::Char('/'));
        for c in "sleep".chars() {
            key(&mut app, KeyCode::Char(c));
        }
        // Typing 'q' in the filter does not quit.
        key(&mut app, KeyCode::Char('q'));
        key(&mut app, KeyCode::Backspace);
        key(&mut app, KeyCode::Enter);
        assert_eq!(app.filter, "sleep");
        assert_eq!(app.procs.len(), 1);
        assert_eq!(app.procs[0].tgid, 100);
        assert!(!app.quit);
        key(&mut app, KeyCode::Esc);
        assert_eq!(app.procs.len(), 2);
        let app = App::new(app.settings, "201".into());
        let mut app = app;
        app.on_snapshot(snapshot(1));
        assert_eq!(app.procs.len(), 1, "a thread's tid finds its process");
        // A pid is a pid, not part of a name.
        let mut app = App::new(app.settings, "100".into());
        let mut snap = snapshot(1);
        snap.tasks[2].comm = "piper-100".into();
        app.on_snapshot(snap);
        assert_eq!(app.procs.len(), 1, "{:?}", app.procs);
        assert_eq!(app.procs[0].tgid, 100);
    }

    #[test]
    fn process_selection_shows_its_causes_and_threads_expand() {
        let mut app = app();
        key(&mut app, KeyCode::Tab);
        assert_eq!(app.focus, Focus::Processes);
        assert_eq!(labels(&app.causes), ["Application requested delay"]);
        key(&mut app, KeyCode::Down);
        assert_eq!(
            labels(&app.causes),
            ["Waiting for a pipe", "Waiting for CPU"]
        );
        key(&mut app, KeyCode::Right);
        assert_eq!(app.procs.len(), 4, "sleeper, piper and its two threads");
        key(&mut app, KeyCode::Down);
        assert_eq!(app.procs[app.selected[1]].tid, Some(200));
        assert_eq!(app.causes[0].count, 500);
        key(&mut app, KeyCode::Left);
        assert_eq!(app.procs.len(), 2);
        assert_eq!(app.procs[app.selected[1]].comm, "piper");
        key(&mut app, KeyCode::Up);
        assert_eq!(labels(&app.causes), ["Application requested delay"]);
    }

    #[test]
    fn enter_drills_down_and_esc_goes_back() {
        let mut app = app();
        key(&mut app, KeyCode::Enter);
        let detail = app.detail.clone().expect("detail");
        assert_eq!(
            detail.row.backtraces,
            [Trace {
                kernel: crate::symbols::Backtrace::Frames(vec!["hrtimer_nanosleep".to_owned()]),
                user: Vec::new(),
            }]
        );
        // The detail follows new numbers.
        app.on_snapshot(snapshot(2));
        assert_eq!(app.detail.as_ref().unwrap().row.count, 21);
        key(&mut app, KeyCode::Esc);
        assert!(app.detail.is_none());
    }

    #[test]
    fn pause_holds_snapshots_and_reset_counts_from_now() {
        let mut app = app();
        key(&mut app, KeyCode::Char(' '));
        app.on_snapshot(snapshot(2));
        assert_eq!(app.global[0].count, 11, "paused: old numbers");
        key(&mut app, KeyCode::Char(' '));
        assert_eq!(app.global[0].count, 21, "resumed: the held snapshot");
        key(&mut app, KeyCode::Char('r'));
        assert!(app.global.is_empty(), "{:?}", app.global);
        app.on_snapshot(snapshot(3));
        assert_eq!(app.global[0].count, 10, "counted since the reset");
    }

    #[test]
    fn group_by_backtrace_and_quit_keys() {
        let mut app = app();
        key(&mut app, KeyCode::Char('g'));
        assert_eq!(app.global[0].label, "hrtimer_nanosleep");
        key(&mut app, KeyCode::Char('?'));
        assert!(app.help);
        key(&mut app, KeyCode::Char('q'));
        assert!(!app.quit && !app.help, "q closes help first");
        key(&mut app, KeyCode::Char('q'));
        assert!(app.quit);
        let mut app = self::app();
        app.handle_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(app.quit);
    }

    /// The piper's pipe waits with the server's user frames (innermost first, cut short).
    fn with_user_frames(mut snap: Snapshot) -> Snapshot {
        let frame = |name: &str, module: &str| crate::ustacks::UserFrame {
            name: name.into(),
            module: module.into(),
            build_id: String::new(),
            offset: 0x1000,
            named: true,
            start_line: 0,
        };
        snap.user_parts.insert(2, 7);
        snap.user_stacks.insert(
            7,
            vec![
                frame("__GI___libc_read", "/usr/lib/libc.so.6"),
                frame("wait_for_request", "/srv/server"),
                frame("serve_requests", "/srv/server"),
                crate::ustacks::UserFrame::truncated(),
            ],
        );
        snap
    }

    fn screen(app: &App) -> String {
        use ratatui::{Terminal, backend::TestBackend};
        let mut terminal = Terminal::new(TestBackend::new(100, 30)).unwrap();
        terminal.draw(|f| super::super::ui::render(f, app)).unwrap();
        let buf = terminal.backend().buffer().clone();
        buf.content()
            .chunks(100)
            .map(|row| row.iter().map(ratatui::buffer::Cell::symbol).collect())
            .collect::<Vec<String>>()
            .join("\n")
    }

    /// The detail lists the kernel's frames, then under `user:` the user frames; `u` cycles
    /// both -> kernel -> user -> both, and the title says which.
    #[test]
    fn u_cycles_the_frames_of_the_detail() {
        let mut app = app();
        app.on_snapshot(with_user_frames(snapshot(2)));
        assert_eq!(
            app.global[1].label,
            "Waiting for a pipe in wait_for_request"
        );
        key(&mut app, KeyCode::Down);
        key(&mut app, KeyCode::Enter);
        let row = app.detail.clone().expect("detail").row;
        let user = |f: &str| TraceLine::User(f.to_owned());
        let kernel = TraceLine::Kernel("anon_pipe_read".to_owned());
        assert_eq!(
            app.frames.lines(&row.backtraces),
            [
                TraceLine::Heading(1),
                kernel.clone(),
                TraceLine::UserHeading,
                user("__GI___libc_read"),
                user("wait_for_request"),
                user("serve_requests"),
                TraceLine::Truncated,
            ]
        );
        let text = screen(&app);
        assert!(text.contains("Detail: kernel + user frames"), "{text}");
        let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("no {s}:\n{text}"));
        assert!(at("pipe_read") < at("user:"), "{text}");
        assert!(at("user:") < at("wait_for_request"), "{text}");
        assert!(
            at("serve_requests") < at("[truncated] (the outer"),
            "{text}"
        );

        key(&mut app, KeyCode::Char('u'));
        assert_eq!(app.frames, Frames::Kernel);
        assert_eq!(
            app.frames.lines(&row.backtraces),
            [TraceLine::Heading(1), kernel]
        );
        let text = screen(&app);
        assert!(text.contains("Detail: kernel frames only"), "{text}");
        assert!(
            !text.contains("wait_for_request") && !text.contains("user:"),
            "{text}"
        );

        key(&mut app, KeyCode::Char('u'));
        assert_eq!(app.frames, Frames::User);
        let lines = app.frames.lines(&row.backtraces);
        assert_eq!(lines[1], user("__GI___libc_read"));
        assert!(!lines.contains(&TraceLine::UserHeading), "{lines:?}");
        let text = screen(&app);
        assert!(text.contains("Detail: user frames only"), "{text}");
        assert!(!text.contains("pipe_read"), "{text}");

        // A backtrace without user frames says so when only those are shown.
        let bare = [Trace {
            kernel: crate::symbols::Backtrace::WaitingForCpu,
            user: Vec::new(),
        }];
        assert_eq!(
            Frames::User.lines(&bare),
            [TraceLine::Heading(1), TraceLine::NoUser]
        );
        assert_eq!(Frames::Both.lines(&bare), Frames::Kernel.lines(&bare));

        key(&mut app, KeyCode::Char('u'));
        assert_eq!(app.frames, Frames::Both);
        // Outside the detail the key says what the detail will show.
        key(&mut app, KeyCode::Esc);
        key(&mut app, KeyCode::Char('u'));
        assert_eq!(app.frames, Frames::Kernel);
        assert!(screen(&app).contains("u: the detail shows kernel frames only"));
    }

    /// Replay shows a recording's moment through `show`: its user frames come from the same
    /// snapshot fields as live ones, so the rows and the detail are the live view's.
    #[test]
    fn a_shown_moment_has_the_live_user_frames() {
        let mut live = app();
        live.on_snapshot(with_user_frames(snapshot(2)));
        let mut replay = app();
        replay.show(
            snapshot(1),
            Some(with_user_frames(snapshot(1))),
            with_user_frames(snapshot(2)),
            None,
        );
        assert!(replay.has_user_frames());
        assert_eq!(replay.global, live.global);
        assert_eq!(replay.global[1].backtraces[0].user[1], "wait_for_request");
    }

    /// Without user frames `u` changes nothing and says why; the next key clears that.
    #[test]
    fn u_without_user_frames_says_there_are_none() {
        let mut app = app();
        assert!(!app.has_user_frames());
        key(&mut app, KeyCode::Enter);
        key(&mut app, KeyCode::Char('u'));
        assert_eq!(app.frames, Frames::Both);
        assert!(app.detail.is_some());
        let text = screen(&app);
        assert!(text.contains("no user frames here"), "{text}");
        assert!(text.contains("Detail (Esc: back)"), "{text}");
        assert!(!text.contains("user:"), "{text}");
        key(&mut app, KeyCode::Esc);
        assert_eq!(app.notice, None);
        assert!(screen(&app).contains("u frames"), "the key legend lists it");
    }

    #[test]
    fn renders_in_80x24_without_panicking() {
        use ratatui::{Terminal, backend::TestBackend};
        let mut app = app();
        for size in [(80, 24), (200, 60), (40, 10)] {
            let mut terminal = Terminal::new(TestBackend::new(size.0, size.1)).unwrap();
            terminal
                .draw(|f| super::super::ui::render(f, &app))
                .unwrap();
            key(&mut app, KeyCode::Enter);
            terminal
                .draw(|f| super::super::ui::render(f, &app))
                .unwrap();
            key(&mut app, KeyCode::Esc);
        }
        let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
        terminal
            .draw(|f| super::super::ui::render(f, &app))
            .unwrap();
        let screen = format!("{:?}", terminal.backend().buffer());
        assert!(screen.contains("Application requested delay"), "{screen}");
    }
}

//! What reading a recording may cost: the bounds on decoding, scanning and memory per byte of
//! the file, the shape of the snapshot the frames rebuild (its memory known before it is
//! built), and what the views of a snapshot will hold.

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use latprof_common::{GlobalRecord, Histogram, LatencyRecord};

use super::{super::Body, Recording};
use crate::collect::{Snapshot, Spike, TaskSnapshot};

/// Frames may decode to this many bytes, plus this many per byte of the file, in all.
pub const DECODE_FLOOR: u64 = 64 << 20;
pub const DECODE_PER_BYTE: u64 = 64;
/// What the reader keeps (symbols, spikes, the index, a rebuilt snapshot) may take this many
/// bytes of memory, plus this many per byte of the file.
pub const MEMORY_FLOOR: u64 = 64 << 20;
pub const MEMORY_PER_BYTE: u64 = 32;
/// Bytes the reader may read and checksum in all, plus this many per byte of the file: a file
/// made of frame headers that each claim the rest of the file would otherwise have every one
/// of them read and checksummed (quadratic in its size).
pub const SCAN_FLOOR: u64 = 256 << 20;
pub const SCAN_PER_BYTE: u64 = 16;
/// Bytes of one cause of a view, beside its names: `size_of::<model::Cause>()` on 64-bit
/// targets (its backtrace, its user frames and three numbers), which the model's tests check
/// equal. A number here rather than the type: a recording is read below the views.
pub const CAUSE_BYTES: u64 = 72;
/// The views of a snapshot hold the names of its causes about this many times over while it
/// is shown: the causes, then the text made of them (OpenMetrics writes each cause's frames in
/// three families, and holds the labels and the whole text: measured, 5.5 times the names).
pub const VIEW_COPIES: u64 = 6;

/// The shape of the snapshot the frames so far rebuild (which tasks, records and backtraces),
/// without the snapshot: what rebuilding it will take in memory, known before replay needs it.
#[derive(Default)]
pub(super) struct Shape {
    /// Each task's records and the length of its name.
    tasks: HashMap<u32, (usize, usize)>,
    records: usize,
    names: usize,
    /// What each snapshot holds whole (counters, programs, ticks), as of the last frame.
    whole: usize,
    global: HashSet<u64>,
    hist: HashSet<u64>,
    stacks: HashMap<u64, usize>,
    frames: usize,
    cgroups: HashSet<latprof_common::CgroupCause>,
    /// Each cgroup's path length.
    paths: HashMap<u64, usize>,
    path_bytes: usize,
    /// Record ids with a user backtrace; each user backtrace's bytes (frames and names).
    user_parts: HashSet<u64>,
    user_stacks: HashMap<u64, usize>,
    user_bytes: usize,
}

impl Shape {
    pub(super) fn apply(&mut self, body: &Body, key: bool) {
        if key {
            *self = Self::default();
        }
        for (id, frames) in &body.stacks {
            if let Some(old) = self.stacks.insert(*id, frames.len()) {
                self.frames -= old;
            }
            self.frames += frames.len();
        }
        self.user_parts
            .extend(body.user_parts.iter().map(|(id, _)| *id));
        for (id, frames) in &body.user_stacks {
            let bytes = frames
                .iter()
                .map(|f| {
                    size_of::<crate::ustacks::UserFrame>()
                        + f.name.len()
                        + f.module.len()
                        + f.build_id.len()
                })
                .sum();
            if let Some(old) = self.user_stacks.insert(*id, bytes) {
                self.user_bytes -= old;
            }
            self.user_bytes += bytes;
        }
        for tid in &body.tasks_gone {
            let (records, name) = self.tasks.remove(tid).unwrap_or((0, 0));
            self.records -= records;
            self.names -= name;
        }
        for t in &body.tasks {
            let (records, name) = self
                .tasks
                .insert(t.tid, (t.records.len(), t.comm.len()))
                .unwrap_or((0, 0));
            self.records = self.records - records + t.records.len();
            self.names = self.names - name + t.comm.len();
        }
        self.whole = body.counters.len() * size_of::<u64>()
            + body.ticks.len() * size_of::<crate::collect::TickCounts>()
            + body
                .programs
                .iter()
                .map(|(name, _, _)| size_of::<(String, u64, u64)>() + name.len())
                .sum::<usize>();
        for id in &body.global_gone {
            self.global.remove(id);
        }
        self.global.extend(body.global.iter().map(|(id, _)| *id));
        for id in &body.hist_gone {
            self.hist.remove(id);
        }
        self.hist.extend(body.histograms.iter().map(|(id, _)| *id));
        for k in &body.cgroup_gone {
            self.cgroups.remove(k);
        }
        self.cgroups.extend(body.cgroups.iter().map(|(k, _)| *k));
        for id in &body.paths_gone {
            self.path_bytes -= self.paths.remove(id).unwrap_or(0);
        }
        for (id, p) in &body.paths {
            let len = p.path.as_ref().map_or(0, String::len);
            self.path_bytes -= self.paths.insert(*id, len).unwrap_or(0);
            self.path_bytes += len;
        }
    }

    /// Bytes of memory a rebuilt snapshot takes: the rebuilding state, the snapshot, and the
    /// copy a caller gets (three of each, roughly).
    pub(super) fn bytes(&self) -> u64 {
        let each = self.tasks.len() * size_of::<TaskSnapshot>()
            + self.names
            + self.whole
            + self.records * size_of::<LatencyRecord>()
            + self.global.len() * size_of::<(u64, GlobalRecord)>()
            + self.hist.len() * size_of::<(u64, Histogram)>()
            + self.stacks.len() * size_of::<(u64, Vec<u64>)>()
            + self.frames * size_of::<u64>()
            + self.cgroups.len() * size_of::<(latprof_common::CgroupCause, GlobalRecord)>()
            + self.paths.len() * size_of::<(u64, crate::cgroups::CgroupPath)>()
            + self.path_bytes
            + self.user_parts.len() * size_of::<(u64, u64)>()
            + self.user_stacks.len() * size_of::<(u64, Vec<crate::ustacks::UserFrame>)>()
            + self.user_bytes;
        3 * each as u64
    }
}

/// What is left of what reading a file may cost.
pub(super) struct Limits {
    pub(super) scan_left: u64,
    pub(super) decode_left: u64,
    pub(super) memory: u64,
    /// Memory held so far (symbols, spikes, the index).
    pub(super) held: u64,
}

impl Limits {
    pub(super) fn for_len(len: u64) -> Self {
        Self {
            scan_left: SCAN_FLOOR.saturating_add(len.saturating_mul(SCAN_PER_BYTE)),
            decode_left: DECODE_FLOOR.saturating_add(len.saturating_mul(DECODE_PER_BYTE)),
            memory: MEMORY_FLOOR.saturating_add(len.saturating_mul(MEMORY_PER_BYTE)),
            held: 0,
        }
    }
}

impl Recording {
    /// What the views of `snap` (and of `spikes`, whose backtraces it holds) take to show: every
    /// cause named frame by frame, once per record that names it (the processes, the cgroups,
    /// the wakers each name their own), and a few bytes per record. A few bytes of a recording
    /// can name one long symbol in every frame of thousands of backtraces, or one long user
    /// backtrace under every cause: decoding stays small, naming does not.
    #[must_use]
    pub fn view_bytes(&self, snap: &Snapshot, spikes: &[Spike]) -> u64 {
        let mut causes: HashMap<u64, u64> = HashMap::new();
        let mut cause = |id: u64| -> u64 {
            *causes
                .entry(id)
                .or_insert_with(|| self.cause_bytes(snap, id))
        };
        let mut total = 0u64;
        let mut add = |bytes: u64| total = total.saturating_add(bytes);
        for (id, _) in &snap.global {
            add(cause(*id));
        }
        for t in &snap.tasks {
            add(t.comm.len() as u64);
            for r in &t.records {
                add(cause(r.stack_id));
            }
        }
        for (k, _) in &snap.cgroups {
            add(cause(k.stack_id));
        }
        for p in snap.cgroup_paths.values() {
            add(p.path.as_ref().map_or(0, String::len) as u64);
        }
        for s in spikes {
            add(cause(s.stack_id) + (s.comm.len() + s.waker_comm.len()) as u64);
        }
        let mut wakers: HashMap<u64, u64> = HashMap::new();
        for w in &snap.wakers {
            add(cause(w.key.cause) + w.comm.len() as u64);
            if w.key.waker_stack != 0 {
                // A waker's backtrace is named whole before its tracing frames are dropped.
                add(*wakers.entry(w.key.waker_stack).or_insert_with(|| {
                    self.kernel_bytes(
                        snap.stacks.get(&w.key.waker_stack).map(Vec::as_slice),
                        usize::MAX,
                    )
                }));
            }
        }
        total
    }

    /// Memory the views may take for a snapshot: the budget that bounds what the reader keeps.
    #[must_use]
    pub fn view_budget(&self) -> u64 {
        self.view_budget
    }

    /// Refuses a snapshot whose views would take more than [`Self::view_budget`]: one line,
    /// before anything is named.
    pub fn check_views(&self, snap: &Snapshot, spikes: &[Spike]) -> Result<()> {
        let bytes = self.view_bytes(snap, spikes).saturating_mul(VIEW_COPIES);
        if bytes > self.view_budget {
            anyhow::bail!(
                "showing it would take about {} MiB of frame names, more than latprof allows for a file of {} bytes ({} MiB): its backtraces name long symbols many times over (not a recording latprof wrote?)",
                bytes >> 20,
                self.source.len(),
                self.view_budget >> 20
            );
        }
        Ok(())
    }

    /// Bytes of the names a cause of backtrace `id` shows: its kernel frames and its user
    /// frames (each at most [`Self::depth`]), and the cause itself.
    fn cause_bytes(&self, snap: &Snapshot, id: u64) -> u64 {
        let user = snap
            .user_parts
            .get(&id)
            .and_then(|u| snap.user_stacks.get(u))
            .map_or(0, |frames| {
                frames
                    .iter()
                    .take(self.depth)
                    .map(|f| (f.name.len() + size_of::<String>()) as u64)
                    .sum()
            });
        CAUSE_BYTES
            .saturating_add(self.kernel_bytes(snap.stacks.get(&id).map(Vec::as_slice), self.depth))
            .saturating_add(user)
    }

    /// Bytes of the names of at most `depth` frames of `frames`: the largest `depth`, since
    /// which frames a cause keeps (after the scheduler's) is the view's to choose.
    fn kernel_bytes(&self, frames: Option<&[u64]>, depth: usize) -> u64 {
        let Some(frames) = frames else {
            return 0;
        };
        // An address no symbol holds is shown as 0x and 16 hex digits.
        let mut each: Vec<u64> = frames
            .iter()
            .filter(|&&a| a != 0)
            .map(|&a| (self.syms.name(a).map_or(18, str::len) + size_of::<String>()) as u64)
            .collect();
        if depth == 0 {
            return 0;
        }
        if each.len() > depth {
            each.select_nth_unstable_by(depth - 1, |a, b| b.cmp(a));
            each.truncate(depth);
        }
        each.iter().sum()
    }
}

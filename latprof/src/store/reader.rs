//! Opens a recording: checks the header, indexes every whole frame (checksum, decode), keeps what
//! is intact and says what is not, and rebuilds the snapshot at any index.
//!
//! Any user may hand latprof a file, so reading one is bounded: the file is read a frame at a
//! time (never whole), frames decode to at most [`DECODE_PER_BYTE`] times the file's size in all
//! (a compression bomb stops there), and what the reader keeps in memory (symbols, spikes, the
//! largest snapshot it will rebuild) stays under [`MEMORY_PER_BYTE`] times the file's size. Both
//! have a floor, so small files are never refused for their size. latprof's own recordings use a
//! small part of either (docs/bench.md, "Measured while building").
//! What the views (dump's exports, replay's model) name from a snapshot is charged to the same
//! memory budget before they build anything ([`Recording::check_views`]): a few bytes can name
//! one long symbol in every frame of thousands of causes.
use std::{
    cell::RefCell,
    collections::{HashMap, HashSet},
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::Path,
};

use anyhow::{Context as _, Result};
use latprof_common::{GlobalRecord, Histogram, LatencyRecord};

use super::{
    Body, FILE_HEADER_LEN, FLAG_ZSTD, FRAME_HEADER_LEN, FormatError, KIND_DELTA, KIND_END,
    KIND_KEY, MAGIC, MAX_FRAME, RecordingInfo, SYNC, State, VERSION, codec::Dec,
};
use crate::{
    collect::{Snapshot, Spike, TaskSnapshot},
    files::open_regular,
    symbols::Kallsyms,
};

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
/// The views of a snapshot hold the names of its causes about this many times over while it
/// is shown: the causes, then the text made of them (OpenMetrics writes each cause's frames in
/// three families, and holds the labels and the whole text: measured, 5.5 times the names).
pub const VIEW_COPIES: u64 = 6;
/// Problems listed one by one; the rest are counted.
const PROBLEMS_LISTED: usize = 10;

/// A snapshot that can be rebuilt: its frame and the key frame its chain starts at.
#[derive(Clone, Debug)]
struct Entry {
    /// Where the frame's header starts.
    at: u64,
    stored_len: usize,
    compressed: bool,
    raw_len: usize,
    key: bool,
    /// Index (in `entries`) of the key frame this one builds on.
    key_at: usize,
    taken_ns: u64,
    wall_ns: u64,
    /// Memory its decoding was charged when indexed: reading it again may take no more.
    charged: u64,
}

/// Where a recording's bytes are: an open file, read a frame at a time, or bytes in memory.
enum Source {
    File(File, u64),
    Bytes(Vec<u8>),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Self::File(_, len) => *len,
            Self::Bytes(b) => b.len() as u64,
        }
    }

    /// `len` bytes at `at`, or fewer where the source ends.
    fn read(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len().saturating_sub(at))
            .unwrap_or(usize::MAX)
            .min(len);
        match self {
            Self::File(f, _) => {
                let mut buf = vec![0; len];
                f.read_exact_at(&mut buf, at)?;
                Ok(buf)
            }
            Self::Bytes(b) => {
                let at = usize::try_from(at).unwrap_or(usize::MAX).min(b.len());
                Ok(b[at..at + len.min(b.len() - at)].to_vec())
            }
        }
    }

    /// The next frame mark at or after `from`; what it reads is charged to `scan_left`.
    fn find_sync(&self, from: u64, scan_left: &mut u64) -> io::Result<Option<u64>> {
        const CHUNK: usize = 64 << 10;
        let mut at = from;
        while at < self.len() {
            let chunk = self.read(at, CHUNK)?;
            if let Some(i) = chunk.windows(SYNC.len()).position(|w| w == SYNC) {
                *scan_left = scan_left.saturating_sub((i + SYNC.len()) as u64);
                return Ok(Some(at + i as u64));
            }
            *scan_left = scan_left.saturating_sub(chunk.len() as u64);
            if chunk.len() < CHUNK {
                break;
            }
            // A mark split across two chunks is found in the next one.
            at += (CHUNK - SYNC.len() + 1) as u64;
        }
        Ok(None)
    }
}

pub struct Recording {
    pub version: u16,
    pub info: RecordingInfo,
    /// Symbols of every backtrace in the recording.
    pub syms: Kallsyms,
    /// What was damaged or missing, one line each (the first few; then how many more).
    pub problems: Vec<String>,
    /// Why the recorder stopped, when it finished cleanly.
    pub end: Option<String>,
    /// Spike events in the order they ended, with the reader's sleep count at each frame.
    pub spikes: Vec<(Spike, u64)>,
    /// Spikes the recorder left out (over `record --max-spikes` in an interval).
    pub spikes_not_recorded: u64,
    source: Source,
    entries: Vec<Entry>,
    cache: RefCell<Option<(usize, State)>>,
    /// Frames per backtrace the views show (see [`Self::set_depth`]).
    depth: usize,
    /// Bytes the views of one snapshot may take: the reader's memory budget for this file.
    view_budget: u64,
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// A frame's payload, decoded.
fn payload(data: &[u8], compressed: bool, raw_len: usize) -> Result<Vec<u8>, FormatError> {
    if !compressed {
        return Ok(data.to_vec());
    }
    let out = zstd::bulk::decompress(data, raw_len)
        .map_err(|_| FormatError::Malformed("zstd data does not decode"))?;
    if out.len() == raw_len {
        Ok(out)
    } else {
        Err(FormatError::Malformed(
            "decoded length differs from the header",
        ))
    }
}

/// The shape of the snapshot the frames so far rebuild (which tasks, records and backtraces),
/// without the snapshot: what rebuilding it will take in memory, known before replay needs it.
#[derive(Default)]
struct Shape {
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
    fn apply(&mut self, body: &Body, key: bool) {
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
    fn bytes(&self) -> u64 {
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
struct Limits {
    scan_left: u64,
    decode_left: u64,
    memory: u64,
    /// Memory held so far (symbols, spikes, the index).
    held: u64,
}

impl Limits {
    fn for_len(len: u64) -> Self {
        Self {
            scan_left: SCAN_FLOOR.saturating_add(len.saturating_mul(SCAN_PER_BYTE)),
            decode_left: DECODE_FLOOR.saturating_add(len.saturating_mul(DECODE_PER_BYTE)),
            memory: MEMORY_FLOOR.saturating_add(len.saturating_mul(MEMORY_PER_BYTE)),
            held: 0,
        }
    }
}

impl Recording {
    /// Reads and indexes `path`; every error is one line that names the file.
    pub fn open(path: &Path) -> Result<Self> {
        let (file, len) = open_regular(path)?;
        Self::read(Source::File(file, len)).map_err(|e| match e {
            ReadError::Format(e) => anyhow::anyhow!("{}: {e}", path.display()),
            ReadError::Io(e) => anyhow::anyhow!("cannot read {}: {e}", path.display()),
        })
    }

    pub fn from_bytes(data: Vec<u8>) -> Result<Self, FormatError> {
        Self::read(Source::Bytes(data)).map_err(|e| match e {
            ReadError::Format(e) => e,
            ReadError::Io(_) => unreachable!("bytes in memory are always read"),
        })
    }

    fn problem(&mut self, unlisted: &mut u64, line: String) {
        if self.problems.len() < PROBLEMS_LISTED {
            self.problems.push(line);
        } else {
            *unlisted += 1;
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one pass over the frames, every case in order"
    )]
    fn read(source: Source) -> Result<Self, ReadError> {
        let head = source.read(0, FILE_HEADER_LEN)?;
        if head.is_empty() {
            return Err(FormatError::Empty.into());
        }
        if head.len() < MAGIC.len() || head[..MAGIC.len()] != MAGIC {
            return Err(FormatError::NotARecording.into());
        }
        if head.len() < FILE_HEADER_LEN {
            return Err(FormatError::NoSnapshot(": the file ends inside its header".into()).into());
        }
        let version = u16::from_le_bytes([head[8], head[9]]);
        match version {
            0 => return Err(FormatError::ZeroVersion.into()),
            // Every version up to VERSION is read (1 has no tick counters).
            1..=VERSION => {}
            v => return Err(FormatError::FutureVersion(v).into()),
        }
        let file_len = source.len();
        let mut limits = Limits::for_len(file_len);
        let mut rec = Self {
            version,
            info: RecordingInfo::default(),
            syms: Kallsyms::default(),
            problems: Vec::new(),
            end: None,
            spikes: Vec::new(),
            spikes_not_recorded: 0,
            source,
            entries: Vec::new(),
            cache: RefCell::new(None),
            depth: 0,
            view_budget: limits.memory,
        };
        let mut unlisted = 0u64;
        let mut syms = Vec::new();
        let mut shape = Shape::default();
        let mut info: Option<RecordingInfo> = None;
        let mut chain: Option<usize> = None;
        let mut skipped = 0u64;
        let mut pos = FILE_HEADER_LEN as u64;
        while pos < file_len {
            if limits.scan_left == 0 {
                rec.problem(&mut unlisted, format!(
                    "from byte {pos} on, reading the frames would take more than latprof writes for a file of {file_len} bytes (damage on purpose?): the rest is not read"
                ));
                break;
            }
            let h = rec.source.read(pos, FRAME_HEADER_LEN)?;
            if h.len() < FRAME_HEADER_LEN {
                rec.problem(&mut unlisted, format!(
                    "the recording ends inside a frame header at byte {pos} (the recorder was killed, or its disk was full?): replayed up to the last whole frame"
                ));
                break;
            }
            let here = pos;
            let damaged = |what: &str| format!("frame at byte {here}: {what}");
            if h[..4] != SYNC {
                rec.problem(
                    &mut unlisted,
                    damaged("no frame mark where one should be; skipped to the next"),
                );
                chain = None;
                match rec.source.find_sync(pos + 1, &mut limits.scan_left)? {
                    Some(next) => {
                        pos = next;
                        continue;
                    }
                    None => break,
                }
            }
            let stored_len = le_u32(&h[4..8]) as usize;
            let kind = h[8];
            let flags = h[9];
            let raw_len = le_u32(&h[10..14]) as usize;
            let crc = le_u32(&h[14..18]);
            let start = pos + FRAME_HEADER_LEN as u64;
            let end = start.saturating_add(stored_len as u64);
            if end > file_len {
                if let Some(next) = rec.source.find_sync(pos + 4, &mut limits.scan_left)? {
                    rec.problem(
                        &mut unlisted,
                        damaged("length runs past the end of the file; skipped"),
                    );
                    chain = None;
                    pos = next;
                    continue;
                }
                rec.problem(&mut unlisted, format!(
                    "the recording ends inside the frame at byte {pos} (the recorder was killed, or its disk was full?): replayed up to the last whole frame"
                ));
                break;
            }
            let compressed = flags & FLAG_ZSTD != 0;
            if raw_len > MAX_FRAME
                || stored_len > MAX_FRAME
                || (!compressed && raw_len != stored_len)
            {
                rec.problem(
                    &mut unlisted,
                    damaged("larger than latprof writes; skipped"),
                );
                chain = None;
                pos = end;
                continue;
            }
            let need = raw_len as u64;
            if need > limits.decode_left || need > limits.memory - limits.held {
                rec.problem(&mut unlisted, format!(
                    "from byte {pos} on, the frames decode to more than latprof writes for a file of {file_len} bytes (a compression bomb?): the rest is not read"
                ));
                break;
            }
            if stored_len as u64 > limits.scan_left {
                rec.problem(&mut unlisted, format!(
                    "from byte {pos} on, reading the frames would take more than latprof writes for a file of {file_len} bytes (damage on purpose?): the rest is not read"
                ));
                break;
            }
            limits.scan_left -= stored_len as u64;
            let stored = rec.source.read(start, stored_len)?;
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&h[4..14]);
            hasher.update(&stored);
            if hasher.finalize() != crc {
                rec.problem(&mut unlisted, damaged("checksum mismatch; skipped"));
                chain = None;
                match rec.source.find_sync(pos + 4, &mut limits.scan_left)? {
                    Some(next) => {
                        pos = next;
                        continue;
                    }
                    None => break,
                }
            }
            pos = end;
            limits.decode_left -= need;
            let decoded = match payload(&stored, compressed, raw_len) {
                Ok(bytes) => bytes,
                Err(e) => {
                    rec.problem(&mut unlisted, damaged(&format!("{e}; skipped")));
                    chain = None;
                    continue;
                }
            };
            drop(stored);
            let at = start - FRAME_HEADER_LEN as u64;
            let room = (limits.memory - limits.held).saturating_sub(shape.bytes());
            let mut d = Dec::with_budget(&decoded, room);
            let parsed = match kind {
                KIND_KEY => RecordingInfo::decode(&mut d, version)
                    .and_then(|i| Ok((Some(i), Body::decode(&mut d, version)?))),
                KIND_DELTA => Body::decode(&mut d, version).map(|b| (None, b)),
                super::KIND_SPIKES => {
                    // Standalone: damage elsewhere never costs spikes.
                    match super::decode_spikes(&mut d, version) {
                        Ok((spikes, sleeps, left_out)) if d.is_empty() => {
                            limits.held += d.charged();
                            rec.spikes.extend(spikes.into_iter().map(|s| (s, sleeps)));
                            rec.spikes_not_recorded = rec.spikes_not_recorded.max(left_out);
                        }
                        Err(FormatError::TooBig) => {
                            rec.problem(&mut unlisted, format!(
                                "from byte {at} on, the spikes take more memory than latprof writes for a file of {file_len} bytes: the rest is not read"
                            ));
                            break;
                        }
                        _ => rec.problem(
                            &mut unlisted,
                            format!("frame at byte {at}: spike events do not decode; skipped"),
                        ),
                    }
                    continue;
                }
                KIND_END => {
                    rec.end = Some(
                        Dec::new(&decoded)
                            .str()
                            .unwrap_or_else(|_| "finished".into()),
                    );
                    continue;
                }
                // A later version 1 writer may add frame kinds; they are not needed to replay.
                _ => continue,
            };
            let (frame_info, body) = match parsed {
                Ok(p) if d.is_empty() => p,
                Err(FormatError::TooBig) => {
                    rec.problem(&mut unlisted, format!(
                        "from byte {at} on, the snapshots take more memory than latprof writes for a file of {file_len} bytes: the rest is not read"
                    ));
                    break;
                }
                other => {
                    // Why, where the decoder says (a backtrace deeper than latprof takes).
                    let why = match other {
                        Err(FormatError::Malformed(why)) => format!(" ({why})"),
                        _ => String::new(),
                    };
                    rec.problem(
                        &mut unlisted,
                        format!("frame at byte {at}: contents do not decode{why}; skipped"),
                    );
                    chain = None;
                    continue;
                }
            };
            let key = frame_info.is_some();
            if key {
                chain = Some(rec.entries.len());
            }
            let Some(key_at) = chain else {
                skipped += 1;
                continue;
            };
            shape.apply(&body, key);
            let kept: u64 = body
                .syms
                .iter()
                .map(|(_, name)| (size_of::<(u64, String)>() + name.len()) as u64)
                .sum::<u64>()
                + size_of::<Entry>() as u64;
            if limits.held + kept + shape.bytes() > limits.memory {
                rec.problem(&mut unlisted, format!(
                    "from byte {at} on, the snapshots take more memory than latprof writes for a file of {file_len} bytes: the rest is not read"
                ));
                break;
            }
            limits.held += kept;
            // The facts of the first key frame whose snapshot is kept.
            if let Some(i) = frame_info {
                info.get_or_insert(i);
            }
            syms.extend(body.syms);
            rec.entries.push(Entry {
                at,
                stored_len,
                compressed,
                raw_len,
                key,
                key_at,
                taken_ns: body.taken_ns,
                wall_ns: body.wall_ns,
                charged: d.charged(),
            });
        }
        if skipped > 0 {
            rec.problem(&mut unlisted, format!(
                "{skipped} snapshots after a damaged frame could not be rebuilt (they build on it) and were left out"
            ));
        }
        if unlisted > 0 {
            rec.problems
                .push(format!("{unlisted} more problems like these, not listed"));
        }
        let Some(info) = info.filter(|_| !rec.entries.is_empty()) else {
            let why = if rec.problems.is_empty() {
                String::new()
            } else {
                format!(": {}", rec.problems.join("; "))
            };
            return Err(FormatError::NoSnapshot(why).into());
        };
        rec.spikes.sort_by_key(|(s, _)| s.end_ns);
        rec.syms = Kallsyms::from_parts(syms, info.sched_text.clone(), info.lock_text.clone());
        rec.depth = usize::from(info.stack_depth);
        rec.info = info;
        Ok(rec)
    }

    /// Snapshots that can be shown.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The last `max` spikes that ended by `until_ns` (CLOCK_MONOTONIC), and the reader's
    /// sleep count then.
    #[must_use]
    pub fn spikes_until(&self, until_ns: u64, max: usize) -> (Vec<Spike>, u64) {
        let n = self.spikes.partition_point(|(s, _)| s.end_ns <= until_ns);
        let from = n.saturating_sub(max);
        let sleeps = n.checked_sub(1).map_or(0, |i| self.spikes[i].1);
        (
            self.spikes[from..n]
                .iter()
                .map(|(s, _)| s.clone())
                .collect(),
            sleeps,
        )
    }

    /// CLOCK_MONOTONIC and wall-clock time of snapshot `i`.
    #[must_use]
    pub fn times(&self, i: usize) -> (u64, u64) {
        let e = &self.entries[i.min(self.entries.len() - 1)];
        (e.taken_ns, e.wall_ns)
    }

    /// Frame `i` read again: the file is read a frame at a time, so a file changed since it
    /// was opened is an error here (its checksum no longer holds), not a wrong snapshot.
    fn body(&self, i: usize) -> Result<Body> {
        let e = &self.entries[i];
        let changed = || anyhow::anyhow!("the recording changed since it was opened");
        let frame = self
            .source
            .read(e.at, FRAME_HEADER_LEN + e.stored_len)
            .context("reading the recording again")?;
        if frame.len() != FRAME_HEADER_LEN + e.stored_len {
            return Err(changed());
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&frame[4..FRAME_HEADER_LEN - 4]);
        hasher.update(&frame[FRAME_HEADER_LEN..]);
        if hasher.finalize() != le_u32(&frame[FRAME_HEADER_LEN - 4..FRAME_HEADER_LEN]) {
            return Err(changed());
        }
        // It decoded within its charge when the file was indexed: the same bytes do again, and
        // bytes changed under the same checksum get no more.
        let bytes =
            payload(&frame[FRAME_HEADER_LEN..], e.compressed, e.raw_len).map_err(|_| changed())?;
        let mut d = Dec::with_budget(&bytes, e.charged);
        if e.key {
            RecordingInfo::decode(&mut d, self.version).map_err(|_| changed())?;
        }
        Body::decode(&mut d, self.version).map_err(|_| changed())
    }

    /// The snapshot at index `i` (clamped), rebuilt from its key frame.
    pub fn snapshot(&self, i: usize) -> Result<Snapshot> {
        let i = i.min(self.entries.len() - 1);
        let key_at = self.entries[i].key_at;
        let mut cache = self.cache.borrow_mut();
        let (mut at, mut state) = match cache.take() {
            Some((at, state)) if at >= key_at && at <= i => (at, state),
            _ => {
                let mut state = State::default();
                state.apply(self.body(key_at)?, true);
                (key_at, state)
            }
        };
        while at < i {
            at += 1;
            state.apply(self.body(at)?, false);
        }
        let snap = state.snap.clone();
        *cache = Some((at, state));
        drop(cache);
        self.check_views(&snap, &[])
            .map_err(|e| anyhow::anyhow!("snapshot #{i}: {e}"))?;
        Ok(snap)
    }

    /// Frames per backtrace the views show: `--stack-depth` where given, else the recording's.
    pub fn set_depth(&mut self, depth: Option<u16>) {
        if let Some(depth) = depth {
            self.depth = usize::from(depth);
        }
    }

    #[must_use]
    pub fn depth(&self) -> usize {
        self.depth
    }

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
        (size_of::<crate::model::Cause>() as u64)
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

/// Why a recording could not be read: its contents, or the file.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Recording {
    /// The snapshot a user means by `spec`: `start`, `end`, `+30s` (after the first snapshot),
    /// `-10s` (before the last), `12:03` or `12:03:10` (local time), `#N` (index). A time
    /// between two snapshots means the last one taken at or before it.
    pub fn find(&self, spec: &str) -> Result<usize, String> {
        let spec = spec.trim();
        let last = self.len() - 1;
        let (first_mono, first_wall) = self.times(0);
        let (last_mono, _) = self.times(last);
        let at_or_before = |pick: &dyn Fn(usize) -> u64, t: u64| -> Result<usize, String> {
            let n = (0..self.len()).take_while(|&i| pick(i) <= t).count();
            n.checked_sub(1)
                .ok_or_else(|| format!("'{spec}' is before the recording starts"))
        };
        let mono = |i: usize| self.times(i).0;
        match spec {
            "start" => return Ok(0),
            "end" => return Ok(last),
            _ => {}
        }
        if let Some(n) = spec.strip_prefix('#') {
            let n: usize = n
                .parse()
                .map_err(|_| format!("'{spec}': # takes a snapshot number"))?;
            return if n <= last {
                Ok(n)
            } else {
                Err(format!(
                    "'{spec}': the recording has {} snapshots",
                    last + 1
                ))
            };
        }
        if let Some(d) = spec.strip_prefix('+') {
            let d = crate::time::parse_duration(d)?;
            // The snapshot nearest to the time asked for, not one interval early.
            let t = first_mono
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .saturating_add(self.info.interval_ns / 2);
            if t > last_mono + self.info.interval_ns {
                return Err(format!(
                    "'{spec}' is after the recording ends (+{})",
                    crate::time::format_duration(std::time::Duration::from_nanos(
                        last_mono - first_mono
                    ))
                ));
            }
            return at_or_before(&mono, t);
        }
        if let Some(d) = spec.strip_prefix('-') {
            let d = crate::time::parse_duration(d)?;
            let t = last_mono
                .checked_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .ok_or_else(|| format!("'{spec}' is before the recording starts"))?
                .saturating_add(self.info.interval_ns / 2);
            return at_or_before(&mono, t);
        }
        let parts: Vec<&str> = spec.split(':').collect();
        let nums: Option<Vec<u64>> = parts.iter().map(|p| p.parse().ok()).collect();
        match nums.as_deref() {
            Some(&[h, m] | &[h, m, _]) if h < 24 && m < 60 => {
                let s = if parts.len() == 3 {
                    nums.as_ref().map_or(0, |n| n[2])
                } else {
                    0
                };
                if s >= 60 {
                    return Err(format!("'{spec}' is not a time of day"));
                }
                let (start_of_day, midnight) = crate::time::local_day(first_wall);
                let mut secs = h * 3600 + m * 60 + s;
                // A time earlier in the day than the start means the next day.
                if secs < start_of_day {
                    secs += 86_400;
                }
                let wall = |i: usize| self.times(i).1;
                let target = midnight + secs * 1_000_000_000;
                if target > wall(last) + self.info.interval_ns {
                    return Err(format!(
                        "'{spec}' is outside the recording ({} to {})",
                        crate::time::local_hms(first_wall),
                        crate::time::local_hms(wall(last))
                    ));
                }
                at_or_before(&wall, target + 999_999_999)
            }
            _ => Err(format!(
                "'{spec}' is not a time (examples: +30s, -10s, 12:03:10, start, end, #5)"
            )),
        }
    }
}

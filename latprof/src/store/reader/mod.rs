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
mod budget;
mod find;
mod gaps;
mod source;

pub use budget::{
    CAUSE_BYTES, DECODE_FLOOR, DECODE_PER_BYTE, MEMORY_FLOOR, MEMORY_PER_BYTE, SCAN_FLOOR,
    SCAN_PER_BYTE, VIEW_COPIES,
};

use std::{cell::RefCell, io, path::Path};

use anyhow::{Context as _, Result};

use super::{
    Body, FILE_HEADER_LEN, FLAG_ZSTD, FRAME_HEADER_LEN, FormatError, KIND_DELTA, KIND_END,
    KIND_KEY, MAGIC, MAX_FRAME, RecordingInfo, SYNC, State, VERSION, codec::Dec,
};
use crate::{
    collect::{Snapshot, Spike},
    files::open_regular,
    symbols::Kallsyms,
};
use budget::{Limits, Shape};
use source::{Source, le_u32, payload};

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
        // Frames left out of a damaged file would read as gaps: said only for whole files.
        if let Some(info) = info.as_ref().filter(|_| rec.problems.is_empty()) {
            let times: Vec<(u64, u64)> = rec
                .entries
                .iter()
                .map(|e| (e.taken_ns, e.wall_ns))
                .collect();
            rec.problems.extend(gaps::lines(
                &gaps::find(&times, info.interval_ns),
                info.interval_ns,
            ));
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
}

/// Why a recording could not be read: its contents, or the file.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

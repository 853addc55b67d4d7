//! Opens a recording: checks the header, indexes every whole frame (checksum, decode), keeps what
//! is intact and says what is not, and rebuilds the snapshot at any index.
use std::{cell::RefCell, ops::Range, path::Path};

use anyhow::{Context as _, Result};

use super::{
    Body, FILE_HEADER_LEN, FLAG_ZSTD, FRAME_HEADER_LEN, FormatError, KIND_DELTA, KIND_END,
    KIND_KEY, MAGIC, MAX_FRAME, RecordingInfo, SYNC, State, VERSION, codec::Dec,
};
use crate::{collect::Snapshot, symbols::Kallsyms};

/// A snapshot that can be rebuilt: its frame and the key frame its chain starts at.
#[derive(Clone, Debug)]
struct Entry {
    payload: Range<usize>,
    compressed: bool,
    raw_len: usize,
    key: bool,
    /// Index (in `entries`) of the key frame this one builds on.
    key_at: usize,
    taken_ns: u64,
    wall_ns: u64,
}

pub struct Recording {
    pub version: u16,
    pub info: RecordingInfo,
    /// Symbols of every backtrace in the recording.
    pub syms: Kallsyms,
    /// What was damaged or missing, one line each.
    pub problems: Vec<String>,
    /// Why the recorder stopped, when it finished cleanly.
    pub end: Option<String>,
    /// Spike events in the order they ended, with the reader's sleep count at each frame.
    pub spikes: Vec<(crate::collect::Spike, u64)>,
    /// Spikes the recorder left out (over `record --max-spikes` in an interval).
    pub spikes_not_recorded: u64,
    data: Vec<u8>,
    entries: Vec<Entry>,
    cache: RefCell<Option<(usize, State)>>,
}

fn find_sync(data: &[u8], from: usize) -> Option<usize> {
    data.get(from..)?
        .windows(SYNC.len())
        .position(|w| w == SYNC)
        .map(|i| from + i)
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

impl Recording {
    /// Reads and indexes `path`; every error is one line that names the file.
    pub fn open(path: &Path) -> Result<Self> {
        let data =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_bytes(data).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    pub fn from_bytes(data: Vec<u8>) -> Result<Self, FormatError> {
        if data.is_empty() {
            return Err(FormatError::Empty);
        }
        if data.len() < MAGIC.len() || data[..MAGIC.len()] != MAGIC {
            return Err(FormatError::NotARecording);
        }
        if data.len() < FILE_HEADER_LEN {
            return Err(FormatError::NoSnapshot(
                ": the file ends inside its header".into(),
            ));
        }
        let version = u16::from_le_bytes([data[8], data[9]]);
        match version {
            0 => return Err(FormatError::ZeroVersion),
            // Every version up to VERSION is read (1 has no tick counters).
            1..=VERSION => {}
            v => return Err(FormatError::FutureVersion(v)),
        }
        let mut rec = Self {
            version,
            info: RecordingInfo::default(),
            syms: Kallsyms::default(),
            problems: Vec::new(),
            end: None,
            spikes: Vec::new(),
            spikes_not_recorded: 0,
            data: Vec::new(),
            entries: Vec::new(),
            cache: RefCell::new(None),
        };
        let mut syms = Vec::new();
        let mut info: Option<RecordingInfo> = None;
        let mut chain: Option<usize> = None;
        let mut skipped = 0u64;
        let mut pos = FILE_HEADER_LEN;
        while pos < data.len() {
            if data[pos..].len() < FRAME_HEADER_LEN {
                rec.problems.push(format!(
                    "the recording ends inside a frame header at byte {pos} (the recorder was killed?): replayed up to the last whole frame"
                ));
                break;
            }
            let damaged = |rec: &mut Self, what: &str| {
                rec.problems.push(format!("frame at byte {pos}: {what}"));
            };
            if data[pos..pos + 4] != SYNC {
                damaged(
                    &mut rec,
                    "no frame mark where one should be; skipped to the next",
                );
                chain = None;
                match find_sync(&data, pos + 1) {
                    Some(next) => {
                        pos = next;
                        continue;
                    }
                    None => break,
                }
            }
            let h = &data[pos..pos + FRAME_HEADER_LEN];
            let stored_len = le_u32(&h[4..8]) as usize;
            let kind = h[8];
            let flags = h[9];
            let raw_len = le_u32(&h[10..14]) as usize;
            let crc = le_u32(&h[14..18]);
            let start = pos + FRAME_HEADER_LEN;
            let end = start.saturating_add(stored_len);
            if end > data.len() {
                if let Some(next) = find_sync(&data, pos + 4) {
                    damaged(&mut rec, "length runs past the end of the file; skipped");
                    chain = None;
                    pos = next;
                    continue;
                }
                rec.problems.push(format!(
                    "the recording ends inside the frame at byte {pos} (the recorder was killed?): replayed up to the last whole frame"
                ));
                break;
            }
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&h[4..14]);
            hasher.update(&data[start..end]);
            if hasher.finalize() != crc {
                damaged(&mut rec, "checksum mismatch; skipped");
                chain = None;
                match find_sync(&data, pos + 4) {
                    Some(next) => {
                        pos = next;
                        continue;
                    }
                    None => break,
                }
            }
            pos = end;
            let compressed = flags & FLAG_ZSTD != 0;
            if raw_len > MAX_FRAME {
                rec.problems.push(format!(
                    "frame at byte {}: larger than latprof writes; skipped",
                    start - FRAME_HEADER_LEN
                ));
                chain = None;
                continue;
            }
            let decoded = match payload(&data[start..end], compressed, raw_len) {
                Ok(bytes) => bytes,
                Err(e) => {
                    rec.problems.push(format!(
                        "frame at byte {}: {e}; skipped",
                        start - FRAME_HEADER_LEN
                    ));
                    chain = None;
                    continue;
                }
            };
            let mut d = Dec::new(&decoded);
            let parsed = match kind {
                KIND_KEY => RecordingInfo::decode(&mut d, version)
                    .and_then(|i| Ok((Some(i), Body::decode(&mut d, version)?))),
                KIND_DELTA => Body::decode(&mut d, version).map(|b| (None, b)),
                super::KIND_SPIKES => {
                    // Standalone: damage elsewhere never costs spikes.
                    match super::decode_spikes(&mut d) {
                        Ok((spikes, sleeps, left_out)) if d.is_empty() => {
                            rec.spikes.extend(spikes.into_iter().map(|s| (s, sleeps)));
                            rec.spikes_not_recorded = rec.spikes_not_recorded.max(left_out);
                        }
                        _ => rec.problems.push(format!(
                            "frame at byte {}: spike events do not decode; skipped",
                            start - FRAME_HEADER_LEN
                        )),
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
                Ok(_) | Err(_) => {
                    rec.problems.push(format!(
                        "frame at byte {}: contents do not decode; skipped",
                        start - FRAME_HEADER_LEN
                    ));
                    chain = None;
                    continue;
                }
            };
            let key = frame_info.is_some();
            if let Some(i) = frame_info {
                info.get_or_insert(i);
                chain = Some(rec.entries.len());
            }
            let Some(key_at) = chain else {
                skipped += 1;
                continue;
            };
            syms.extend(body.syms);
            rec.entries.push(Entry {
                payload: start..end,
                compressed,
                raw_len,
                key,
                key_at,
                taken_ns: body.taken_ns,
                wall_ns: body.wall_ns,
            });
        }
        if skipped > 0 {
            rec.problems.push(format!(
                "{skipped} snapshots after a damaged frame could not be rebuilt (they build on it) and were left out"
            ));
        }
        let Some(info) = info else {
            let why = if rec.problems.is_empty() {
                String::new()
            } else {
                format!(": {}", rec.problems.join("; "))
            };
            return Err(FormatError::NoSnapshot(why));
        };
        rec.spikes.sort_by_key(|(s, _)| s.end_ns);
        rec.syms = Kallsyms::from_parts(syms, info.sched_text.clone(), info.lock_text.clone());
        rec.info = info;
        rec.data = data;
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
    pub fn spikes_until(&self, until_ns: u64, max: usize) -> (Vec<crate::collect::Spike>, u64) {
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

    fn body(&self, i: usize) -> Body {
        let e = &self.entries[i];
        // Every entry decoded once already when the file was indexed.
        let bytes = payload(&self.data[e.payload.clone()], e.compressed, e.raw_len)
            .expect("indexed frames decode");
        let mut d = Dec::new(&bytes);
        if e.key {
            RecordingInfo::decode(&mut d, self.version).expect("indexed frames decode");
        }
        Body::decode(&mut d, self.version).expect("indexed frames decode")
    }

    /// The snapshot at index `i` (clamped), rebuilt from its key frame.
    #[must_use]
    pub fn snapshot(&self, i: usize) -> Snapshot {
        let i = i.min(self.entries.len() - 1);
        let key_at = self.entries[i].key_at;
        let mut cache = self.cache.borrow_mut();
        let (mut at, mut state) = match cache.take() {
            Some((at, state)) if at >= key_at && at <= i => (at, state),
            _ => {
                let mut state = State::default();
                state.apply(self.body(key_at), true);
                (key_at, state)
            }
        };
        while at < i {
            at += 1;
            state.apply(self.body(at), false);
        }
        let snap = state.snap.clone();
        *cache = Some((at, state));
        snap
    }
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

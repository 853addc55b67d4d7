//! Recordings (`.lpr`): raw cumulative snapshots, appended one frame at a time.
//!
//! File: an 8-byte magic, the format version (u16 LE), 2 reserved bytes; then frames. A frame is
//! a 4-byte sync mark, a header (payload length u32, kind u8, flags u8, decoded length u32) and
//! its payload, with a CRC-32 over header and payload. A key frame holds everything (the
//! recording's facts, the whole snapshot, the backtraces and symbols it names); a delta frame
//! holds what changed since the frame before. Each file starts with a key frame and one follows
//! every [`KEY_EVERY`] snapshots, so a damaged frame costs at most the snapshots up to the next
//! key frame, and a file cut anywhere (SIGKILL, power loss) replays up to its last whole frame.
mod body;
mod chains;
pub mod codec;
mod info;
pub mod reader;
mod spikes;
mod state;
pub mod writer;

pub use body::Body;
pub use info::RecordingInfo;
pub use spikes::{decode_spikes, encode_spikes};
pub use state::State;

use latprof_common::{COUNTER_COUNT, USER_FRAMES, USER_WINDOW};

use crate::collect::Counters;
use codec::Dec;

pub const MAGIC: [u8; 8] = *b"\x7fLATPROF";
/// The version this latprof writes; it reads every version from 1 to this one.
/// Version 2 added the per-CPU tick counters and the kernel's tick facts; 3 the programs'
/// variant; 4 which task records stay out of the global table (`TaskSnapshot::task_only`); 5
/// cgroups: each task record's cgroup id, the per-cgroup table and the cgroups' paths; 6 the
/// wakers (the waker table, and each spike's waker); 7 user backtraces (`--user-stacks`): each
/// record id's user backtrace and each user backtrace's frames as named at record time; 8 the
/// kernel's build id; 9 the exited tasks' sums by process, thread name, cgroup and cause, and
/// each user frame's function's entry line; 10 the wait chains (`--chains`: the chain table).
pub const VERSION: u16 = 10;
pub const FILE_HEADER_LEN: usize = 12;
pub const SYNC: [u8; 4] = *b"LPF\x1e";
/// Sync mark, length, kind, flags, decoded length, CRC.
pub const FRAME_HEADER_LEN: usize = 4 + 4 + 1 + 1 + 4 + 4;
/// No frame decodes to more than this; larger lengths are damage, not data.
pub const MAX_FRAME: usize = 256 << 20;
/// Frames of a user backtrace as latprof names them: the walk's, the callers of a frameless
/// leaf found in the stack words kept, and `[truncated]`. A longer one is damage (or made by
/// hand), and every view would name each of its frames for every cause that shares it.
pub const MAX_USER_FRAMES: usize = USER_FRAMES + USER_WINDOW + 1;
/// A key frame every this many snapshots.
pub const KEY_EVERY: u64 = 60;

pub const KIND_KEY: u8 = 1;
pub const KIND_DELTA: u8 = 2;
/// The recorder finished cleanly (Ctrl-C, SIGTERM, --duration, --max-size).
pub const KIND_END: u8 = 3;
/// Spike events since the previous spike frame, and the reader's sleep count (version 2 on).
pub const KIND_SPIKES: u8 = 4;
pub const FLAG_ZSTD: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("empty file, not a latprof recording")]
    Empty,
    #[error("not a latprof recording (no latprof magic at the start)")]
    NotARecording,
    #[error(
        "recording format version {0} is newer than this latprof reads (up to {VERSION}); use a newer latprof"
    )]
    FutureVersion(u16),
    #[error("recording format version 0 does not exist: the header is damaged")]
    ZeroVersion,
    #[error("damaged frame: {0}")]
    Malformed(&'static str),
    #[error("the recording holds no complete snapshot{0}")]
    NoSnapshot(String),
    #[error("decodes to more than latprof writes or than this file's size allows")]
    TooBig,
}

/// Every varint and every little-endian u64 at every offset of every frame of a recording,
/// decoded: what a test checks for kernel addresses a shared file must not give away.
#[must_use]
pub fn numbers_in(bytes: &[u8]) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    while pos + FRAME_HEADER_LEN <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().ok()?) as usize;
        let raw_len = u32::from_le_bytes(bytes[pos + 10..pos + 14].try_into().ok()?) as usize;
        let stored = bytes.get(pos + FRAME_HEADER_LEN..pos + FRAME_HEADER_LEN + len)?;
        let payload = if bytes[pos + 9] & FLAG_ZSTD != 0 {
            zstd::bulk::decompress(stored, raw_len).ok()?
        } else {
            stored.to_vec()
        };
        for at in 0..payload.len() {
            if let Ok(v) = Dec::new(&payload[at..]).u64() {
                out.push(v);
            }
            if let Some(b) = payload.get(at..at + 8) {
                out.push(u64::from_le_bytes(b.try_into().ok()?));
            }
        }
        pos += FRAME_HEADER_LEN + len;
    }
    Some(out)
}

/// Counters the recording knows; a later latprof with more counters still reads the first ones.
#[must_use]
pub fn counter_values(c: &Counters) -> Vec<u64> {
    c.0[..COUNTER_COUNT as usize].to_vec()
}

#[cfg(test)]
pub(crate) mod tests;

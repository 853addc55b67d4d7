//! Where a recording's bytes are (a file read a frame at a time, or bytes in memory), and a
//! frame's payload decoded.

use std::{fs::File, io, os::unix::fs::FileExt as _};

use super::super::{FormatError, SYNC};

/// Where a recording's bytes are: an open file, read a frame at a time, or bytes in memory.
pub(super) enum Source {
    File(File, u64),
    Bytes(Vec<u8>),
}

impl Source {
    pub(super) fn len(&self) -> u64 {
        match self {
            Self::File(_, len) => *len,
            Self::Bytes(b) => b.len() as u64,
        }
    }

    /// `len` bytes at `at`, or fewer where the source ends.
    pub(super) fn read(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
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
    pub(super) fn find_sync(&self, from: u64, scan_left: &mut u64) -> io::Result<Option<u64>> {
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

pub(super) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// A frame's payload, decoded.
pub(super) fn payload(
    data: &[u8],
    compressed: bool,
    raw_len: usize,
) -> Result<Vec<u8>, FormatError> {
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

//! `perf-PID.map` files: the symbols a just-in-time compiler (a JVM with perf-map-agent,
//! Node's `--perf-basic-prof`, .NET, LuaJIT, Python's `-X perf`) writes for the code it
//! generated, one `START SIZE name` line each (hexadecimal, `0x` optional), in `/tmp` of the
//! process's own mount namespace, named by its pid there.
//!
//! The file is the process's, so any user writes it: it is opened below the process's root
//! with no link followed and no mount crossed at the file, only as a regular file of the
//! process's user with one name (`untrusted`), read in pieces from where the last read
//! stopped (a JIT appends), at most `MAX_BYTES` of it, lines longer than `MAX_LINE` skipped,
//! names made printable.

use std::{
    io,
    os::unix::fs::{FileExt as _, MetadataExt as _},
};

use super::untrusted;

/// The most of one perf map that is read (about half a million symbols): a map that grows
/// past it keeps the symbols read so far.
pub const MAX_BYTES: u64 = 16 << 20;
/// A line longer than this is no symbol: skipped.
pub const MAX_LINE: usize = 4096;
/// The piece read at a time.
const CHUNK: usize = 64 << 10;

/// One JIT symbol: where, how long, and its name in the map's name text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    start: u64,
    size: u64,
    name: (u32, u32),
}

/// One process's perf map as read so far.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// The file read: (device, inode); another file (the map rewritten) is read anew.
    file: Option<(u64, u64)>,
    /// Bytes of it read, up to the end of the last whole line.
    read: u64,
    /// Its size when last read: unchanged, it is not read again.
    seen: u64,
    /// Sorted by start, then by when read.
    entries: Vec<Entry>,
    names: String,
    /// Whether its last read stopped before the file's end (`MAX_BYTES`, or the budget).
    stopped: bool,
}

impl PerfMap {
    /// The bytes it holds (entries and names), for a reader that keeps many.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        (self.entries.len() * size_of::<Entry>() + self.names.len()) as u64
    }

    /// Symbols read so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether its last read stopped before the file's end: the map passed `MAX_BYTES`, or
    /// the budget given was spent.
    #[must_use]
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Reads what process `tgid` (real user `uid`) appended to its perf map since the last
    /// call, until what it holds (`bytes`) has grown by `budget`: its memory, not the file's
    /// bytes, which a map of short lines makes five times as much. Returns the bytes read.
    pub fn refresh(&mut self, tgid: u32, uid: u32, budget: u64) -> io::Result<u64> {
        let file = untrusted::open_in_dir_below_root(tgid, "tmp", &file_name(tgid))?;
        let meta = untrusted::check_own_regular(&file, uid, u64::MAX)?;
        let id = (meta.dev(), meta.ino());
        if self.file != Some(id) || meta.len() < self.read {
            *self = Self {
                file: Some(id),
                ..Self::default()
            };
        }
        if meta.len() == self.seen {
            return Ok(0);
        }
        let end = meta.len().min(MAX_BYTES);
        let limit = self.bytes().saturating_add(budget);
        let mut buf = vec![0; CHUNK];
        let mut line: Vec<u8> = Vec::new();
        let mut skipping = false;
        let start = self.read;
        let mut at = start;
        let before = self.entries.len();
        let mut spent = self.bytes() >= limit;
        'read: while at < end && !spent {
            let want = usize::try_from(end - at).unwrap_or(CHUNK).min(CHUNK);
            let n = file.read_at(&mut buf[..want], at)?;
            if n == 0 {
                break;
            }
            at += n as u64;
            for piece in buf[..n].split_inclusive(|&b| b == b'\n') {
                let whole = piece.ends_with(b"\n");
                if !skipping {
                    line.extend_from_slice(piece);
                }
                if line.len() > MAX_LINE {
                    line.clear();
                    skipping = true;
                }
                if whole {
                    if !skipping {
                        self.add(&line);
                    }
                    line.clear();
                    skipping = false;
                    self.read = at - (n as u64) + offset_after(&buf[..n], piece);
                    if self.bytes() >= limit {
                        spent = true;
                        break 'read;
                    }
                }
            }
        }
        if self.entries.len() != before {
            self.entries.sort_by_key(|e| e.start);
            // What it holds is what it is charged (`bytes`), not twice that in spare room.
            self.entries.shrink_to_fit();
            self.names.shrink_to_fit();
        }
        // Read to the end (of what is read at most): not again until it grows. A read the
        // budget stopped before the end goes on from its last line when there is budget.
        let cut = spent && self.read < end;
        self.stopped = cut || end < meta.len();
        if !cut {
            self.seen = meta.len();
        }
        Ok(self.read - start)
    }

    /// Parses one line (`START SIZE name`); lines it cannot read are skipped.
    fn add(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let hex = |s: &[u8]| {
            let s = std::str::from_utf8(s).ok()?;
            u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
        };
        let mut parts = line.splitn(3, |&b| b == b' ');
        let (Some(start), Some(size), Some(name)) = (
            parts.next().and_then(hex),
            parts.next().and_then(hex),
            parts.next(),
        ) else {
            return;
        };
        let name = crate::text::printable_bytes(name.trim_ascii());
        if name.is_empty() {
            return;
        }
        let (Ok(from), Ok(len)) = (u32::try_from(self.names.len()), u32::try_from(name.len()))
        else {
            return;
        };
        self.names.push_str(&name);
        self.entries.push(Entry {
            start,
            size,
            name: (from, len),
        });
    }

    /// The symbol holding `addr`; of overlapping ones (code regenerated at the same place) the
    /// one that starts last, and of those the one read last.
    #[must_use]
    pub fn find(&self, addr: u64) -> Option<&str> {
        let end = self.entries.partition_point(|e| e.start <= addr);
        // Overlaps are rare: a few entries back is enough to find the one that holds it.
        self.entries[..end]
            .iter()
            .rev()
            .take(64)
            .find(|e| addr - e.start < e.size.max(1))
            .and_then(|e| {
                let (from, len) = (e.name.0 as usize, e.name.1 as usize);
                self.names.get(from..from + len)
            })
    }

    /// Whether a symbol that starts in `start..end` is named `prefix...`, of the first few
    /// there (a region of code one JIT makes holds its own kind).
    #[must_use]
    pub fn names_in(&self, start: u64, end: u64, prefix: &str) -> bool {
        let from = self.entries.partition_point(|e| e.start < start);
        self.entries[from..]
            .iter()
            .take_while(|e| e.start < end)
            .take(16)
            .any(|e| {
                let (at, len) = (e.name.0 as usize, e.name.1 as usize);
                self.names
                    .get(at..at + len)
                    .is_some_and(|n| n.starts_with(prefix))
            })
    }
}

/// Where in `chunk` the bytes after `piece` (a slice of it) start.
fn offset_after(chunk: &[u8], piece: &[u8]) -> u64 {
    (piece.as_ptr() as usize - chunk.as_ptr() as usize + piece.len()) as u64
}

/// The map's name in the process's `/tmp`: named by its innermost pid (`NSpid`: in a
/// container, the pid the process knows itself by).
#[must_use]
pub fn file_name(tgid: u32) -> String {
    let inner = std::fs::read_to_string(format!("/proc/{tgid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|l| l.split_whitespace().last().map(str::to_owned))
        })
        .unwrap_or_else(|| tgid.to_string());
    format!("perf-{inner}.map")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &[u8]) -> PerfMap {
        let mut map = PerfMap::default();
        for line in text.split_inclusive(|&b| b == b'\n') {
            map.add(line);
        }
        map.entries.sort_by_key(|e| e.start);
        map
    }

    #[test]
    fn reads_lines_with_and_without_0x() {
        let map = parsed(
            b"7f0000001000 40 LazyCompile:~handler app.js:10\n\
             0x7f0000002000 0x20 Interpreter\n\
             garbage line\n\
             7f0000003000 10 \n\
             7f0000004000 10 evil\x1b[2J\xff\n",
        );
        assert_eq!(map.len(), 3, "{map:?}");
        assert_eq!(
            map.find(0x7f00_0000_1010),
            Some("LazyCompile:~handler app.js:10")
        );
        assert_eq!(map.find(0x7f00_0000_201f), Some("Interpreter"));
        assert_eq!(map.find(0x7f00_0000_2020), None);
        assert_eq!(map.find(0x10), None);
        assert_eq!(map.find(0x7f00_0000_4000), Some("evil\\x1b[2J\u{fffd}"));
    }

    #[test]
    fn the_own_process_map_is_read_as_it_grows_and_bounded() {
        use std::io::Write as _;
        let pid = std::process::id();
        let path = format!("/tmp/{}", file_name(pid));
        let mut file = std::fs::File::create(&path).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        writeln!(file, "1000 10 first").unwrap();
        write!(file, "2000 10 sec").unwrap();
        let mut map = PerfMap::default();
        map.refresh(pid, uid, u64::MAX).unwrap();
        assert_eq!(map.find(0x1000), Some("first"));
        assert_eq!(map.find(0x2000), None, "a line not yet whole");
        writeln!(file, "ond").unwrap();
        writeln!(file, "{} 10 long", "0".repeat(MAX_LINE)).unwrap();
        writeln!(file, "3000 10 third").unwrap();
        map.refresh(pid, uid, u64::MAX).unwrap();
        assert_eq!(map.find(0x2000), Some("second"));
        assert_eq!(map.find(0x3000), Some("third"));
        assert_eq!(map.len(), 3, "the over-long line skipped");
        // Nothing new: nothing read.
        let read = map.read;
        map.refresh(pid, uid, u64::MAX).unwrap();
        assert_eq!(map.read, read);
        assert!(!map.stopped());
        // A budget stops the read, and says so.
        writeln!(file, "4000 10 fourth").unwrap();
        map.refresh(pid, uid, 0).unwrap();
        assert_eq!(map.find(0x4000), None);
        assert!(map.stopped());
        // The budget is the memory the map holds, not the file's bytes: 100,000 short lines
        // (10 bytes each, 33 held) with 64 KiB to spend keep the map within a line of it,
        // and the read goes on from there with more.
        for i in 0..100_000u64 {
            writeln!(file, "{:x} 1 a", 0x10_0000 + i).unwrap();
        }
        let held = map.bytes();
        map.refresh(pid, uid, 64 << 10).unwrap();
        let grown = map.bytes() - held;
        assert!(
            (64 << 10..(64 << 10) + 64).contains(&grown),
            "{grown} bytes held more"
        );
        assert!(map.stopped());
        map.refresh(pid, uid, u64::MAX).unwrap();
        assert_eq!(map.find(0x10_0000 + 99_999), Some("a"));
        assert!(!map.stopped());
        std::fs::remove_file(&path).unwrap();
    }
}

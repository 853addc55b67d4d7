//! Appends snapshots to a recording: key frames and deltas, one `write` and one `fdatasync`
//! per frame, optional rotation or a size limit.
//!
//! A recording is meant to be shared, so it holds no kernel address: frames and symbols are
//! written as [`Kallsyms::public_addr`] (symbol rank and offset), and backtrace ids, which the
//! eBPF side hashes from raw addresses (a hash of a few hundred possible KASLR offsets can be
//! inverted), through a hash keyed at random per recorder; user backtrace ids (hashes of user
//! addresses) go through it too. User frames are written as named at record time, with their
//! file, build id and file offset: no address.
mod body;
mod chains;

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    hash::RandomState,
    io::Write as _,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use latprof_common::{CgroupCause, GlobalRecord, Histogram, WakerKey};

use super::{
    FILE_HEADER_LEN, FLAG_ZSTD, FRAME_HEADER_LEN, KEY_EVERY, KIND_DELTA, KIND_END, KIND_KEY, MAGIC,
    RecordingInfo, SYNC, VERSION, codec::Enc,
};
use crate::{
    cgroups::CgroupPath,
    collect::{Snapshot, TaskSnapshot, Waker},
    symbols::Kallsyms,
};

#[derive(Clone, Debug)]
pub struct Options {
    pub compress: bool,
    /// Start a new file when the current one reaches this many bytes.
    pub rotate: Option<u64>,
    /// Rotated files kept beside the current one (`run.lpr.1` is the newest).
    pub keep: u32,
    /// Stop recording before the file would grow past this many bytes.
    pub max_size: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            compress: true,
            rotate: None,
            keep: 4,
            max_size: None,
        }
    }
}

/// What the writer did, for the user and the recordings guide's numbers.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub snapshots: u64,
    pub key_frames: u64,
    /// Bytes written over all files (headers and frames).
    pub bytes: u64,
    /// Bytes of the encoded snapshots before compression.
    pub raw_bytes: u64,
    pub rotations: u64,
}

/// What happened to an appended snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    Written,
    /// `--max-size` reached: the snapshot was not written; finish the recording.
    Full,
}

pub struct Writer {
    path: PathBuf,
    file: File,
    info: RecordingInfo,
    options: Options,
    /// Bytes in the current file.
    size: u64,
    since_key: u64,
    tasks: HashMap<u32, TaskSnapshot>,
    global: HashMap<u64, GlobalRecord>,
    histograms: HashMap<u64, Histogram>,
    cgroups: HashMap<CgroupCause, GlobalRecord>,
    exited: HashMap<crate::collect::ExitKey, GlobalRecord>,
    paths: HashMap<u64, CgroupPath>,
    wakers: HashMap<WakerKey, Waker>,
    chains: HashMap<latprof_common::ChainKey, crate::collect::Chain>,
    stacks_written: HashSet<u64>,
    syms_written: HashSet<u64>,
    /// Record ids whose user backtrace id was written, and the user backtraces written.
    user_parts_written: HashSet<u64>,
    user_stacks_written: HashSet<u64>,
    /// The key of the backtrace ids written.
    ids: RandomState,
    pub stats: Stats,
}

/// zstd level: one frame a second is cheap to compress hard (on a hackbench loop level 9 wrote
/// about 27 MB per hour where level 3 wrote 35; see docs/guide/recordings.md).
const ZSTD_LEVEL: i32 = 9;

/// Why a recording ended when its disk filled up (its end frame).
pub const DISK_FULL: &str = "the disk was full";

/// Room kept for the end frame: under `--max-size`, and on the disk, taken before each frame
/// (`reserve`).
const END_ROOM: u64 = 64;

/// Cuts `file` back to `size` bytes and writes from there on.
fn cut(file: &mut File, size: u64) {
    use std::io::{Seek as _, SeekFrom};
    let _ = file.set_len(size);
    let _ = file.seek(SeekFrom::Start(size));
}

/// Takes the disk space of `len` bytes at `at` without growing the file
/// (`FALLOC_FL_KEEP_SIZE`). Fails only where the disk is full; a file system without
/// fallocate is written as before, its full disk found by the write.
fn reserve(file: &File, at: u64, len: u64) -> std::io::Result<()> {
    let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) else {
        return Ok(());
    };
    // SAFETY: fallocate on a descriptor this File owns; it changes no memory of ours.
    if unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, at, len) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => Err(e),
        _ => Ok(()),
    }
}

/// Creates a recording's file (permissions `mode`, less the umask) and writes its header:
/// never through a link, never over an existing entry; `replace` (`--force`) removes what is
/// there first (a link, not its target).
fn create_file(path: &Path, replace: bool, mode: u32) -> Result<File> {
    let mut file = crate::files::create(
        path,
        replace,
        mode,
        "choose another name or pass --force to replace it",
    )?;
    let mut header = Vec::with_capacity(FILE_HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&[0, 0]);
    file.write_all(&header)
        .and_then(|()| file.sync_data())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(file)
}

/// A recording's file, created and holding its header before anything is recorded: `record`
/// creates it before it loads the programs (a second or more), so no one can put a link in its
/// place meanwhile.
pub struct NewFile {
    path: PathBuf,
    file: File,
}

impl NewFile {
    /// Creates `path`, which must not exist; `replace` (`--force`) replaces what is there.
    /// `private`: readable by its owner only (a recording with user frames names other users'
    /// functions, files and binaries, which their /proc/PID/maps hides from others).
    pub fn create(path: &Path, replace: bool, private: bool) -> Result<Self> {
        Ok(Self {
            path: path.to_owned(),
            file: create_file(path, replace, if private { 0o600 } else { 0o666 })?,
        })
    }

    /// Removes the file again (the command failed before recording anything).
    pub fn remove(self) {
        crate::files::Created::new(&self.path, &self.file).remove();
    }
}

/// One frame as it lies in the file.
#[must_use]
pub fn frame(kind: u8, raw: &[u8], compress: bool) -> Vec<u8> {
    let compressed = if compress {
        zstd::bulk::compress(raw, ZSTD_LEVEL).ok()
    } else {
        None
    };
    let (flags, stored) = match &compressed {
        Some(c) => (FLAG_ZSTD, c.as_slice()),
        None => (0, raw),
    };
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + stored.len());
    out.extend_from_slice(&SYNC);
    out.extend_from_slice(
        &u32::try_from(stored.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&u32::try_from(raw.len()).unwrap_or(u32::MAX).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[4..]);
    crc.update(stored);
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(stored);
    out
}

impl Writer {
    /// A new recording at `path`, which must not exist.
    pub fn create(path: &Path, info: RecordingInfo, options: Options) -> Result<Self> {
        Ok(Self::start(
            NewFile::create(path, false, info.user_stacks)?,
            info,
            options,
        ))
    }

    /// A recording in a file created beforehand.
    #[must_use]
    pub fn start(new: NewFile, info: RecordingInfo, options: Options) -> Self {
        // Room for the end frame, should the disk be full at the first frame (best effort:
        // the first frame's write says a full disk).
        let _ = reserve(&new.file, FILE_HEADER_LEN as u64, END_ROOM);
        Self {
            path: new.path,
            file: new.file,
            info,
            options,
            size: FILE_HEADER_LEN as u64,
            since_key: 0,
            tasks: HashMap::new(),
            global: HashMap::new(),
            histograms: HashMap::new(),
            cgroups: HashMap::new(),
            exited: HashMap::new(),
            paths: HashMap::new(),
            wakers: HashMap::new(),
            chains: HashMap::new(),
            stacks_written: HashSet::new(),
            syms_written: HashSet::new(),
            user_parts_written: HashSet::new(),
            user_stacks_written: HashSet::new(),
            ids: RandomState::new(),
            stats: Stats {
                bytes: FILE_HEADER_LEN as u64,
                ..Stats::default()
            },
        }
    }

    /// Bytes in the current file.
    #[must_use]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `--max-size` too small to hold even the first interval (the snapshot taken at the start
    /// holds nothing yet; the second one holds the first interval): stopping there leaves a
    /// file with nothing to show, so there is none, and the error says what size would do.
    fn too_small(&self, frame_len: usize) -> Option<anyhow::Error> {
        if self.stats.snapshots >= 2 {
            return None;
        }
        crate::files::Created::new(&self.path, &self.file).remove();
        let need = self.size + frame_len as u64 + END_ROOM;
        Some(anyhow::anyhow!(
            "--max-size {} is too small to record one interval: that needs at least {need} bytes here; give --max-size {}K or more",
            self.options.max_size.unwrap_or(0),
            need.div_ceil(1024)
        ))
    }

    /// Whether `frame` still fits under `--max-size`, with room left for the end frame.
    fn fits(&self, frame: &[u8]) -> bool {
        self.options
            .max_size
            .is_none_or(|max| self.size + frame.len() as u64 + END_ROOM <= max)
    }

    fn write_frame(&mut self, bytes: &[u8]) -> Result<()> {
        // The room for this frame and for the end frame after it, taken first: where the disk
        // is full, nothing is written and the end frame goes where the frame before reserved.
        if let Err(e) = reserve(&self.file, self.size, bytes.len() as u64 + END_ROOM) {
            return Err(self.disk_full(&e));
        }
        self.write_reserved(bytes)
    }

    /// The file's end frame, saying `reason`: into the room the frame before reserved, with
    /// none taken after it (nothing follows).
    fn write_end(&mut self, reason: &str) -> Result<()> {
        let end = self.end_frame(reason);
        self.write_reserved(&end)
    }

    /// Writes `bytes` where the file ends (its room already taken).
    fn write_reserved(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(e) = self
            .file
            .write_all(bytes)
            .and_then(|()| self.file.sync_data())
        {
            return Err(self.failed(&e));
        }
        self.size += bytes.len() as u64;
        self.stats.bytes += bytes.len() as u64;
        Ok(())
    }

    pub fn append(&mut self, snap: &Snapshot, syms: &Kallsyms) -> Result<Appended> {
        self.rotate_if_due()?;
        let key = self.since_key == 0;
        let body = self.body(snap, syms, key);
        let mut e = Enc::default();
        if key {
            let (sched_text, lock_text) = syms.public_ranges();
            RecordingInfo {
                sched_text,
                lock_text,
                ..self.info.clone()
            }
            .encode(&mut e, VERSION);
        }
        body.encode(&mut e, VERSION);
        let bytes = frame(
            if key { KIND_KEY } else { KIND_DELTA },
            &e.buf,
            self.options.compress,
        );
        if !self.fits(&bytes) {
            if let Some(err) = self.too_small(bytes.len()) {
                return Err(err);
            }
            // Not written: the next key frame must not build on it.
            self.since_key = 0;
            return Ok(Appended::Full);
        }
        self.write_frame(&bytes)?;
        self.stats.snapshots += 1;
        self.stats.raw_bytes += e.buf.len() as u64;
        if key {
            self.stats.key_frames += 1;
        }
        self.since_key = (self.since_key + 1) % KEY_EVERY;
        Ok(Appended::Written)
    }

    /// Spike events since the last call, with the reader's sleep count, before the snapshot
    /// that follows them.
    pub fn append_spikes(
        &mut self,
        spikes: &[crate::collect::Spike],
        reader_sleeps: u64,
        not_recorded: u64,
    ) -> Result<Appended> {
        let spikes: Vec<_> = spikes
            .iter()
            .map(|s| crate::collect::Spike {
                stack_id: self.public_id(s.stack_id),
                ..s.clone()
            })
            .collect();
        self.rotate_if_due()?;
        let mut e = Enc::default();
        super::encode_spikes(&mut e, &spikes, reader_sleeps, not_recorded);
        let bytes = frame(super::KIND_SPIKES, &e.buf, self.options.compress);
        if !self.fits(&bytes) {
            if let Some(err) = self.too_small(bytes.len()) {
                return Err(err);
            }
            return Ok(Appended::Full);
        }
        self.write_frame(&bytes)?;
        Ok(Appended::Written)
    }

    fn end_frame(&self, reason: &str) -> Vec<u8> {
        let mut e = Enc::default();
        e.str(reason);
        e.u64(self.stats.snapshots);
        frame(KIND_END, &e.buf, false)
    }

    /// Rotates when the current file has reached `--rotate`: before a frame is written, not
    /// after, so that the file the recording finishes in holds its last snapshot. (Rotating
    /// right after the last snapshot left FILE with a header and an end frame only, which no
    /// reader takes for a recording, and the last snapshots in FILE.1, marked "rotated".)
    fn rotate_if_due(&mut self) -> Result<()> {
        if let Some(limit) = self.options.rotate
            && self.size >= limit
        {
            self.rotate()?;
        }
        Ok(())
    }

    /// Closes the current file (it stays a complete recording) and starts a new one.
    fn rotate(&mut self) -> Result<()> {
        self.write_end("rotated")?;
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.options.keep == 0 {
            let _ = std::fs::remove_file(&self.path);
        } else {
            let _ = std::fs::remove_file(numbered(self.options.keep));
            for n in (1..self.options.keep).rev() {
                let _ = std::fs::rename(numbered(n), numbered(n + 1));
            }
            std::fs::rename(&self.path, numbered(1))
                .with_context(|| format!("rotating {}", self.path.display()))?;
        }
        // The path was just renamed or removed: whatever is there now was put there by someone
        // else, and is refused rather than written through.
        let mode = if self.info.user_stacks { 0o600 } else { 0o666 };
        self.file = create_file(&self.path, false, mode)?;
        self.size = FILE_HEADER_LEN as u64;
        self.stats.bytes += FILE_HEADER_LEN as u64;
        self.stats.rotations += 1;
        self.since_key = 0;
        Ok(())
    }

    /// A frame that could not be written: the file is cut back to its last whole frame, so that
    /// it ends where the recording does, not inside a frame (which readers take for a recorder
    /// killed mid-write). Out of space, the room the frame before reserved takes an end frame
    /// that says so (`disk_full`), and the error says the disk is full: not a bare errno.
    fn failed(&mut self, e: &std::io::Error) -> anyhow::Error {
        // The write may have put part of the frame there: cut, and write from the cut on.
        cut(&mut self.file, self.size);
        if !matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            return anyhow::anyhow!("writing {}: {e}", self.path.display());
        }
        self.disk_full(e)
    }

    /// The disk is full (`e`) with the file at its last whole frame: the end frame is written
    /// if it fits (the room the frame before reserved), and the error says which.
    fn disk_full(&mut self, e: &std::io::Error) -> anyhow::Error {
        let path = self.path.display().to_string();
        let end = self.end_frame(DISK_FULL);
        let ended = self
            .file
            .write_all(&end)
            .and_then(|()| self.file.sync_data())
            .is_ok();
        if ended {
            self.size += end.len() as u64;
            self.stats.bytes += end.len() as u64;
        } else {
            cut(&mut self.file, self.size);
        }
        anyhow::anyhow!(
            "writing {path}: the disk is full ({e}): the recording stops after {} snapshots{}",
            self.stats.snapshots,
            if ended {
                ", marked as ended by the full disk"
            } else {
                ", at its last whole frame"
            }
        )
    }

    /// Marks the recording as cleanly finished.
    pub fn finish(mut self, reason: &str) -> Result<Stats> {
        self.write_end(reason)?;
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full disk ended the recording with the bare errno, and left a frame cut short that
    /// readers took for a killed recorder; now the error says the disk is full.
    #[test]
    fn a_full_disk_is_said_so() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        let new = NewFile {
            path: PathBuf::from("/dev/full"),
            file,
        };
        let mut w = Writer::start(new, RecordingInfo::default(), Options::default());
        let err = w
            .append(&Snapshot::default(), &Kallsyms::default())
            .expect_err("no room");
        let err = format!("{err:#}");
        assert!(
            err.contains("writing /dev/full: the disk is full (No space left on device"),
            "{err}"
        );
        assert!(err.contains("stops after 0 snapshots"), "{err}");
    }
}

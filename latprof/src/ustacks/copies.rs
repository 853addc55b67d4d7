//! Private copies of users' binaries. The symbolizer maps the files it names frames from; a
//! file its user can write may be cut short while it is mapped, and root's latprof then dies
//! of SIGBUS at its next access (a library truncated and restored in a loop killed `serve`,
//! `stats` and `record` within seconds). So a file is mapped as it is only where no user can
//! change it under latprof (`may_map`); any other is read, in bounded pieces that a
//! truncation only cuts short, into a sealed memory file of latprof's own, and that copy is
//! what is parsed and mapped. Copies keep the original's holes (a sparse file costs what it
//! holds), and every byte copied is charged to one budget, per user and for all, given back
//! when no process maps the file any more (the copy is dropped with its last `Module`).

use std::{
    collections::HashMap,
    ffi::CString,
    fs::{File, Metadata},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::fs::{FileExt as _, MetadataExt as _},
    },
    sync::{Arc, Mutex, PoisonError},
};

/// Bytes of all users' files copied at once at most.
pub const MAX_COPIED: u64 = 256 << 20;
/// Bytes of one user's files copied at once at most: one user cannot spend all of it.
pub const MAX_COPIED_PER_USER: u64 = 128 << 20;
/// The piece read and written at a time.
const PIECE: usize = 1 << 20;

/// Whether root may map `file` (metadata `meta`) as it is: root's, written by no other user
/// (group and others without write permission), and on no filesystem a user's daemon serves
/// (FUSE: its reads can fail or wait at the daemon's will).
#[must_use]
pub fn may_map(file: &File, meta: &Metadata) -> bool {
    meta.uid() == 0 && meta.mode() & 0o022 == 0 && served_by_kernel(file)
}

/// Whether `file`'s reads are the kernel's own: not on FUSE, whose daemon (any user may run
/// one) answers them when and how it likes. Such a file is never read, not even copied: a
/// read its daemon never answers held the thread that names every process's frames.
#[must_use]
pub fn served_by_kernel(file: &File) -> bool {
    // SAFETY: an all-zero statfs is a valid buffer for fstatfs to fill.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a buffer of the right type.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &raw mut fs) } != 0 {
        return false;
    }
    // `f_type` is signed in glibc and unsigned in musl.
    i128::from(fs.f_type) != i128::from(libc::FUSE_SUPER_MAGIC)
}

/// The bytes a file really holds (allocated blocks): what a copy of it costs at most.
#[must_use]
pub fn held_bytes(meta: &Metadata) -> u64 {
    meta.blocks().saturating_mul(512).min(meta.len())
}

/// The copy budget, shared by every copy (a copy gives its bytes back when dropped, on
/// whichever thread).
#[derive(Clone, Debug, Default)]
pub struct Budget(Arc<Mutex<Spent>>);

#[derive(Debug, Default)]
struct Spent {
    all: u64,
    by_user: HashMap<u32, u64>,
    /// Files not copied for want of budget (a file larger than a user's share included).
    refused: u64,
}

/// Bytes charged to the budget for one copy, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Budget,
    uid: u32,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut spent = self.budget.lock();
        spent.all = spent.all.saturating_sub(self.bytes);
        if let Some(user) = spent.by_user.get_mut(&self.uid) {
            *user = user.saturating_sub(self.bytes);
            if *user == 0 {
                spent.by_user.remove(&self.uid);
            }
        }
    }
}

impl Budget {
    fn lock(&self) -> std::sync::MutexGuard<'_, Spent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes copied now, for all users.
    #[must_use]
    pub fn spent(&self) -> u64 {
        self.lock().all
    }

    /// Files not copied so far for want of budget.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.lock().refused
    }

    /// Whether `bytes` more of user `uid`'s would fit now (`held_bytes` of a file: an
    /// estimate, the copy measures).
    #[must_use]
    pub fn fits(&self, uid: u32, bytes: u64) -> bool {
        let spent = self.lock();
        spent.all.saturating_add(bytes) <= MAX_COPIED
            && spent
                .by_user
                .get(&uid)
                .copied()
                .unwrap_or(0)
                .saturating_add(bytes)
                <= MAX_COPIED_PER_USER
    }

    /// Takes `bytes` of user `uid`'s share, where they fit.
    fn charge(&self, uid: u32, bytes: u64) -> Option<Charge> {
        let mut spent = self.lock();
        let user = spent.by_user.get(&uid).copied().unwrap_or(0);
        if spent.all.saturating_add(bytes) > MAX_COPIED
            || user.saturating_add(bytes) > MAX_COPIED_PER_USER
        {
            spent.refused += 1;
            return None;
        }
        spent.all += bytes;
        *spent.by_user.entry(uid).or_default() += bytes;
        Some(Charge {
            budget: self.clone(),
            uid,
            bytes,
        })
    }

    /// A sealed private copy of `file` (metadata `meta`, read as it is now: a file cut short
    /// meanwhile leaves zeros), charged to its owner's share; `None` where it does not fit or
    /// cannot be made.
    #[must_use]
    pub fn copy(&self, file: &File, meta: &Metadata) -> Option<(File, Charge)> {
        // The data the file holds, measured (the blocks a file system reports may be fewer:
        // ZFS counts them compressed).
        let data = data_bytes(file, meta.len()).ok()?;
        let charge = self.charge(meta.uid(), data)?;
        let copy = private_copy(file, meta.len(), charge.bytes).ok()?;
        Some((copy, charge))
    }
}

/// The bytes of data `file` (`len` bytes long) holds outside its holes.
fn data_bytes(file: &File, len: u64) -> io::Result<u64> {
    let (mut at, mut data) = (0u64, 0u64);
    while at < len {
        let Some(start) = seek(file, at, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(file, start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        data += end.saturating_sub(start);
        at = end.max(at + 1);
    }
    Ok(data)
}

/// Copies the data of `file` (`len` bytes long, holes left as holes) into a new memory file,
/// at most `max` bytes of data, and seals it against any change.
fn private_copy(file: &File, len: u64, max: u64) -> io::Result<File> {
    let name = CString::new("latprof-copy").map_err(io::Error::other)?;
    // SAFETY: a NUL-terminated name; the descriptor is checked and owned below.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned by the File from here on.
    let copy = unsafe { File::from_raw_fd(fd) };
    copy.set_len(len)?;
    let mut buf = vec![0; PIECE];
    let mut copied = 0u64;
    let mut at = 0u64;
    while at < len {
        // The next data after `at`, and the hole after it (a file system without holes: all
        // of it is data).
        let Some(data) = seek(file, at, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(file, data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut pos = data;
        while pos < end {
            let want = usize::try_from(end - pos).unwrap_or(PIECE).min(PIECE);
            let n = file.read_at(&mut buf[..want], pos)?;
            if n == 0 {
                // Cut short meanwhile: the rest stays zeros.
                at = len;
                break;
            }
            copied += n as u64;
            if copied > max {
                return Err(io::Error::other("the file gained data while copied"));
            }
            copy.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
        }
        at = at.max(end);
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor owned here.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(copy)
}

/// lseek with `SEEK_DATA` or `SEEK_HOLE`; `None` where no data follows (`ENXIO`). A file
/// system without either treats the whole file as data.
fn seek(file: &File, from: u64, whence: i32) -> io::Result<Option<u64>> {
    let from = i64::try_from(from).map_err(io::Error::other)?;
    // SAFETY: lseek on a valid descriptor.
    let at = unsafe { libc::lseek(file.as_raw_fd(), from, whence) };
    if at < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EINVAL) if whence == libc::SEEK_DATA => Ok(Some(from.unsigned_abs())),
            Some(libc::ENXIO | libc::EINVAL) => Ok(None),
            _ => Err(err),
        };
    }
    Ok(Some(at.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use std::io::{Seek as _, Write as _};

    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("latprof-copies-{name}-{}", std::process::id()))
    }

    #[test]
    fn a_copy_is_the_file_sealed_and_keeps_its_holes() {
        let path = temp("sparse");
        let mut file = File::create(&path).unwrap();
        file.write_all(b"head").unwrap();
        file.seek(io::SeekFrom::Start(64 << 20)).unwrap();
        file.write_all(b"tail").unwrap();
        drop(file);
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let budget = Budget::default();
        let (copy, charge) = budget.copy(&file, &meta).expect("a copy");
        // Charged what the file holds, not its 64 MiB length.
        assert!(charge.bytes < 1 << 20, "{}", charge.bytes);
        assert_eq!(budget.spent(), charge.bytes);
        let mut head = [0; 4];
        copy.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"head");
        copy.read_exact_at(&mut head, 64 << 20).unwrap();
        assert_eq!(&head, b"tail");
        assert_eq!(copy.metadata().unwrap().len(), meta.len());
        assert!(
            copy.metadata().unwrap().blocks() * 512 < 1 << 20,
            "holes kept"
        );
        // Sealed: nobody cuts it short or writes it.
        assert!(copy.set_len(0).is_err());
        assert!(copy.write_all_at(b"x", 0).is_err());
        // The original cut short does not touch the copy.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        copy.read_exact_at(&mut head, 64 << 20).unwrap();
        assert_eq!(&head, b"tail");
        drop(charge);
        assert_eq!(budget.spent(), 0, "given back");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_budget_bounds_each_user_and_all() {
        let budget = Budget::default();
        let a = budget
            .charge(1000, MAX_COPIED_PER_USER)
            .expect("a user's share");
        assert!(budget.charge(1000, 1).is_none(), "past the user's share");
        assert_eq!(budget.refused(), 1);
        let b = budget
            .charge(1001, MAX_COPIED_PER_USER)
            .expect("another user's");
        assert!(budget.charge(1002, 1).is_none(), "past all");
        drop(a);
        assert!(budget.fits(1002, 1));
        assert!(budget.charge(1002, 1).is_some());
        drop(b);
    }

    #[test]
    fn only_roots_unwritable_files_are_mapped() {
        let path = temp("mode");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        // The tests run as root (0644 by the umask) or as a user: root's unwritable file is
        // mapped, anyone else's is not.
        assert_eq!(
            may_map(&file, &meta),
            meta.uid() == 0 && meta.mode() & 0o022 == 0
        );
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let meta = file.metadata().unwrap();
        assert!(!may_map(&file, &meta), "others may write it");
        std::fs::remove_file(&path).unwrap();
    }
}

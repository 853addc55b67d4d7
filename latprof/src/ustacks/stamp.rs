//! What tells one content of a file from the next under the same inode. A library rewritten
//! in place (`cp` over it, `cat v2 > lib.so`, a user's own writes) keeps its device and
//! inode, so unwind rows and names kept by (device, inode) went on describing the old bytes
//! (issue 53, R5): a later process mapping the new ones was walked with the old rules. Every
//! write moves the file's change time, which only the kernel sets (a user can set the
//! modification time back, not the change time), and most move its size.

use std::os::unix::fs::MetadataExt as _;

/// A file's size and change and modification times when it was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl Stamp {
    #[must_use]
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            len: meta.len(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

impl Stamp {
    /// The id names and unwind rows of these contents are kept by: the same for the file
    /// opened again unchanged (closed while no process mapped it), another once it changed,
    /// so that new contents share nothing with the old. Keyed at random per run: no file can
    /// be made to take another's id.
    #[must_use]
    pub fn id(&self, dev: u64, ino: u64) -> u64 {
        use std::hash::BuildHasher as _;
        static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
        KEY.get_or_init(std::hash::RandomState::new)
            .hash_one((dev, ino, self.len, self.ctime, self.mtime))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_in_place_changes_the_stamp_and_a_read_does_not() {
        let dir = std::env::temp_dir().join(format!("latprof-stamp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lib.so");
        std::fs::write(&path, b"version one").unwrap();
        let before = std::fs::metadata(&path).unwrap();
        let _ = std::fs::read(&path).unwrap();
        assert_eq!(
            Stamp::of(&std::fs::metadata(&path).unwrap()),
            Stamp::of(&before)
        );
        // The same length, the same inode, new bytes, a tick later: the kernel stamps files
        // from its coarse clock, which moves once a tick (10 ms at HZ=100), so two writes in
        // one tick can carry the same times.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"version two").unwrap();
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(after.ino(), before.ino());
        assert_ne!(Stamp::of(&after), Stamp::of(&before));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_same_contents_keep_their_id_and_new_ones_get_another() {
        let dir = std::env::temp_dir().join(format!("latprof-stamp-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lib.so");
        std::fs::write(&path, b"one").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let id = |m: &std::fs::Metadata| Stamp::of(m).id(m.dev(), m.ino());
        assert_eq!(id(&meta), id(&std::fs::metadata(&path).unwrap()));
        std::fs::write(&path, b"one more").unwrap();
        assert_ne!(id(&meta), id(&std::fs::metadata(&path).unwrap()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

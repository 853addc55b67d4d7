//! Files latprof creates as root, often in directories other users write to (/tmp, a shared
//! spool): never through a symbolic link, never over something that appeared after a check.
//! `O_CREAT | O_EXCL` makes the kernel refuse any existing entry, a link included (dangling or
//! not) and without following it; `O_NOFOLLOW` says the same twice.
use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// Opens `path` for reading if it is a regular file: a FIFO would block, a device would never
/// end. Opened without blocking, so a FIFO is refused, not waited on.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    Ok((file, meta.len()))
}

/// Creates `path`, which must not exist, with `mode` (before the umask).
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Creates `path` new. With `replace` (`--force`) whatever `path` names is removed first (a link
/// itself, not its target); something that appears there again meanwhile is not written
/// through but refused. Without it an existing entry is refused, `exists` saying what to do.
pub fn create(path: &Path, replace: bool, mode: u32, exists: &str) -> Result<File> {
    if replace {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => bail!("cannot replace {}: {e}", path.display()),
        }
    }
    match create_new(path, mode) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && replace => bail!(
            "{} appeared again while latprof replaced it (another process is writing there); not writing through it",
            path.display()
        ),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            bail!(
                "{} exists{}; {exists}",
                path.display(),
                if link { " (a symbolic link)" } else { "" }
            )
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

/// Opens `path` for appending if it is a character device (`/dev/null`): writing there
/// overwrites nothing, and other users cannot make one. `None` if it is anything else or
/// nothing; a link is not followed.
pub fn open_device(path: &Path) -> Result<Option<File>> {
    let is_device = |m: &std::fs::Metadata| m.file_type().is_char_device();
    if !std::fs::symlink_metadata(path).is_ok_and(|m| is_device(&m)) {
        return Ok(None);
    }
    // No O_CREAT, no O_TRUNC: if something else took its place meanwhile, it is refused below
    // with nothing written.
    let file = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if !file.metadata().is_ok_and(|m| is_device(&m)) {
        bail!("{} changed while latprof opened it", path.display());
    }
    Ok(Some(file))
}

/// Creates a new file named `PREFIX` + 12 random letters and digits + `suffix` in `dir`, readable
/// by its owner only: a name nobody can guess and plant a link at beforehand.
pub fn create_unique(dir: &Path, prefix: &str, suffix: &str) -> Result<(File, PathBuf)> {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    for _ in 0..100 {
        let mut random = [0u8; 12];
        // SAFETY: getrandom writes at most `random.len()` bytes into it.
        let got = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
        if usize::try_from(got).ok() != Some(random.len()) {
            bail!(
                "cannot name a file in {}: getrandom: {}",
                dir.display(),
                io::Error::last_os_error()
            );
        }
        let name: String = random
            .iter()
            .map(|b| char::from(LETTERS[usize::from(*b) % LETTERS.len()]))
            .collect();
        let path = dir.join(format!("{prefix}{name}{suffix}"));
        match create_new(&path, 0o600) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
    }
    bail!("cannot create a new file in {}", dir.display())
}

/// A file this run created, to remove again when the command fails before using it.
#[derive(Debug)]
pub struct Created {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Created {
    #[must_use]
    pub fn new(path: &Path, file: &File) -> Self {
        let (dev, ino) = file.metadata().map_or((0, 0), |m| (m.dev(), m.ino()));
        Self {
            path: path.to_owned(),
            dev,
            ino,
        }
    }

    /// Removes the file if `path` still names it: in a directory others write to, someone may
    /// have renamed it and put something else there.
    pub fn remove(self) {
        if std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (self.dev, self.ino) && self.ino != 0)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("latprof-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn links_are_neither_followed_nor_kept() {
        let dir = dir("links");
        let target = dir.join("target");
        std::fs::write(&target, b"precious").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("nothing"), &dangling).unwrap();
        let err = create(&link, false, 0o644, "pass --force").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{} exists (a symbolic link); pass --force", link.display())
        );
        assert!(create(&dangling, false, 0o644, "").is_err());
        assert!(
            !dir.join("nothing").exists(),
            "a dangling link was followed"
        );
        // Replacing removes the link itself and creates a file in its place.
        let mut file = create(&link, true, 0o644, "").unwrap();
        std::io::Write::write_all(&mut file, b"new").unwrap();
        assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert_eq!(std::fs::read(&link).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_devices_are_opened_as_they_are() {
        let dir = dir("devices");
        assert!(open_device(Path::new("/dev/null")).unwrap().is_some());
        let file = dir.join("file");
        std::fs::write(&file, b"keep").unwrap();
        assert!(open_device(&file).unwrap().is_none());
        let link = dir.join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert!(open_device(&link).unwrap().is_none());
        assert!(open_device(&dir.join("nothing")).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unique_names_are_private_and_new() {
        let dir = dir("unique");
        let (_, a) = create_unique(&dir, "latprof-", ".log").unwrap();
        let (_, b) = create_unique(&dir, "latprof-", ".log").unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_the_created_file_is_removed() {
        let dir = dir("created");
        let path = dir.join("f");
        let file = create_new(&path, 0o644).unwrap();
        let created = Created::new(&path, &file);
        // Someone put another file in its place.
        std::fs::rename(&path, dir.join("moved")).unwrap();
        std::fs::write(&path, b"theirs").unwrap();
        created.remove();
        assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
        let created = Created::new(&dir.join("moved"), &file);
        created.remove();
        assert!(!dir.join("moved").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The rules for files a user's process hands root (`--user-stacks`): its binaries, what they
//! link to and its `perf-PID.map`. Any user controls these, and latprof reads them as root, so
//! none is trusted: a path may be a link to root's files or a FIFO that blocks the open for
//! ever, a section header may claim gigabytes, a debug link may name any file.
//!
//! - Files are opened `O_NOFOLLOW | O_NONBLOCK`, below the process's root with no link
//!   followed and no mount crossed at the file (`openat2`), or through `/proc/PID/map_files`
//!   (what the process really maps).
//! - Only regular files, with one name (no hard link to someone else's file), owned by the
//!   process's user.
//! - Sizes are capped before anything is allocated and files are read in bounded pieces.
//! - A binary's DWARF is read only where nothing in it sends the reader to another file that
//!   its owner chose (debug links, supplementary files), and no compressed section claims more
//!   than the cap: ELF symbols name it otherwise.

use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::fs::{FileExt as _, MetadataExt as _},
    },
};

use object::{Object as _, ObjectSection as _, read::elf::ElfFile64};

/// The most a section latprof copies out of a user's binary (`.eh_frame`) may claim: the
/// largest seen on a distribution (a browser's) is under 20 MiB.
pub const MAX_SECTION: u64 = 64 << 20;

/// The most a compressed DWARF section of a user's binary may claim once uncompressed.
pub const MAX_DWARF_SECTION: u64 = 256 << 20;

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The real user id of process `tgid` (`/proc/PID/status`).
#[must_use]
pub fn process_uid(tgid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{tgid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Opens `name` in the directory `dir` (no leading `/`) below process `tgid`'s root
/// directory, as that process would see it, following no link at all (a link anywhere in the
/// path is refused), never blocking (a FIFO opens and is then refused as not a regular file).
/// `dir` may be a mount of its own (a tmpfs `/tmp`); `name` must be on the same mount as `dir`:
/// a file bind-mounted over it (in a user's own mount namespace, where any user may mount) is
/// refused, whatever it is.
pub fn open_in_dir_below_root(tgid: u32, dir: &str, name: &str) -> io::Result<File> {
    let root = CString::new(format!("/proc/{tgid}/root")).map_err(io::Error::other)?;
    // SAFETY: a NUL-terminated path; the descriptor is checked and owned below.
    let root = unsafe {
        libc::open(
            root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if root < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `root` is a descriptor this function just opened and owns.
    let root = unsafe { File::from_raw_fd(root) };
    let no_links = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let dir = openat2(
        &root,
        dir,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | no_links,
    )?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let file = openat2(
        &dir,
        name,
        flags,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_XDEV | no_links,
    )?;
    if mount_id(&file)? != mount_id(&dir)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "on another mount than its directory",
        ));
    }
    Ok(file)
}

/// openat2(2) of `path` below `dir`; where the kernel has no openat2 (before Linux 5.6),
/// openat with `O_NOFOLLOW` (the last component is not followed, the directories before it
/// are; `open_in_dir_below_root` checks the mount itself).
fn openat2(dir: &File, path: &str, flags: i32, resolve: u64) -> io::Result<File> {
    let path = CString::new(path).map_err(io::Error::other)?;
    let how = OpenHow {
        flags: u64::try_from(flags).unwrap_or(0),
        mode: 0,
        resolve,
    };
    // SAFETY: openat2 with a valid directory descriptor, path and `open_how` of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &raw const how,
            size_of::<OpenHow>(),
        )
    };
    let fd = if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        // SAFETY: as above, with openat.
        i64::from(unsafe { libc::openat(dir.as_raw_fd(), path.as_ptr(), flags | libc::O_NOFOLLOW) })
    } else {
        fd
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: a descriptor just opened, owned by the File from here on.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The id of the mount `file` is on (`mnt_id` of `/proc/self/fdinfo`, Linux 3.15 on).
fn mount_id(file: &File) -> io::Result<u64> {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd()))?
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no mnt_id in fdinfo"))
}

/// Checks that `file` is what a process's own file must be: a regular file with one name,
/// owned by `uid` (the process's real user: a root-owned file is no user's own, whoever could
/// name it), at most `max` bytes. Returns its metadata.
pub fn check_own_regular(file: &File, uid: u32, max: u64) -> io::Result<std::fs::Metadata> {
    let meta = file.metadata()?;
    let refuse = |why: &str| Err(io::Error::new(io::ErrorKind::InvalidData, why.to_owned()));
    if !meta.file_type().is_file() {
        return refuse("not a regular file");
    }
    if meta.nlink() != 1 {
        return refuse("a file with other names (a hard link)");
    }
    if meta.uid() != uid {
        return refuse("owned by another user");
    }
    if meta.len() > max {
        return refuse("larger than latprof reads");
    }
    Ok(meta)
}

/// The most a symbol or string table of a user's binary may claim (the parsers hold what it
/// claims, and an index of it).
pub const MAX_SYMBOL_SECTION: u64 = 256 << 20;

/// Bytes a section may claim beyond what its file holds (`copies::held_bytes`): a small file
/// may hold its data inline, with no block of its own.
const HELD_SLACK: u64 = 1 << 20;

/// Whether `file` is an ELF file (its first bytes).
#[must_use]
pub fn is_elf(file: &File) -> bool {
    let mut magic = [0u8; 4];
    file.read_exact_at(&mut magic, 0).is_ok() && magic == *b"\x7fELF"
}

/// Whether anything may be parsed out of the ELF `file` (a private copy, or the file itself),
/// `len` bytes long: every section the file holds lies within the file, no symbol or string
/// table claims more than `MAX_SYMBOL_SECTION`, and, where `held` is given (a copy's: the
/// bytes it really holds), no section claims more than that (a sparse file claims gigabytes
/// that cost the user nothing). Root's own files are not held to `held`: a compressing file
/// system (ZFS) reports fewer blocks than a file's data. Parsers size what they allocate by
/// these claims (`object` reads the symbol tables whole as it opens a file), so the section
/// headers are read here by hand, before any parser sees the file. 32- and 64-bit
/// little-endian ELF files are read; `false` for anything else.
#[must_use]
pub fn sections_fit(file: &File, len: u64, held: Option<u64>) -> bool {
    let held = held.map_or(u64::MAX, |h| h.saturating_add(HELD_SLACK));
    let mut header = [0u8; 64];
    if file.read_exact_at(&mut header, 0).is_err() || header[..4] != *b"\x7fELF" || header[5] != 1 {
        return false;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    // Where the section table is, its entries' size and count; then, in an entry, where the
    // type, offset and size are (ELF32's are 4 bytes, ELF64's 8).
    let (shoff, shentsize, shnum, entry) = match header[4] {
        1 => (
            u64::from(u32_at(&header, 0x20)),
            u16_at(&header, 0x2e),
            u16_at(&header, 0x30),
            40u16,
        ),
        2 => (
            u64_at(&header, 0x28),
            u16_at(&header, 0x3a),
            u16_at(&header, 0x3c),
            64,
        ),
        _ => return false,
    };
    // No section table is fine (nothing to name from); extended numbering (0 sections with
    // the count elsewhere) and odd entry sizes are not what a linker writes.
    if shnum == 0 {
        return shoff == 0;
    }
    let table = u64::from(shnum) * u64::from(entry);
    if shentsize != entry || shoff.checked_add(table).is_none_or(|end| end > len) {
        return false;
    }
    let mut headers = vec![0u8; usize::try_from(table).unwrap_or(0)];
    if file.read_exact_at(&mut headers, shoff).is_err() {
        return false;
    }
    headers.chunks(usize::from(entry)).all(|h| {
        let (offset, size) = if entry == 40 {
            (u64::from(u32_at(h, 16)), u64::from(u32_at(h, 20)))
        } else {
            (u64_at(h, 24), u64_at(h, 32))
        };
        let kind = object::elf::SectionType(u32_at(h, 4));
        if matches!(kind, object::elf::SHT_NULL | object::elf::SHT_NOBITS) {
            // Holds nothing in the file (`.bss`).
            return true;
        }
        let symbols = matches!(
            kind,
            object::elf::SHT_SYMTAB | object::elf::SHT_DYNSYM | object::elf::SHT_STRTAB
        );
        offset.checked_add(size).is_some_and(|end| end <= len)
            && size <= held
            && (!symbols || size <= MAX_SYMBOL_SECTION)
    })
}

/// Whether a binary's DWARF may be read (`Elf::debug_syms`): nothing in it names another file
/// for the reader to open unless root owns the binary (`meta`: the original's, where `file`
/// is a copy) and the name stays in root's debug directories, and no compressed section
/// claims more than `MAX_DWARF_SECTION` bytes once uncompressed.
#[must_use]
pub fn dwarf_safe(file: &File, meta: &std::fs::Metadata) -> bool {
    let cache = object::ReadCache::new(file);
    let Ok(elf) = ElfFile64::<object::Endianness, _>::parse(&cache) else {
        // Not a 64-bit ELF blazesym could follow links from: its symbols, if any, are read
        // without DWARF.
        return false;
    };
    let by_root = meta.uid() == 0 && meta.mode() & 0o022 == 0;
    for section in elf.sections() {
        let Ok(name) = section.name() else {
            return false;
        };
        let (_, size) = section.file_range().unwrap_or((0, 0));
        if size > meta.len() {
            return false;
        }
        let link = matches!(name, ".gnu_debuglink" | ".gnu_debugaltlink" | ".debug_sup");
        if link {
            if !by_root || size > 4096 {
                return false;
            }
            let Ok(data) = section.data() else {
                return false;
            };
            // `.debug_sup` starts with a version and a flag; the others with the name.
            let data = if name == ".debug_sup" {
                data.get(3..).unwrap_or_default()
            } else {
                data
            };
            let target = data.split(|&b| b == 0).next().unwrap_or_default();
            if !root_debug_name(target) {
                return false;
            }
        }
        if name.starts_with(".zdebug") {
            return false;
        }
        // blazesym allocates what a compressed section claims it holds, all at once.
        match section.compressed_file_range() {
            Ok(r) if r.format == object::CompressionFormat::None => {}
            Ok(r) if r.uncompressed_size <= MAX_DWARF_SECTION => {}
            _ => return false,
        }
    }
    true
}

/// A debug link's target that blazesym resolves only within root's places: a plain file name
/// (looked up in the debug directories and beside the root-owned binary), or a path under
/// `/usr/lib/debug` without `..`.
fn root_debug_name(target: &[u8]) -> bool {
    let Ok(target) = std::str::from_utf8(target) else {
        return false;
    };
    if target.is_empty() || target == "." || target == ".." {
        return false;
    }
    if !target.contains('/') {
        return true;
    }
    target.starts_with("/usr/lib/debug/") && !target.split('/').any(|p| p == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_link_targets() {
        assert!(root_debug_name(b"libc.so.6.debug"));
        assert!(root_debug_name(
            b"/usr/lib/debug/.dwz/x86_64-linux-gnu/libc6.debug"
        ));
        assert!(!root_debug_name(b"/tmp/t3/pub/dbg.fifo"));
        assert!(!root_debug_name(b"/usr/lib/debug/../../../tmp/x"));
        assert!(!root_debug_name(b"sub/dir.debug"));
        assert!(!root_debug_name(b".."));
        assert!(!root_debug_name(b""));
    }

    #[test]
    fn own_binary_may_be_read_and_a_link_below_root_is_refused() {
        let exe = File::open("/proc/self/exe").unwrap();
        // The test binary has no debug link: its DWARF may be read.
        assert!(dwarf_safe(&exe, &exe.metadata().unwrap()));
        let meta = exe.metadata().unwrap();
        assert!(sections_fit(&exe, meta.len(), None));
        assert!(sections_fit(&exe, meta.len(), Some(meta.len())));
        // A file that holds less than its sections claim (a sparse one) is refused.
        assert!(!sections_fit(&exe, meta.len(), Some(0)));
        assert!(is_elf(&exe));
        let pid = std::process::id();
        // /proc/self/exe-like links are not followed below a root.
        let dir = std::env::temp_dir().join(format!("latprof-untrusted-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("target");
        std::fs::write(&target, b"x").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
        let rel = dir
            .strip_prefix("/")
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(open_in_dir_below_root(pid, &rel, "target").is_ok());
        assert!(open_in_dir_below_root(pid, &rel, "link").is_err());
        assert!(
            open_in_dir_below_root(pid, &rel, "../x").is_err(),
            "out of the directory"
        );
        let file = open_in_dir_below_root(pid, &rel, "target").unwrap();
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        assert!(check_own_regular(&file, me, 10).is_ok());
        assert!(check_own_regular(&file, me, 0).is_err());
        std::fs::hard_link(&target, dir.join("hard")).unwrap();
        assert!(check_own_regular(&file, me, 10).is_err(), "two names");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! A process's memory map (`/proc/PID/maps`), as latprof needs it to name user frames: which
//! file (and where in it) an address was, kept after the process is gone.

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Mapped executable (`x` in the permissions).
    pub exec: bool,
    /// Offset into the file of `start`.
    pub offset: u64,
    /// The file's device (major, minor), as the kernel has it.
    pub dev: (u32, u32),
    /// The file's inode (0: anonymous).
    pub inode: u64,
    /// The path as the process sees it (in its mount namespace), or a pseudo name such as
    /// `[vdso]`; empty for an anonymous mapping. A deleted file ends in " (deleted)". Hidden
    /// characters are escaped (`text::printable`).
    pub path: String,
}

impl Mapping {
    /// Whether a file backs it (not anonymous, not a pseudo mapping).
    #[must_use]
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// Where `addr` (inside the mapping) is in the file.
    #[must_use]
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }

    /// The file's name without its directories (and without " (deleted)").
    #[must_use]
    pub fn basename(&self) -> &str {
        let path = self.path.strip_suffix(" (deleted)").unwrap_or(&self.path);
        path.rsplit('/').next().unwrap_or(path)
    }
}

/// Parses `/proc/PID/maps`; lines it cannot read are skipped.
#[must_use]
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    // start-end perms offset dev inode [path]
    let mut rest = line;
    let mut field = || {
        let s = rest.trim_start();
        let end = s.find(' ').unwrap_or(s.len());
        let (f, r) = s.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field();
    let offset = field();
    let dev = field();
    let inode = field();
    // Any user names its files: the name is made printable here, where it enters.
    let path = crate::text::printable(rest.trim_start()).into_owned();
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.split_once(':').and_then(|(a, b)| {
            Some((
                u32::from_str_radix(a, 16).ok()?,
                u32::from_str_radix(b, 16).ok()?,
            ))
        })?,
        inode: inode.parse().ok()?,
        path,
    })
}

/// The devices (major, minor) of the FUSE file systems in `mountinfo` (a process's
/// `/proc/PID/mountinfo`): their files' daemon, which any user may run, answers every stat,
/// open and read of them when and how it likes, so latprof never touches them.
#[must_use]
pub fn fuse_devices(mountinfo: &str) -> Vec<(u32, u32)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, rest) = line.split_once(" - ")?;
            let kind = rest.split(' ').next()?;
            let fuse = kind == "fuse" || kind == "fuseblk" || kind.starts_with("fuse.");
            let dev = mount.split(' ').nth(2)?;
            let (major, minor) = dev.split_once(':')?;
            fuse.then(|| Some((major.parse().ok()?, minor.parse().ok()?)))?
        })
        .collect()
}

/// The mapping that holds `addr` in `maps` (sorted by address, as the kernel lists them).
#[must_use]
pub fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = maps.partition_point(|m| m.start <= addr);
    i.checked_sub(1).map(|i| &maps[i]).filter(|m| addr < m.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c4a00000-55d0c4a01000 r--p 00000000 fe:01 1310722                    /srv/app/wl
55d0c4a01000-55d0c4a02000 r-xp 00001000 fe:01 1310722                    /srv/app/wl
7f3a1c028000-7f3a1c1bd000 r-xp 00028000 fe:01 2490524                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f3a1c400000-7f3a1c401000 rwxp 00000000 00:00 0 
7ffd6b5f2000-7ffd6b5f4000 r-xp 00000000 00:00 0                          [vdso]
7f00000000-7f00001000 r-xp 00000000 fe:01 99 /tmp/old bin (deleted)
";

    #[test]
    fn lines_are_read_with_their_paths() {
        let maps = parse(MAPS);
        assert_eq!(maps.len(), 6);
        assert_eq!(maps[1].start, 0x55d0_c4a0_1000);
        assert!(maps[1].exec && maps[1].is_file());
        assert_eq!(maps[1].file_offset(0x55d0_c4a0_1139), 0x1139);
        assert_eq!(maps[2].basename(), "libc.so.6");
        assert!(maps[3].exec && !maps[3].is_file() && maps[3].path.is_empty());
        assert_eq!(maps[4].path, "[vdso]");
        assert!(!maps[4].is_file());
        assert_eq!(maps[5].path, "/tmp/old bin (deleted)");
        assert_eq!(maps[5].basename(), "old bin");
    }

    #[test]
    fn an_address_finds_its_mapping() {
        let mut maps = parse(MAPS);
        maps.sort_by_key(|m| m.start);
        assert_eq!(
            find(&maps, 0x7f3a_1c10_0000).map(Mapping::basename),
            Some("libc.so.6")
        );
        assert!(find(&maps, 0x7f3a_1c1b_d000).is_none());
        assert!(find(&maps, 0x10).is_none());
    }

    #[test]
    fn fuse_mounts_are_found_by_device() {
        let info = "36 25 0:32 / /home/u/mnt rw,nosuid,nodev - fuse.sshfs u@h:/ rw,user_id=1000\n\
                    37 25 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    38 25 0:45 / /media/win rw - fuseblk /dev/sdb1 rw\n";
        assert_eq!(fuse_devices(info), [(0, 32), (0, 45)]);
        let m = parse_line("7f0000000000-7f0000001000 r-xp 00000000 00:20 12 /home/u/mnt/lib.so")
            .unwrap();
        assert_eq!(m.dev, (0, 0x20));
    }
}

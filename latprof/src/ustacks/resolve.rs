//! Names of user frames: an address goes to the file its process mapped there (read from
//! `/proc/PID/maps` and opened through `/proc/PID/map_files` when the process was first seen,
//! so it works in another mount namespace, after the process exited and after the file was
//! deleted), then to the symbol at that file offset (blazesym: ELF symbols, DWARF, Rust and
//! C++ names demangled). What has no name is shown as `file+0xoffset`, never a bare unknown.

use std::{
    collections::HashMap,
    fs::File,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use super::maps::{self, Mapping};

/// One user frame as shown, with where it was (kept in recordings).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserFrame {
    /// The function, or `file+0xoffset` where the file has no symbol there.
    pub name: String,
    /// The file's path as the process saw it (empty: no file).
    pub module: String,
    /// Offset into that file (the address itself where there is no file).
    pub offset: u64,
    /// Whether `name` is a symbol's.
    pub named: bool,
}

/// A process as first seen: its memory map and its executable files, open.
#[derive(Debug)]
struct Process {
    maps: Vec<Mapping>,
    /// By mapping start: the file mapped there.
    files: HashMap<u64, File>,
}

/// Processes seen and the names found, owned by one thread (blazesym's symbolizer is not
/// `Send`).
pub struct Resolver {
    symbolizer: Symbolizer,
    processes: HashMap<u32, Process>,
    /// (device, inode, file offset) -> name, so that a file shared by processes (libc) is
    /// read once per place.
    names: HashMap<(u64, u64, u64), Option<String>>,
    /// (device, inode) -> the binary's unwind information (`None`: it has none).
    cfi: HashMap<(u64, u64), Option<super::leaf::Cfi>>,
}

impl Default for Resolver {
    fn default() -> Self {
        Self::new()
    }
}

impl Resolver {
    #[must_use]
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_demangling(true)
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .build(),
            processes: HashMap::new(),
            names: HashMap::new(),
            cfi: HashMap::new(),
        }
    }

    /// Reads `tgid`'s memory map and opens its executable files, unless it was seen already
    /// (an address space changes at exec, which the next event after it refreshes: see
    /// `forget`). Returns whether the process could be read.
    pub fn capture(&mut self, tgid: u32) -> bool {
        if self.processes.contains_key(&tgid) {
            return true;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/maps")) else {
            return false;
        };
        let mut list = maps::parse(&text);
        list.sort_by_key(|m| m.start);
        let files = list
            .iter()
            .filter(|m| m.exec && m.is_file())
            .filter_map(|m| {
                File::open(format!("/proc/{tgid}/map_files/{:x}-{:x}", m.start, m.end))
                    .ok()
                    .map(|f| (m.start, f))
            })
            .collect();
        self.processes.insert(tgid, Process { maps: list, files });
        true
    }

    /// Drops what is kept of `tgid` (it exec'd, or its pid is reused).
    pub fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    /// Names the frames of a user backtrace of `tgid`, innermost first: the first is where
    /// the task was (the instruction after its syscall), the others return addresses, named
    /// by their call instruction (the byte before). `sp` and `window` (the stack words from
    /// the user stack pointer up; `sp` 0: none) give back the caller of a frameless leaf.
    pub fn frames(&mut self, tgid: u32, addrs: &[u64], sp: u64, window: &[u64]) -> Vec<UserFrame> {
        let mut addrs = addrs.to_vec();
        if sp != 0
            && let Some(&ip) = addrs.first()
            && let Some(ret) = self.leaf_caller(tgid, ip, window)
            && addrs.get(1) != Some(&ret)
        {
            addrs.insert(1, ret);
        }
        addrs
            .iter()
            .enumerate()
            .map(|(i, &addr)| self.frame(tgid, addr, i > 0))
            .collect()
    }

    /// The return address into the caller of the leaf function at `ip`, where that leaf made
    /// no frame (see `leaf`), if it points into executable code of the process.
    fn leaf_caller(&mut self, tgid: u32, ip: u64, window: &[u64]) -> Option<u64> {
        let process = self.processes.get(&tgid)?;
        let m = maps::find(&process.maps, ip)?;
        if !m.is_file() {
            return None;
        }
        let file = process.files.get(&m.start)?;
        let meta = file.metadata().ok()?;
        let fd = file.as_raw_fd();
        let cfi = self
            .cfi
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| {
                std::fs::read(format!("/proc/self/fd/{fd}"))
                    .ok()
                    .and_then(super::leaf::Cfi::read)
            })
            .as_ref()?;
        let ret = cfi.leaf_return(m.file_offset(ip), 0, window)?;
        maps::find(&process.maps, ret.saturating_sub(1))
            .is_some_and(|m| m.exec)
            .then_some(ret)
    }

    fn frame(&mut self, tgid: u32, addr: u64, is_return: bool) -> UserFrame {
        let look = if is_return {
            addr.saturating_sub(1)
        } else {
            addr
        };
        let Some(process) = self.processes.get(&tgid) else {
            return unmapped(addr);
        };
        let Some(m) = maps::find(&process.maps, look) else {
            return unmapped(addr);
        };
        if !m.is_file() {
            let module = if m.path.is_empty() {
                "[anon]".to_owned()
            } else {
                m.path.clone()
            };
            let offset = look - m.start;
            return UserFrame {
                name: format!("{module}+0x{offset:x}"),
                module,
                offset,
                named: false,
            };
        }
        let offset = m.file_offset(look);
        let fallback = UserFrame {
            name: format!("{}+0x{offset:x}", m.basename()),
            module: m.path.clone(),
            offset,
            named: false,
        };
        let Some(file) = process.files.get(&m.start) else {
            return fallback;
        };
        let Ok(meta) = file.metadata() else {
            return fallback;
        };
        let key = (meta.dev(), meta.ino(), offset);
        let fd = file.as_raw_fd();
        let name = self
            .names
            .entry(key)
            .or_insert_with(|| {
                let src = Source::Elf(Elf::new(format!("/proc/self/fd/{fd}")));
                match self
                    .symbolizer
                    .symbolize_single(&src, Input::FileOffset(offset))
                {
                    Ok(Symbolized::Sym(sym)) => Some(sym.name.into_owned()),
                    _ => None,
                }
            })
            .clone();
        match name {
            Some(name) => UserFrame {
                name,
                named: true,
                ..fallback
            },
            None => fallback,
        }
    }
}

fn unmapped(addr: u64) -> UserFrame {
    UserFrame {
        name: format!("[unmapped]+0x{addr:x}"),
        module: String::new(),
        offset: addr,
        named: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// latprof names its own frames: this test function's address, as a backtrace would
    /// hold it, comes out as its (demangled) name, through latprof's own memory map.
    #[test]
    #[inline(never)]
    fn own_function_is_named() {
        let pid = std::process::id();
        let mut resolver = Resolver::new();
        assert!(resolver.capture(pid));
        let addr = own_function_is_named as usize as u64;
        let frames = resolver.frames(pid, &[addr], 0, &[]);
        assert!(frames[0].named, "{frames:?}");
        assert!(
            frames[0].name.ends_with("own_function_is_named"),
            "{frames:?}"
        );
        // An address nothing maps is said so, with the address.
        let frames = resolver.frames(pid, &[0x10], 0, &[]);
        assert_eq!(frames[0].name, "[unmapped]+0x10");
    }
}

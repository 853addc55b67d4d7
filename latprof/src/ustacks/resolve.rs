//! Names of user frames: an address goes to the file its process mapped there (read from
//! `/proc/PID/maps` and opened through `/proc/PID/map_files` when the process was first seen,
//! so it works in another mount namespace, after the process exited and after the file was
//! deleted), then to the symbol at that file offset (blazesym: ELF symbols, DWARF, Rust and
//! C++ names demangled, with the source file and line where the binary has DWARF); code a JIT
//! generated goes to the process's `perf-PID.map`. What has no
//! name is shown as `file+0xoffset`, never a bare unknown. Frames that are not return
//! addresses (a program built without frame pointers leaves the walk following whatever its
//! frame-pointer register held) end the backtrace with `[truncated]`.

use std::{
    collections::HashMap,
    fmt::Write as _,
    fs::File,
    os::{
        fd::AsRawFd as _,
        unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    rc::Rc,
    time::{Duration, Instant},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use super::{
    leaf::Step,
    maps::{self, Mapping},
    perfmap::PerfMap,
    untrusted,
};
use crate::text::printable;

/// The name of the frame that ends a backtrace cut short (see `Resolver::frames`).
pub const TRUNCATED: &str = "[truncated]";

/// One user frame as shown, with where it was (kept in recordings).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserFrame {
    /// The function, or `file+0xoffset` where the file has no symbol there.
    pub name: String,
    /// The file's path as the process saw it (empty: no file).
    pub module: String,
    /// The file's GNU build id in hex (empty: none, or no file).
    pub build_id: String,
    /// Offset into that file (the address itself where there is no file).
    pub offset: u64,
    /// Whether `name` is a symbol's.
    pub named: bool,
}

impl UserFrame {
    /// The mark that ends a backtrace whose outer frames are unknown.
    #[must_use]
    pub fn truncated() -> Self {
        Self {
            name: TRUNCATED.to_owned(),
            module: String::new(),
            build_id: String::new(),
            offset: 0,
            named: false,
        }
    }

    #[must_use]
    pub fn is_truncated(&self) -> bool {
        self.name == TRUNCATED && self.module.is_empty()
    }
}

/// An executable file some process mapped, open (its inode, even once deleted or in another
/// mount namespace).
#[derive(Debug)]
struct Module {
    file: File,
    dev: u64,
    ino: u64,
    build_id: String,
    /// Whether its DWARF may be read (`untrusted::dwarf_safe`).
    dwarf: bool,
}

impl Module {
    /// `/proc/self/fd/N`: a path any reader of the open file can use.
    fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// A process as seen: its memory map, its executable files, its JIT symbols.
#[derive(Debug)]
struct Process {
    maps: Vec<Mapping>,
    /// By mapping start: the file mapped there.
    files: HashMap<u64, Rc<Module>>,
    /// Its real user: the owner its perf map must have.
    uid: u32,
    /// `perf-PID.map` as read so far (a JIT keeps appending); `None`: the process has no
    /// anonymous executable memory.
    perf_map: Option<PerfMap>,
    /// When its memory map was last read: a frame in a mapping made since (dlopen, a JIT's
    /// new code) reads it again, at most once per `REREAD`.
    maps_read: Instant,
    used: Instant,
}

/// Processes kept before dead ones not used for `KEEP_DEAD` are dropped.
const MAX_PROCESSES: usize = 1024;
const KEEP_DEAD: Duration = Duration::from_secs(300);
/// How often a process's memory map may be read again for a frame it did not cover.
const REREAD: Duration = Duration::from_secs(1);
/// Executable files opened for one process: a process that maps thousands (to exhaust
/// root's descriptors) has the rest named `file+0xoffset`.
const MAX_FILES_PER_PROCESS: usize = 256;
/// Perf-map bytes read for all processes together (`perfmap::MAX_BYTES` for one).
const MAX_PERF_BYTES: u64 = 64 << 20;

/// Processes seen and the names found, owned by one thread (blazesym's symbolizer is not
/// `Send`).
pub struct Resolver {
    symbolizer: Symbolizer,
    /// By (tgid, layout): a pid reused, or a process that exec'd, is another entry.
    processes: HashMap<(u32, u64), Process>,
    /// Open executables by (device, inode), shared by the processes that map them.
    modules: HashMap<(u64, u64), Rc<Module>>,
    /// (device, inode, file offset) -> name, so that a file shared by processes (libc) is
    /// read once per place.
    names: HashMap<(u64, u64, u64), Option<String>>,
    /// (device, inode, file offset) -> whether the bytes before it are a call instruction.
    calls: HashMap<(u64, u64, u64), bool>,
    /// (device, inode) -> the binary's unwind information (`None`: it has none).
    cfi: HashMap<(u64, u64), Option<super::leaf::Cfi>>,
    /// Backtraces named that were cut short (`[truncated]`).
    truncated: u64,
    /// Executable files kept open at most, from the descriptor limit (`open_files_limit`).
    max_open: usize,
    /// Perf-map bytes read so far, against `MAX_PERF_BYTES`.
    perf_bytes: u64,
}

/// Half of the process's descriptor limit, for the files kept open to name frames: the rest
/// is the listener's, the eBPF maps' and the clients'.
fn open_files_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return 256;
    }
    usize::try_from(limit.rlim_cur / 2)
        .unwrap_or(usize::MAX)
        .clamp(64, 8192)
}

impl Default for Resolver {
    fn default() -> Self {
        Self::new()
    }
}

/// The layout key (`layout_key`) of process `tgid` now, from `/proc/PID/stat`.
#[must_use]
pub fn process_layout(tgid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    // After the name in parentheses (which may hold anything): field 3 on.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    // startcode, endcode, startstack: fields 26 to 28 of proc(5).
    Some(latprof_common::layout_key(
        field(26)?,
        field(27)?,
        field(28)?,
    ))
}

impl Resolver {
    #[must_use]
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_demangling(true)
                .enable_code_info(true)
                .enable_inlined_fns(false)
                .build(),
            processes: HashMap::new(),
            modules: HashMap::new(),
            names: HashMap::new(),
            calls: HashMap::new(),
            cfi: HashMap::new(),
            truncated: 0,
            max_open: open_files_limit(),
            perf_bytes: 0,
        }
    }

    /// Backtraces named so far that were cut short.
    #[must_use]
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    /// Reads the memory map of process `tgid` with address-space layout `layout` and opens its
    /// executable files, unless that was done already. Returns whether the process is known:
    /// false once it exited, or exec'd another program (its layout changed).
    pub fn capture(&mut self, tgid: u32, layout: u64) -> bool {
        if let Some(process) = self.processes.get_mut(&(tgid, layout)) {
            process.used = Instant::now();
            return true;
        }
        self.read_new(tgid, layout)
    }

    /// A new backtrace of process `tgid` was announced: its memory map is read (again, if
    /// the process is known: it may have loaded a library or generated code since), while it
    /// lives. Returns whether the process is known.
    pub fn announced(&mut self, tgid: u32, layout: u64) -> bool {
        let key = (tgid, layout);
        let Some(mut process) = self.processes.remove(&key) else {
            return self.read_new(tgid, layout);
        };
        process.used = Instant::now();
        self.read_maps(tgid, layout, &mut process);
        self.processes.insert(key, process);
        true
    }

    /// Reads the memory map of a process not seen before.
    fn read_new(&mut self, tgid: u32, layout: u64) -> bool {
        if process_layout(tgid) != Some(layout) {
            return false;
        }
        let Some(uid) = untrusted::process_uid(tgid) else {
            return false;
        };
        self.prune();
        let mut process = Process {
            maps: Vec::new(),
            files: HashMap::new(),
            uid,
            perf_map: None,
            maps_read: Instant::now(),
            used: Instant::now(),
        };
        if !self.read_maps(tgid, layout, &mut process) {
            return false;
        }
        self.processes.insert((tgid, layout), process);
        true
    }

    /// (Re)reads the memory map of `process` (`tgid`, `layout`), opens the executable files
    /// not open yet and reads what its perf map gained, while the process lives; false once it
    /// is gone or another program.
    fn read_maps(&mut self, tgid: u32, layout: u64, process: &mut Process) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/maps")) else {
            return false;
        };
        let mut list = maps::parse(&text);
        list.sort_by_key(|m| m.start);
        for m in list.iter().filter(|m| m.exec && m.is_file()) {
            if process.files.contains_key(&m.start) {
                continue;
            }
            if process.files.len() >= MAX_FILES_PER_PROCESS {
                break;
            }
            if let Some(module) = self.open_module(tgid, m) {
                process.files.insert(m.start, module);
            }
        }
        // Read before the map changed hands: a process that exec'd meanwhile is not this one.
        if process_layout(tgid) != Some(layout) {
            return false;
        }
        process.maps = list;
        process.maps_read = Instant::now();
        if process.maps.iter().any(|m| m.exec && !m.is_file()) {
            let map = process.perf_map.get_or_insert_with(PerfMap::default);
            let budget = MAX_PERF_BYTES.saturating_sub(self.perf_bytes);
            if let Ok(read) = map.refresh(tgid, process.uid, budget) {
                self.perf_bytes += read;
            }
        }
        true
    }

    /// The executable file mapped at `m` by process `tgid`, opened through its
    /// `map_files` link (what the process maps, in whatever mount namespace), or shared with
    /// the processes that opened it before; `None` where it is no regular file, or the
    /// descriptors for such files are spent.
    fn open_module(&mut self, tgid: u32, m: &Mapping) -> Option<Rc<Module>> {
        let link = format!("/proc/{tgid}/map_files/{:x}-{:x}", m.start, m.end);
        // A device mapped executable is no binary, and opening one may do something.
        let meta = std::fs::metadata(&link).ok()?;
        if !meta.file_type().is_file() {
            return None;
        }
        if let Some(module) = self.modules.get(&(meta.dev(), meta.ino())) {
            return Some(Rc::clone(module));
        }
        if self.modules.len() >= self.max_open {
            // Files only processes gone held.
            self.modules.retain(|_, m| Rc::strong_count(m) > 1);
            if self.modules.len() >= self.max_open {
                return None;
            }
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&link)
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.file_type().is_file() {
            return None;
        }
        let build_id =
            blazesym::helper::read_elf_build_id(&format!("/proc/self/fd/{}", file.as_raw_fd()))
                .ok()
                .flatten()
                .map(|id| {
                    id.iter().fold(String::new(), |mut hex, b| {
                        let _ = write!(hex, "{b:02x}");
                        hex
                    })
                })
                .unwrap_or_default();
        let module = Rc::new(Module {
            dwarf: untrusted::dwarf_safe(&file),
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            build_id,
        });
        self.modules
            .insert((meta.dev(), meta.ino()), Rc::clone(&module));
        Some(module)
    }

    /// Reads the memory map of process `key` again when a frame falls outside what was read
    /// (a library loaded, code generated since), at most once per `REREAD`, while it lives.
    fn reread(&mut self, key: (u32, u64)) {
        let Some(mut process) = self.processes.remove(&key) else {
            return;
        };
        if process.maps_read.elapsed() >= REREAD {
            self.read_maps(key.0, key.1, &mut process);
        }
        self.processes.insert(key, process);
    }

    /// Drops processes that are gone and were not used for a while once many are kept, and
    /// the files only they held open.
    fn prune(&mut self) {
        if self.processes.len() < MAX_PROCESSES {
            return;
        }
        let now = Instant::now();
        self.processes.retain(|&(tgid, layout), p| {
            now.duration_since(p.used) < KEEP_DEAD || process_layout(tgid) == Some(layout)
        });
        if self.processes.len() >= MAX_PROCESSES {
            let mut used: Vec<_> = self.processes.iter().map(|(k, p)| (p.used, *k)).collect();
            used.sort_unstable();
            for (_, key) in used.iter().take(MAX_PROCESSES / 4) {
                self.processes.remove(key);
            }
        }
        self.modules.retain(|_, m| Rc::strong_count(m) > 1);
        self.perf_bytes = self
            .processes
            .values()
            .filter_map(|p| p.perf_map.as_ref())
            .map(PerfMap::bytes)
            .sum();
        let modules = &self.modules;
        self.names
            .retain(|(dev, ino, _), _| modules.contains_key(&(*dev, *ino)));
        self.calls
            .retain(|(dev, ino, _), _| modules.contains_key(&(*dev, *ino)));
        self.cfi.retain(|key, _| modules.contains_key(key));
    }

    /// Names the frames of a user backtrace of process `tgid` (layout `layout`), innermost
    /// first: the first is where the task was (the instruction after its syscall), the others
    /// return addresses, named by their call instruction (the byte before). `sp` and `window`
    /// (the stack words from the user stack pointer up; `sp` 0: none) give back the caller of
    /// a frameless leaf. A frame that is not a return address after a call in executable code
    /// ends the backtrace, as does a walk that did not reach the program's or thread's entry:
    /// the last frame is then `[truncated]`.
    pub fn frames(
        &mut self,
        tgid: u32,
        layout: u64,
        raw: &[u64],
        sp: u64,
        window: &[u64],
    ) -> Vec<UserFrame> {
        let key = (tgid, layout);
        // The walk ends at a null frame pointer; a null return address is no frame.
        let end = raw.iter().position(|&a| a == 0).unwrap_or(raw.len());
        let raw = &raw[..end];
        if !self.processes.contains_key(&key) {
            // Gone before its map was read (it exited or exec'd at once, or its announcement
            // was lost): the addresses only.
            return raw.iter().map(|&addr| gone(addr)).collect();
        }
        let addrs = raw;
        // Frameless functions first (their callers are not in the frame-pointer walk), up to
        // the first with a frame, from which the walk is right (or the first without unwind
        // information: the walk's frames are then checked one by one); where the stack words
        // kept ran out first, the walk's frames would skip callers and are left out.
        let (callers, joined) = if sp == 0 {
            (Vec::new(), true)
        } else {
            self.unwind_frameless(key, addrs.first().copied().unwrap_or(0), window)
        };
        let mut addrs: Vec<u64> = addrs.iter().take(1).copied().chain(callers).collect();
        if joined {
            addrs.extend(raw.iter().skip(1));
        }
        let mut out = Vec::with_capacity(addrs.len() + 1);
        let mut whole = false;
        for (i, &addr) in addrs.iter().enumerate() {
            let Some(frame) = self.frame(key, addr, i > 0) else {
                break;
            };
            // The program's or thread's entry: what the stack holds above it is not calls.
            let entry = is_entry(&frame.name);
            out.push(frame);
            if entry {
                whole = true;
                break;
            }
        }
        if !whole {
            self.truncated += 1;
            out.push(UserFrame::truncated());
        }
        out
    }

    /// The return addresses of the frameless functions from `ip` up (see `leaf`), and whether
    /// the frame-pointer walk goes on from there (false: the stack words kept ran out first).
    fn unwind_frameless(&mut self, key: (u32, u64), ip: u64, window: &[u64]) -> (Vec<u64>, bool) {
        let mut callers = Vec::new();
        let (mut pc, mut at_word) = (ip, 0usize);
        while callers.len() < 32 {
            // A return address is looked up at its call instruction.
            let look = if callers.is_empty() { pc } else { pc - 1 };
            let step = self.step(key, look);
            let k = match step {
                Step::Frame | Step::Unknown => return (callers, true),
                Step::Rsp(k) => k,
            };
            let words = usize::try_from(k / 8).unwrap_or(usize::MAX);
            let Some(&ret) = window.get(at_word + words - 1) else {
                return (callers, false);
            };
            if ret < 2 {
                return (callers, false);
            }
            callers.push(ret);
            pc = ret;
            at_word += words;
        }
        (callers, false)
    }

    /// How the function at `addr` of process `key` finds its caller (`leaf::Cfi::step`).
    fn step(&mut self, key: (u32, u64), addr: u64) -> Step {
        let Some(process) = self.processes.get(&key) else {
            return Step::Unknown;
        };
        let Some(m) = maps::find(&process.maps, addr) else {
            return Step::Unknown;
        };
        let Some(module) = process.files.get(&m.start) else {
            return Step::Unknown;
        };
        let offset = m.file_offset(addr);
        self.cfi
            .entry((module.dev, module.ino))
            .or_insert_with(|| super::leaf::Cfi::read(&module.file))
            .as_ref()
            .map_or(Step::Unknown, |cfi| cfi.step(offset))
    }

    /// One frame, or `None` where `addr` cannot be one (see `frames`).
    fn frame(&mut self, key: (u32, u64), addr: u64, is_return: bool) -> Option<UserFrame> {
        let look = if is_return {
            addr.checked_sub(1)?
        } else {
            addr
        };
        let covered = self.processes.get(&key).is_some_and(|p| {
            maps::find(&p.maps, look).is_some_and(|m| {
                // A file mapped but not opened, or JIT code the perf map did not name yet.
                if m.is_file() {
                    p.files.contains_key(&m.start) || p.files.len() >= MAX_FILES_PER_PROCESS
                } else {
                    p.perf_map.as_ref().is_none_or(|pm| pm.find(look).is_some())
                }
            })
        });
        if !covered {
            self.reread(key);
        }
        let process = self.processes.get_mut(&key)?;
        let m = maps::find(&process.maps, look)?;
        if !m.exec {
            return None;
        }
        if !m.is_file() {
            // Code a JIT generated (its perf map names it), the vDSO, or anonymous code.
            let module = if m.path.is_empty() {
                "[anon]".to_owned()
            } else {
                m.path.clone()
            };
            let offset = look - m.start;
            let jit = process
                .perf_map
                .as_ref()
                .and_then(|pm| pm.find(look))
                .map(str::to_owned);
            return Some(UserFrame {
                named: jit.is_some(),
                name: jit.unwrap_or_else(|| format!("{module}+0x{offset:x}")),
                module,
                build_id: String::new(),
                offset,
            });
        }
        let offset = m.file_offset(look);
        let mut fallback = UserFrame {
            name: format!("{}+0x{offset:x}", m.basename()),
            module: m.path.clone(),
            build_id: String::new(),
            offset,
            named: false,
        };
        let Some(module) = process.files.get(&m.start).cloned() else {
            return Some(fallback);
        };
        fallback.build_id.clone_from(&module.build_id);
        if is_return && !self.after_call(&module, offset + 1) {
            return None;
        }
        let symbolizer = &self.symbolizer;
        let name = self
            .names
            .entry((module.dev, module.ino, offset))
            .or_insert_with(|| {
                // DWARF where it may be read; where it cannot (damaged, or refused by
                // blazesym), the ELF symbols alone.
                let named = |dwarf: bool| {
                    let mut elf = Elf::new(module.fd_path());
                    elf.debug_syms = dwarf;
                    symbolizer.symbolize_single(&Source::Elf(elf), Input::FileOffset(offset))
                };
                match named(module.dwarf) {
                    Ok(Symbolized::Sym(sym)) => Some(with_line(&sym)),
                    Err(_) if module.dwarf => match named(false) {
                        Ok(Symbolized::Sym(sym)) => Some(with_line(&sym)),
                        _ => None,
                    },
                    _ => None,
                }
            })
            .clone();
        Some(match name {
            Some(name) => UserFrame {
                name,
                named: true,
                ..fallback
            },
            None => fallback,
        })
    }

    /// Whether the bytes of `module` before file offset `ret` end in a call instruction (what
    /// a return address follows); true where they cannot be read.
    fn after_call(&mut self, module: &Module, ret: u64) -> bool {
        *self
            .calls
            .entry((module.dev, module.ino, ret))
            .or_insert_with(|| {
                let from = ret.saturating_sub(7);
                let mut bytes = vec![0; usize::try_from(ret - from).unwrap_or(0)];
                module.file.read_exact_at(&mut bytes, from).is_err() || ends_in_call(&bytes)
            })
    }
}

/// A symbol's name, with its source file and line where the binary's DWARF has them:
/// `wait_for_request (server.c:21)`.
fn with_line(sym: &blazesym::symbolize::Sym<'_>) -> String {
    match sym.code_info.as_deref() {
        Some(code) if code.line.is_some() => format!(
            "{} ({}:{})",
            printable(&sym.name),
            printable(&Path::new(&code.file).to_string_lossy()),
            code.line.unwrap_or(0)
        ),
        _ => printable(&sym.name).into_owned(),
    }
}

/// A frame's function without the source line (`with_line`).
#[must_use]
pub fn function(name: &str) -> &str {
    name.split_once(" (").map_or(name, |(f, _)| f)
}

/// Whether `bytes` (those before a return address) end in an x86-64 call: `call rel32` or an
/// indirect `call` (`FF /2`, any addressing form, with or without a REX prefix).
#[must_use]
pub fn ends_in_call(bytes: &[u8]) -> bool {
    let n = bytes.len();
    if n >= 5 && bytes[n - 5] == 0xe8 {
        return true;
    }
    (2..=n.min(7)).any(|len| indirect_call_len(&bytes[n - len..]) == Some(len))
}

/// The length of the `FF /2` call that starts `b`, if one does.
fn indirect_call_len(b: &[u8]) -> Option<usize> {
    let mut i = usize::from((0x40..=0x4f).contains(b.first()?));
    if *b.get(i)? != 0xff {
        return None;
    }
    let modrm = *b.get(i + 1)?;
    if (modrm >> 3) & 7 != 2 {
        return None;
    }
    i += 2;
    let (md, rm) = (modrm >> 6, modrm & 7);
    if md == 3 {
        return Some(i);
    }
    if rm == 4 {
        let sib = *b.get(i)?;
        i += 1;
        if md == 0 && sib & 7 == 5 {
            i += 4;
        }
    } else if md == 0 && rm == 5 {
        i += 4;
    }
    Some(
        i + match md {
            1 => 1,
            2 => 4,
            _ => 0,
        },
    )
}

/// Whether a function is where a program's or a thread's backtrace begins (glibc, musl, Rust
/// and Go runtimes' entries): a walk that ends there is whole.
#[must_use]
pub fn is_entry(name: &str) -> bool {
    let name = function(name);
    let name = name.split('@').next().unwrap_or(name);
    name.starts_with("__libc_start")
        || matches!(
            name,
            "_start"
                | "start"
                | "start_thread"
                | "clone"
                | "clone3"
                | "__clone"
                | "__clone3"
                | "__clone_internal"
                | "thread_start"
                | "libc_start_main_stage2"
                | "runtime.goexit"
                | "runtime.rt0_go"
        )
}

/// A frame of a process whose map was never read.
fn gone(addr: u64) -> UserFrame {
    UserFrame {
        name: format!("[address space gone]+0x{addr:x}"),
        module: String::new(),
        build_id: String::new(),
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
        let layout = process_layout(pid).expect("own layout");
        let mut resolver = Resolver::new();
        assert!(resolver.capture(pid, layout));
        assert!(
            !resolver.capture(pid, layout ^ 2),
            "another layout is not this process"
        );
        let addr = own_function_is_named as *const () as u64;
        let frames = resolver.frames(pid, layout, &[addr], 0, &[]);
        assert!(frames[0].named, "{frames:?}");
        assert!(
            function(&frames[0].name).ends_with("own_function_is_named"),
            "{frames:?}"
        );
        assert_eq!(frames[0].build_id.len(), 40, "{frames:?}");
        // One frame that is no program's entry: cut short, said so.
        assert_eq!(frames.len(), 2);
        assert!(frames[1].is_truncated());
        assert_eq!(resolver.truncated(), 1);
        // An address nothing maps is no frame: the backtrace ends before it.
        let frames = resolver.frames(pid, layout, &[addr, 0x10], 0, &[]);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert!(frames[1].is_truncated());
        // A process never read: its addresses, said so.
        let frames = resolver.frames(pid, layout ^ 2, &[0x10], 0, &[]);
        assert_eq!(frames[0].name, "[address space gone]+0x10");
    }

    #[test]
    fn calls_are_recognized() {
        // call rel32
        assert!(ends_in_call(&[0x90, 0x90, 0xe8, 1, 2, 3, 4]));
        // call *%rax, call *%r11 (REX), call *0x10(%rbx), call *(%rip+disp32),
        // call *0x8(%rax,%rbx,8), call *disp32(,%rax,8)
        assert!(ends_in_call(&[0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xd0]));
        assert!(ends_in_call(&[0x90, 0x90, 0x90, 0x90, 0x41, 0xff, 0xd3]));
        assert!(ends_in_call(&[0x90, 0x90, 0x90, 0x90, 0xff, 0x53, 0x10]));
        assert!(ends_in_call(&[0x90, 0xff, 0x15, 1, 2, 3, 4]));
        assert!(ends_in_call(&[0x90, 0x90, 0x90, 0xff, 0x54, 0xd8, 0x08]));
        assert!(ends_in_call(&[0xff, 0x14, 0xc5, 1, 2, 3, 4]));
        // Not calls: nops, a jmp *%rax (FF /4), a push.
        assert!(!ends_in_call(&[0x90; 7]));
        assert!(!ends_in_call(&[0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xe0]));
        assert!(!ends_in_call(&[0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x55]));
    }

    #[test]
    fn entries_end_whole_backtraces() {
        assert!(is_entry("__libc_start_call_main"));
        assert!(is_entry("start_thread"));
        assert!(is_entry("_start"));
        assert!(!is_entry("main"));
        assert!(!is_entry("wait_for_request"));
    }
}

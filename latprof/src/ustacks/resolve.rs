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
        unix::fs::{FileExt as _, MetadataExt as _},
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
    perfmap,
};

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
}

impl Module {
    /// `/proc/self/fd/N`: a path any reader of the open file can use.
    fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// A process as first seen: its memory map, its executable files, its JIT symbols.
#[derive(Debug)]
struct Process {
    maps: Vec<Mapping>,
    /// By mapping start: the file mapped there.
    files: HashMap<u64, Rc<Module>>,
    /// `perf-PID.map`, re-read when it grew (a JIT keeps appending).
    perf_map: Option<(PathBuf, u64, Vec<perfmap::Symbol>)>,
    used: Instant,
}

/// Processes kept before dead ones not used for `KEEP_DEAD` are dropped.
const MAX_PROCESSES: usize = 1024;
const KEEP_DEAD: Duration = Duration::from_secs(300);

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
        if process_layout(tgid) != Some(layout) {
            return false;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/maps")) else {
            return false;
        };
        let mut list = maps::parse(&text);
        let mut files = HashMap::new();
        for m in list.iter().filter(|m| m.exec && m.is_file()) {
            let Ok(file) = File::open(format!("/proc/{tgid}/map_files/{:x}-{:x}", m.start, m.end))
            else {
                continue;
            };
            let Ok(meta) = file.metadata() else { continue };
            let module = self
                .modules
                .entry((meta.dev(), meta.ino()))
                .or_insert_with(|| {
                    let build_id = blazesym::helper::read_elf_build_id(&format!(
                        "/proc/self/fd/{}",
                        file.as_raw_fd()
                    ))
                    .ok()
                    .flatten()
                    .map(|id| {
                        id.iter().fold(String::new(), |mut hex, b| {
                            let _ = write!(hex, "{b:02x}");
                            hex
                        })
                    })
                    .unwrap_or_default();
                    Rc::new(Module {
                        file,
                        dev: meta.dev(),
                        ino: meta.ino(),
                        build_id,
                    })
                })
                .clone();
            files.insert(m.start, module);
        }
        // Read before the map changed hands: a process that exec'd meanwhile is not this one.
        if process_layout(tgid) != Some(layout) {
            return false;
        }
        list.sort_by_key(|m| m.start);
        let perf_map = list
            .iter()
            .any(|m| m.exec && !m.is_file())
            .then(|| perfmap::path(tgid))
            .filter(|p| p.exists())
            .map(|p| (p, 0, Vec::new()));
        self.prune();
        self.processes.insert(
            (tgid, layout),
            Process {
                maps: list,
                files,
                perf_map,
                used: Instant::now(),
            },
        );
        true
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
            let jit = jit_symbol(&mut process.perf_map, look);
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
                let src = Source::Elf(Elf::new(module.fd_path()));
                match symbolizer.symbolize_single(&src, Input::FileOffset(offset)) {
                    Ok(Symbolized::Sym(sym)) => Some(with_line(&sym)),
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
            sym.name,
            Path::new(&code.file).display(),
            code.line.unwrap_or(0)
        ),
        _ => sym.name.clone().into_owned(),
    }
}

/// A frame's function without the source line (`with_line`).
#[must_use]
pub fn function(name: &str) -> &str {
    name.split_once(" (").map_or(name, |(f, _)| f)
}

/// The JIT symbol at `addr` from a perf map, re-read when the file grew.
fn jit_symbol(
    perf_map: &mut Option<(PathBuf, u64, Vec<perfmap::Symbol>)>,
    addr: u64,
) -> Option<String> {
    let (path, size, symbols) = perf_map.as_mut()?;
    if perfmap::find(symbols, addr).is_none()
        && let Ok(meta) = std::fs::metadata(&*path)
        && meta.len() != *size
        && let Ok(text) = std::fs::read_to_string(&*path)
    {
        *size = meta.len();
        *symbols = perfmap::parse(&text);
    }
    perfmap::find(symbols, addr).map(|s| s.name.clone())
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

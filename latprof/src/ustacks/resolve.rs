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
    os::unix::fs::FileExt as _,
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer, evict,
    source::{Elf, Source},
};

use super::{
    capture::{Module, Processes, View},
    leaf::Step,
    maps,
};
use crate::text::printable;

/// The module of a frame in code a JIT generated that its perf map names: a mapping of its own
/// in pprof, `user_modules` in JSON.
pub const JIT: &str = "[jit]";

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
    /// The source line of the function's entry (its first instruction's, from DWARF): pprof's
    /// `Function.start_line`; 0 where not known.
    pub start_line: u32,
}

impl UserFrame {
    /// The mark that ends a backtrace whose outer frames are unknown.
    #[must_use]
    pub fn truncated() -> Self {
        Self::marker(TRUNCATED)
    }

    /// A frame that is a mark (`[truncated]`, frames not named yet): no file, no symbol.
    #[must_use]
    pub fn marker(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            module: String::new(),
            build_id: String::new(),
            offset: 0,
            named: false,
            start_line: 0,
        }
    }

    #[must_use]
    pub fn is_truncated(&self) -> bool {
        self.name == TRUNCATED && self.module.is_empty()
    }
}

/// Names user frames, with what the capture side (`capture::Processes`) read of each
/// process; owned by one thread (blazesym's symbolizer is not `Send`).
pub struct Resolver {
    symbolizer: Symbolizer,
    /// Shared with the capture thread, which fills it as backtraces are announced.
    processes: Arc<Mutex<Processes>>,
    /// `Processes::generation` when the caches below were last trimmed to its open files.
    generation: u64,
    /// (device, contents' id, file offset) -> name, so that a file shared by processes (libc) is
    /// read once per place.
    names: HashMap<(u64, u64, u64), Option<(String, u32)>>,
    /// Each function's entry line, by (device, contents' id, symbol address): the frames of one
    /// function share it.
    entries: HashMap<(u64, u64, u64), u32>,
    /// (device, contents' id, file offset) -> whether the bytes before it are a call instruction.
    calls: HashMap<(u64, u64, u64), bool>,
    /// The path each file was given to the symbolizer by (`/proc/self/fd/N`): its cache of
    /// the file (a mapping, which keeps a private copy's memory) is dropped with the file.
    given: HashMap<(u64, u64), std::path::PathBuf>,
    /// Backtraces named that were cut short (`[truncated]`).
    truncated: u64,
}

impl Default for Resolver {
    fn default() -> Self {
        Self::new()
    }
}

impl Resolver {
    /// A resolver with a table of processes of its own.
    #[must_use]
    pub fn new() -> Self {
        Self::sharing(Arc::new(Mutex::new(Processes::new())))
    }

    /// A resolver naming frames with the processes another thread captures into `processes`.
    #[must_use]
    pub fn sharing(processes: Arc<Mutex<Processes>>) -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_demangling(true)
                .enable_code_info(true)
                .enable_inlined_fns(false)
                .build(),
            processes,
            generation: 0,
            names: HashMap::new(),
            entries: HashMap::new(),
            calls: HashMap::new(),
            given: HashMap::new(),
            truncated: 0,
        }
    }

    /// Backtraces named so far that were cut short.
    #[must_use]
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    fn table(&self) -> MutexGuard<'_, Processes> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads process `tgid` (`Processes::capture`) unless it was; whether it is known.
    pub fn capture(&mut self, tgid: u32, layout: u64) -> bool {
        self.table().capture(tgid, layout)
    }

    /// What naming a backtrace of process `key` needs, and the caches trimmed to the files
    /// still open.
    fn view(&mut self, key: (u32, u64)) -> Option<View> {
        let table = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let view = table.view(key);
        if table.generation() != self.generation {
            let generation = table.generation();
            let open = table.open_files();
            let keeps = |dev: u64, id: u64| open.contains(&(dev, id));
            self.names.retain(|(dev, id, _), _| keeps(*dev, *id));
            self.entries.retain(|(dev, id, _), _| keeps(*dev, *id));
            self.calls.retain(|(dev, id, _), _| keeps(*dev, *id));
            let closed: Vec<_> = self
                .given
                .extract_if(|(dev, id), _| !keeps(*dev, *id))
                .map(|(_, path)| path)
                .collect();
            drop(table);
            for path in closed {
                let _ = self
                    .symbolizer
                    .evict(&evict::Evict::Elf(evict::Elf::new(path)));
            }
            self.generation = generation;
        }
        view
    }

    /// Names the frames of a user backtrace of process `tgid` (layout `layout`), innermost
    /// first: the first is where the task was (the instruction after its syscall), the others
    /// return addresses, named by their call instruction (the byte before). `sp` and `window`
    /// (the stack words from frame `stepped - 1`'s stack pointer up, the first frames those
    /// the kernel's unwind tables stepped through; `sp` 0: none) give back the callers of
    /// frameless functions from there. A frame that is not a return address after a call in executable code
    /// ends the backtrace, as does a walk that did not reach the program's or thread's entry:
    /// the last frame is then `[truncated]`.
    pub fn frames(
        &mut self,
        tgid: u32,
        layout: u64,
        raw: &[u64],
        sp: u64,
        window: &[u64],
        stepped: usize,
    ) -> Vec<UserFrame> {
        let key = (tgid, layout);
        // The walk ends at a null frame pointer; a null return address is no frame.
        let end = raw.iter().position(|&a| a == 0).unwrap_or(raw.len());
        let raw = &raw[..end];
        let Some(mut view) = self.view(key) else {
            // Gone before its map was read (it exited or exec'd at once, or its announcement
            // was lost): the addresses only.
            return raw.iter().map(|&addr| gone(addr)).collect();
        };
        let addrs = raw;
        // Frameless functions first (their callers are not in the frame-pointer walk), up to
        // the first with a frame, from which the walk is right (or the first without unwind
        // information: the walk's frames are then checked one by one); where the stack words
        // kept ran out first, the walk's frames would skip callers and are left out.
        let stepped = stepped.clamp(1, raw.len().max(1));
        let (callers, joined) = if sp == 0 {
            (Vec::new(), true)
        } else {
            let from = addrs.get(stepped - 1).copied().unwrap_or(0);
            Self::unwind_frameless(&view, from, stepped > 1, window)
        };
        let mut addrs: Vec<u64> = addrs.iter().take(stepped).copied().chain(callers).collect();
        if joined {
            addrs.extend(raw.iter().skip(stepped));
        }
        let mut out = Vec::with_capacity(addrs.len() + 1);
        let mut whole = false;
        for (i, &addr) in addrs.iter().enumerate() {
            let Some(frame) = self.frame(key, &mut view, addr, i > 0) else {
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

    /// The return addresses of the frameless functions from `ip` up (see `leaf`; `ip` itself
    /// a return address where `is_return`), and whether the frame-pointer walk goes on from
    /// there (false: the stack words kept ran out first).
    fn unwind_frameless(view: &View, ip: u64, is_return: bool, window: &[u64]) -> (Vec<u64>, bool) {
        let mut callers = Vec::new();
        let (mut pc, mut at_word) = (ip, 0usize);
        while callers.len() < 32 {
            // A return address is looked up at its call instruction.
            let look = if callers.is_empty() && !is_return {
                pc
            } else {
                pc.saturating_sub(1)
            };
            let step = Self::step(view, look);
            let k = match step {
                Step::Frame | Step::Unknown => return (callers, true),
                Step::Rsp(k) => k,
            };
            let words = usize::try_from(k / 8).unwrap_or(usize::MAX);
            let Some(&ret) = window.get(at_word + words - 1) else {
                return (callers, false);
            };
            // A stack word: signed where the CPU authenticates pointers (arm64).
            let ret = ret & !super::arch::pac_mask();
            if ret < 2 {
                return (callers, false);
            }
            callers.push(ret);
            pc = ret;
            at_word += words;
        }
        (callers, false)
    }

    /// How the function at `addr` of the process `view` shows finds its caller
    /// (`leaf::UnwindInfo::step`).
    fn step(view: &View, addr: u64) -> Step {
        let Some(m) = maps::find(&view.maps, addr) else {
            return Step::Unknown;
        };
        let Some(module) = view.files.get(&m.start) else {
            return Step::Unknown;
        };
        let offset = m.file_offset(addr);
        module.cfi().map_or(Step::Unknown, |cfi| cfi.step(offset))
    }

    /// One frame of process `key`, or `None` where `addr` cannot be one (see `frames`);
    /// `view` is what was read of the process, read again where it does not cover `addr`.
    fn frame(
        &mut self,
        key: (u32, u64),
        view: &mut View,
        addr: u64,
        is_return: bool,
    ) -> Option<UserFrame> {
        let look = if is_return {
            addr.checked_sub(1)?
        } else {
            addr
        };
        // A file mapped but not opened, or JIT code the perf map did not name yet.
        if !view.covers(look, |a| self.table().jit_name(key, a).is_some()) {
            let mut table = self.table();
            table.reread(key);
            if let Some(fresh) = table.view(key) {
                *view = fresh;
            }
        }
        let m = maps::find(&view.maps, look)?;
        if !m.exec {
            return None;
        }
        if !m.is_file() {
            // Code a JIT generated (its perf map names it), the vDSO, or anonymous code.
            let offset = look - m.start;
            let jit = self.table().jit_name(key, look);
            let module = if jit.is_some() {
                JIT.to_owned()
            } else if m.path.is_empty() {
                "[anon]".to_owned()
            } else {
                m.path.clone()
            };
            return Some(UserFrame {
                named: jit.is_some(),
                name: jit.unwrap_or_else(|| format!("{module}+0x{offset:x}")),
                module,
                build_id: String::new(),
                offset,
                start_line: 0,
            });
        }
        let offset = m.file_offset(look);
        let mut fallback = UserFrame {
            name: format!("{}+0x{offset:x}", m.basename()),
            module: m.path.clone(),
            build_id: String::new(),
            offset,
            named: false,
            start_line: 0,
        };
        let Some(module) = view.files.get(&m.start).cloned() else {
            return Some(fallback);
        };
        fallback.build_id.clone_from(&module.build_id);
        if is_return && !self.after_call(&module, offset + 1) {
            return None;
        }
        if !module.parse {
            // A file that could change under latprof and was not copied, or whose sections
            // claim more than it holds: nothing is parsed out of it.
            return Some(fallback);
        }
        // The path the symbolizer is given, kept where it will be used: not for a name named
        // before (most frames), which costs no path and no insert.
        if !self.names.contains_key(&(module.dev, module.id, offset)) {
            let path = module.fd_path();
            if let Some(old) = self.given.insert((module.dev, module.id), path.clone())
                && old != path
            {
                // Closed and opened again before this thread saw it: the old one's cache goes.
                let _ = self
                    .symbolizer
                    .evict(&evict::Evict::Elf(evict::Elf::new(old)));
            }
        }
        let symbolizer = &self.symbolizer;
        let entries = &mut self.entries;
        let name = self
            .names
            .entry((module.dev, module.id, offset))
            .or_insert_with(|| {
                // DWARF where it may be read; where it cannot (damaged, or refused by
                // blazesym), the ELF symbols alone.
                let named = |dwarf: bool, at: Input<u64>| {
                    let mut elf = Elf::new(module.fd_path());
                    elf.debug_syms = dwarf;
                    symbolizer.symbolize_single(&Source::Elf(elf), at)
                };
                // The function's entry line: its first instruction's, where DWARF gave this
                // address a line.
                let mut entry_line = |sym: &blazesym::symbolize::Sym<'_>| -> u32 {
                    if sym.code_info.is_none() {
                        return 0;
                    }
                    *entries
                        .entry((module.dev, module.id, sym.addr))
                        .or_insert_with(|| match named(true, Input::VirtOffset(sym.addr)) {
                            Ok(Symbolized::Sym(entry)) => {
                                entry.code_info.and_then(|c| c.line).unwrap_or(0)
                            }
                            _ => 0,
                        })
                };
                let first = past_mapping_symbols(
                    named(module.dwarf, Input::FileOffset(offset)).map_err(|_| ()),
                    |at| named(module.dwarf, Input::VirtOffset(at)).map_err(|_| ()),
                );
                match first {
                    Ok(Symbolized::Sym(sym)) => Some((with_line(&sym), entry_line(&sym))),
                    Err(()) if module.dwarf => match past_mapping_symbols(
                        named(false, Input::FileOffset(offset)).map_err(|_| ()),
                        |at| named(false, Input::VirtOffset(at)).map_err(|_| ()),
                    ) {
                        Ok(Symbolized::Sym(sym)) => Some((with_line(&sym), 0)),
                        _ => None,
                    },
                    _ => None,
                }
            })
            .clone();
        Some(match name {
            Some((name, start_line)) => UserFrame {
                name,
                named: true,
                start_line,
                ..fallback
            },
            None => fallback,
        })
    }

    /// Whether the bytes of `module` before file offset `ret` end in a call instruction (what
    /// a return address follows); true where they cannot be read, or may not (FUSE).
    fn after_call(&mut self, module: &Module, ret: u64) -> bool {
        if !module.readable {
            return true;
        }
        *self
            .calls
            .entry((module.dev, module.id, ret))
            .or_insert_with(|| {
                let from = ret.saturating_sub(7);
                let mut bytes = vec![0; usize::try_from(ret - from).unwrap_or(0)];
                module.file.read_exact_at(&mut bytes, from).is_err()
                    || super::arch::ends_in_call(super::arch::Arch::HOST, &bytes)
            })
    }
}

/// `first`, a lookup's answer, or where it is an arm64 mapping symbol (`$x` code, `$d` data
/// follows: no function), the function it lies in: the last other symbol below it (`at` looks
/// an address up) whose size reaches the address, past at most `MAPPING_SYMBOLS_SKIPPED`
/// mapping symbols.
fn past_mapping_symbols<'a>(
    first: Result<Symbolized<'a>, ()>,
    at: impl Fn(u64) -> Result<Symbolized<'a>, ()>,
) -> Result<Symbolized<'a>, ()> {
    let sym = match first {
        Ok(Symbolized::Sym(sym)) if is_mapping_symbol(&sym.name) => sym,
        other => return other,
    };
    let target = sym.addr + sym.offset as u64;
    let mut below = sym.addr;
    for _ in 0..MAPPING_SYMBOLS_SKIPPED {
        match at(below.saturating_sub(1)) {
            Ok(Symbolized::Sym(s)) if is_mapping_symbol(&s.name) && s.addr < below => {
                below = s.addr;
            }
            Ok(Symbolized::Sym(s))
                if !is_mapping_symbol(&s.name)
                    && s.size.is_some_and(|n| s.addr + n as u64 > target) =>
            {
                return Ok(Symbolized::Sym(s));
            }
            _ => break,
        }
    }
    Err(())
}

/// How many arm64 mapping symbols (`is_mapping_symbol`) a lookup steps back over at most.
const MAPPING_SYMBOLS_SKIPPED: usize = 16;

/// An arm64 (or 32-bit ARM) mapping symbol: `$x`, `$d`, `$a`, `$t`, alone or followed by `.`
/// and anything. They mark where code and data begin inside functions, in every object the
/// ARM toolchains make, and name nothing.
#[must_use]
pub fn is_mapping_symbol(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 2
        && b[0] == b'$'
        && matches!(b[1], b'x' | b'd' | b'a' | b't')
        && (b.len() == 2 || b[2] == b'.')
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
    source_of(name).0
}

/// A frame's name split into its function and, where `with_line` added them, its source file
/// and line: `wait_for_request (server.c:21)` -> (`wait_for_request`, `server.c`, 21); (`name`,
/// "", 0) otherwise. From the end: the suffix is added last, and a demangled C++ name may hold
/// " (" itself (`std::tuple<void (*)(int)>::_M_run()`).
#[must_use]
pub fn source_of(name: &str) -> (&str, &str, i64) {
    let split = name.strip_suffix(')').and_then(|n| {
        let (rest, line) = n.rsplit_once(':')?;
        let line: i64 = line.parse().ok().filter(|l| *l > 0)?;
        let (function, file) = rest.rsplit_once(" (")?;
        Some((function, file, line))
    });
    split.unwrap_or((name, "", 0))
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
        start_line: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ustacks::capture::process_layout;

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
        let frames = resolver.frames(pid, layout, &[addr], 0, &[], 1);
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
        let frames = resolver.frames(pid, layout, &[addr, 0x10], 0, &[], 1);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert!(frames[1].is_truncated());
        // A process never read: its addresses, said so.
        let frames = resolver.frames(pid, layout ^ 2, &[0x10], 0, &[], 1);
        assert_eq!(frames[0].name, "[address space gone]+0x10");
    }

    #[test]
    fn calls_are_recognized() {
        // call rel32
        assert!(super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0xe8, 1, 2, 3, 4
        ]));
        // call *%rax, call *%r11 (REX), call *0x10(%rbx), call *(%rip+disp32),
        // call *0x8(%rax,%rbx,8), call *disp32(,%rax,8)
        assert!(super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xd0
        ]));
        assert!(super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0x90, 0x90, 0x41, 0xff, 0xd3
        ]));
        assert!(super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0x90, 0x90, 0xff, 0x53, 0x10
        ]));
        assert!(super::super::arch::x86_ends_in_call(&[
            0x90, 0xff, 0x15, 1, 2, 3, 4
        ]));
        assert!(super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0x90, 0xff, 0x54, 0xd8, 0x08
        ]));
        assert!(super::super::arch::x86_ends_in_call(&[
            0xff, 0x14, 0xc5, 1, 2, 3, 4
        ]));
        // Not calls: nops, a jmp *%rax (FF /4), a push.
        assert!(!super::super::arch::x86_ends_in_call(&[0x90; 7]));
        assert!(!super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xe0
        ]));
        assert!(!super::super::arch::x86_ends_in_call(&[
            0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x55
        ]));
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

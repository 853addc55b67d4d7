//! What naming a process's user frames needs from the process while it lives: its memory map,
//! its executable files (opened through `/proc/PID/map_files`, so they stay readable after it
//! exited, in another mount namespace, once deleted) and its perf map. The capture thread
//! (`watch`) reads a process as soon as the kernel announces a backtrace of it; the naming
//! thread reads the same table under a short lock, and names frames outside it: naming (DWARF
//! of a large binary can take seconds) never keeps another process from being read before it
//! exits.

use std::{
    collections::HashMap,
    fmt::Write as _,
    fs::File,
    os::{
        fd::AsRawFd as _,
        unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    },
    path::PathBuf,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use super::{
    copies::{self, Budget, Charge},
    leaf::UnwindInfo,
    maps::{self, Mapping},
    perf_budget::PerfBudget,
    perfmap::PerfMap,
    stamp::Stamp,
    untrusted,
};

/// An executable file some process mapped, open (its inode, even once deleted or in another
/// mount namespace), or a private copy of it (`copies`).
#[derive(Debug)]
pub(super) struct Module {
    /// The file itself where root may map it (`copies::may_map`), else a sealed copy, or the
    /// file itself where no copy could be made (`parse` is then false: it is only read).
    pub(super) file: File,
    /// The original's device.
    pub(super) dev: u64,
    /// Its contents' id (`Stamp::id`): names and unwind rows are kept by (device, id), so
    /// the file opened again for new contents shares none of them.
    pub(super) id: u64,
    /// The original's size and times when opened: a process that maps it later with other
    /// ones maps new contents (`stamp`).
    stamp: Stamp,
    pub(super) build_id: String,
    /// Whether `file` may be parsed and mapped: it cannot change under latprof and its
    /// sections claim no more than it holds (`untrusted::sections_fit`). Without, its frames
    /// are named `file+0xoffset`, and it has no unwind information.
    pub(super) parse: bool,
    /// Whether its DWARF may be read (`untrusted::dwarf_safe`).
    pub(super) dwarf: bool,
    /// Whether it may be read at all: not on FUSE (`copies::served_by_kernel`).
    pub(super) readable: bool,
    /// What its copy costs the budget, given back when it is dropped.
    _charge: Option<Charge>,
    /// Its unwind information, read once for both threads: the kernel's tables are made
    /// from it, and the naming thread unwinds frameless callers with it.
    cfi: OnceLock<Option<Arc<UnwindInfo>>>,
}

impl Module {
    /// Its unwind information (`None`: it has none), read the first time it is asked for.
    pub(super) fn cfi(&self) -> Option<Arc<UnwindInfo>> {
        self.cfi
            .get_or_init(|| {
                self.parse
                    .then(|| UnwindInfo::read(&self.file).map(Arc::new))
                    .flatten()
            })
            .clone()
    }

    /// `/proc/self/fd/N`: a path any reader of the open file can use.
    pub(super) fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// A process as seen: its memory map, its executable files, its JIT symbols.
#[derive(Debug)]
struct Process {
    maps: Vec<Mapping>,
    /// By mapping start: the file mapped there.
    files: HashMap<u64, Arc<Module>>,
    /// Mapping starts of files on FUSE, left unread (counted once each).
    unread: std::collections::HashSet<u64>,
    /// Its real user: the owner its perf map must have.
    uid: u32,
    /// `perf-PID.map` as read so far (a JIT keeps appending); `None`: the process has no
    /// anonymous executable memory.
    perf_map: Option<PerfMap>,
    /// When its memory map was last read: a frame in a mapping made since (dlopen, a JIT's
    /// new code) reads it again, at most once per `REREAD`.
    maps_read: Instant,
    /// When its perf map was last read.
    perf_read: Instant,
    used: Instant,
}

/// What the naming thread takes of a process for one backtrace (the perf map stays: a JIT
/// frame asks for its name under the lock).
#[derive(Clone, Debug)]
pub(super) struct View {
    pub(super) maps: Vec<Mapping>,
    pub(super) files: HashMap<u64, Arc<Module>>,
    pub(super) has_perf_map: bool,
    /// The process's real user (root's processes keep room in the unwind tables).
    pub(super) uid: u32,
}

impl View {
    /// Whether `addr` falls where what was read names it: a file opened (or the process's
    /// files are at their cap), or JIT code its perf map named (`jit`).
    pub(super) fn covers(&self, addr: u64, jit: impl Fn(u64) -> bool) -> bool {
        maps::find(&self.maps, addr).is_some_and(|m| {
            if m.is_file() {
                self.files.contains_key(&m.start) || self.files.len() >= MAX_FILES_PER_PROCESS
            } else {
                !self.has_perf_map || jit(addr)
            }
        })
    }
}

/// Processes kept before dead ones not used for `KEEP_DEAD` are dropped.
const MAX_PROCESSES: usize = 1024;
const KEEP_DEAD: Duration = Duration::from_secs(300);
/// How long a process gone is kept when the copies' budget is short (`copy_of`).
const KEEP_DEAD_SHORT: Duration = Duration::from_secs(10);
/// How often a process's memory map may be read again for a frame it did not cover.
const REREAD: Duration = Duration::from_secs(1);
/// How often its perf map may be read again meanwhile (what it gained: a stat and the new
/// lines).
const REREAD_PERF_MAP: Duration = Duration::from_millis(50);
/// Executable files opened for one process: a process that maps thousands (to exhaust
/// root's descriptors) has the rest named `file+0xoffset`.
const MAX_FILES_PER_PROCESS: usize = 256;

/// What naming left out, counted as it happens (`Counter::UserFilesUnparsed`,
/// `Counter::PerfMapsStopped`).
#[derive(Debug, Default)]
pub struct Tally {
    /// Binaries left unparsed: no copy for want of budget, or sections that do not fit.
    pub unparsed: AtomicU64,
    /// Perf maps whose reading stopped before their end (counted once each time it stops).
    pub perf_stopped: AtomicU64,
    /// Files that needed unwind rows and got none: the kernel's table (or the users' part of
    /// it) was spent.
    pub unwind_full: AtomicU64,
}

/// The processes seen and their open files.
pub struct Processes {
    /// By (tgid, layout): a pid reused, or a process that exec'd, is another entry.
    seen: HashMap<(u32, u64), Process>,
    /// Open executables by (device, inode), shared by the processes that map them.
    modules: HashMap<(u64, u64), Arc<Module>>,
    /// Executable files kept open at most, from the descriptor limit (`open_files_limit`).
    max_open: usize,
    /// What the perf maps kept hold, per user.
    perf: PerfBudget,
    /// What was left out, for the counters (read by the collector without the lock).
    tally: Arc<Tally>,
    /// One more each time files were closed: the naming thread then drops what it keeps
    /// of them.
    generation: u64,
    /// What the private copies of users' files cost.
    copies: Budget,
}

impl Default for Processes {
    fn default() -> Self {
        Self::new()
    }
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
    // startcode, endcode, startstack: fields 26 to 28 of proc(5). None for a kernel thread
    // (no code), as the kernel side's layout.
    let (start, end, stack) = (field(26)?, field(27)?, field(28)?);
    (end != 0).then(|| latprof_common::layout_key(start, end, stack))
}

impl Processes {
    #[must_use]
    pub fn new() -> Self {
        Self {
            seen: HashMap::new(),
            modules: HashMap::new(),
            max_open: open_files_limit(),
            perf: PerfBudget::default(),
            tally: Arc::default(),
            generation: 0,
            copies: Budget::default(),
        }
    }

    /// Bytes of users' files copied now, and files not copied for want of budget so far.
    #[must_use]
    pub fn copies(&self) -> (u64, u64) {
        (self.copies.spent(), self.copies.refused())
    }

    /// What naming left out so far, shared: the collector reads it without the lock.
    #[must_use]
    pub fn tally(&self) -> Arc<Tally> {
        Arc::clone(&self.tally)
    }

    /// Reads the memory map of process `tgid` with address-space layout `layout` and opens its
    /// executable files, unless that was done already. Returns whether the process is known:
    /// false once it exited, or exec'd another program (its layout changed).
    pub fn capture(&mut self, tgid: u32, layout: u64) -> bool {
        if let Some(process) = self.seen.get_mut(&(tgid, layout)) {
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
        let Some(mut process) = self.seen.remove(&key) else {
            return self.read_new(tgid, layout);
        };
        process.used = Instant::now();
        self.read_maps(tgid, layout, &mut process);
        self.seen.insert(key, process);
        true
    }

    /// What naming a backtrace of process `key` needs; `None` where it was never read.
    pub(super) fn view(&self, key: (u32, u64)) -> Option<View> {
        self.seen.get(&key).map(|p| View {
            maps: p.maps.clone(),
            files: p.files.clone(),
            has_perf_map: p.perf_map.is_some(),
            uid: p.uid,
        })
    }

    /// The executable anonymous memory of process `key` whose code its perf map names as
    /// Python's perf trampolines (`py::...`: `trampolines`), for the tables (the capture
    /// thread's; naming a backtrace needs none of it).
    pub(super) fn python_trampolines(&self, key: (u32, u64)) -> Vec<(u64, u64)> {
        let Some(p) = self.seen.get(&key) else {
            return Vec::new();
        };
        p.perf_map.as_ref().map_or_else(Vec::new, |perf| {
            p.maps
                .iter()
                .filter(|m| m.exec && !m.is_file() && perf.names_in(m.start, m.end, "py::"))
                .map(|m| (m.start, m.end))
                .collect()
        })
    }

    /// The perf map's name of JIT code at `addr` in process `key`.
    pub(super) fn jit_name(&self, key: (u32, u64), addr: u64) -> Option<String> {
        self.seen
            .get(&key)?
            .perf_map
            .as_ref()?
            .find(addr)
            .map(str::to_owned)
    }

    /// One more each time files were closed (`prune`).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// The files the processes still alive map, by (device, contents' id): the unwind rows
    /// of any other may be given back (`Tables::reclaim`).
    pub(super) fn files_of_live(&self) -> std::collections::HashSet<(u64, u64)> {
        self.seen
            .iter()
            .filter(|&(&(tgid, layout), _)| process_layout(tgid) == Some(layout))
            .flat_map(|(_, p)| p.files.values().map(|m| (m.dev, m.id)))
            .collect()
    }

    /// The files open here, by (device, contents' id), those the processes kept still map
    /// after a rewrite too: what names may be kept of.
    pub(super) fn open_files(&self) -> std::collections::HashSet<(u64, u64)> {
        self.modules
            .values()
            .chain(self.seen.values().flat_map(|p| p.files.values()))
            .map(|m| (m.dev, m.id))
            .collect()
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
            unread: std::collections::HashSet::new(),
            uid,
            perf_map: None,
            maps_read: Instant::now(),
            perf_read: Instant::now(),
            used: Instant::now(),
        };
        if !self.read_maps(tgid, layout, &mut process) {
            return false;
        }
        self.seen.insert((tgid, layout), process);
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
        // Its FUSE file systems' files are not touched at all, not even with a stat.
        let mut fuse = None;
        for m in list.iter().filter(|m| m.exec && m.is_file()) {
            if process.files.contains_key(&m.start) {
                continue;
            }
            if process.files.len() >= MAX_FILES_PER_PROCESS {
                break;
            }
            let fuse = fuse.get_or_insert_with(|| {
                std::fs::read_to_string(format!("/proc/{tgid}/mountinfo"))
                    .map(|info| maps::fuse_devices(&info))
                    .unwrap_or_default()
            });
            if fuse.contains(&m.dev) {
                if process.unread.insert(m.start) {
                    self.tally.unparsed.fetch_add(1, Ordering::Relaxed);
                }
                continue;
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
            process.perf_map.get_or_insert_with(PerfMap::default);
            self.refresh_perf(tgid, process);
        }
        true
    }

    /// Reads what the perf map of `process` (`tgid`) gained, within its user's budget; where
    /// that is spent, the maps of the user's processes gone a while give theirs back first.
    fn refresh_perf(&mut self, tgid: u32, process: &mut Process) {
        let Some(map) = process.perf_map.as_mut() else {
            return;
        };
        process.perf_read = Instant::now();
        if self.perf.left(process.uid) == 0 {
            self.reclaim_perf();
        }
        let (before, was_stopped) = (map.bytes(), map.stopped());
        let _ = map.refresh(tgid, process.uid, self.perf.left(process.uid));
        self.perf.moved(process.uid, before, map.bytes());
        if map.stopped() && !was_stopped {
            self.tally.perf_stopped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops the perf maps of processes gone for `KEEP_DEAD_SHORT` (their frames were named
    /// while they lived; what they held goes back to their users' budgets).
    fn reclaim_perf(&mut self) {
        let now = Instant::now();
        for (&(tgid, layout), p) in &mut self.seen {
            if now.duration_since(p.used) >= KEEP_DEAD_SHORT
                && let Some(map) = p.perf_map.as_ref()
                && process_layout(tgid) != Some(layout)
            {
                self.perf.moved(p.uid, map.bytes(), 0);
                p.perf_map = None;
            }
        }
    }

    /// Forgets the processes `keep` does not keep, giving their perf maps' bytes back.
    fn forget(&mut self, mut keep: impl FnMut(&(u32, u64), &Process) -> bool) {
        let perf = &mut self.perf;
        self.seen.retain(|key, p| {
            let kept = keep(key, p);
            if !kept && let Some(map) = &p.perf_map {
                perf.moved(p.uid, map.bytes(), 0);
            }
            kept
        });
    }

    /// The executable file mapped at `m` by process `tgid`, opened through its
    /// `map_files` link (what the process maps, in whatever mount namespace), or shared with
    /// the processes that opened it before; `None` where it is no regular file, or the
    /// descriptors for such files are spent.
    fn open_module(&mut self, tgid: u32, m: &Mapping) -> Option<Arc<Module>> {
        let link = format!("/proc/{tgid}/map_files/{:x}-{:x}", m.start, m.end);
        // A device mapped executable is no binary, and opening one may do something.
        let meta = std::fs::metadata(&link).ok()?;
        if !meta.file_type().is_file() {
            return None;
        }
        if let Some(module) = self.modules.get(&(meta.dev(), meta.ino())) {
            if module.stamp == Stamp::of(&meta) {
                return Some(Arc::clone(module));
            }
            // Rewritten in place since it was opened: opened anew below, and the naming
            // thread drops what it keeps of the old one (its processes keep their view).
            self.modules.remove(&(meta.dev(), meta.ino()));
            self.generation += 1;
        }
        if self.modules.len() >= self.max_open {
            // Files only processes gone held.
            self.close_unused();
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
        // Taken before its bytes are read or copied: a write after it moves it.
        let stamp = Stamp::of(&meta);
        let (mappable, readable) = (
            copies::may_map(&file, &meta),
            copies::served_by_kernel(&file),
        );
        let (file, charge) = if mappable || !readable {
            (file, None)
        } else {
            match self.copy_of(&file, &meta) {
                Some((copy, charge)) => (copy, Some(charge)),
                None => (file, None),
            }
        };
        // A copy is held to the bytes it holds; root's own file is not (see `sections_fit`).
        let held = match &charge {
            Some(_) => Some(file.metadata().ok()?.blocks().saturating_mul(512)),
            None => None,
        };
        let parse =
            (mappable || charge.is_some()) && untrusted::sections_fit(&file, meta.len(), held);
        if !parse && (!readable || untrusted::is_elf(&file)) {
            self.tally.unparsed.fetch_add(1, Ordering::Relaxed);
        }
        let build_id = if parse {
            blazesym::helper::read_elf_build_id(&format!("/proc/self/fd/{}", file.as_raw_fd()))
                .ok()
                .flatten()
                .map(|id| {
                    id.iter().fold(String::new(), |mut hex, b| {
                        let _ = write!(hex, "{b:02x}");
                        hex
                    })
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        let module = Arc::new(Module {
            dwarf: parse && untrusted::dwarf_safe(&file, &meta),
            readable,
            parse,
            file,
            dev: meta.dev(),
            id: stamp.id(meta.dev(), meta.ino()),
            stamp,
            build_id,
            cfi: OnceLock::new(),
            _charge: charge,
        });
        self.modules
            .insert((meta.dev(), meta.ino()), Arc::clone(&module));
        Some(module)
    }

    /// A private copy of a user's `file` (`copies`); where the budget is short, the files
    /// of processes gone a while are closed first, giving their copies' bytes back.
    fn copy_of(&mut self, file: &File, meta: &std::fs::Metadata) -> Option<(File, Charge)> {
        if !self.copies.fits(meta.uid(), copies::held_bytes(meta)) {
            let now = Instant::now();
            self.forget(|&(tgid, layout), p| {
                now.duration_since(p.used) < KEEP_DEAD_SHORT || process_layout(tgid) == Some(layout)
            });
            self.close_unused();
        }
        self.copies.copy(file, meta)
    }

    /// Closes the files only processes dropped held (a view the naming thread holds keeps
    /// its own).
    fn close_unused(&mut self) {
        let before = self.modules.len();
        self.modules.retain(|_, m| Arc::strong_count(m) > 1);
        if self.modules.len() != before {
            self.generation += 1;
        }
    }

    /// Reads the memory map of process `key` again when a frame falls outside what was read
    /// (a library loaded, code generated since), at most once per `REREAD`, while it lives;
    /// between those, what its perf map gained, at most once per `REREAD_PERF_MAP` (a JIT
    /// names code in its map as it makes it, or when asked: `jcmd PID Compiler.perfmap`).
    pub(super) fn reread(&mut self, key: (u32, u64)) {
        let Some(mut process) = self.seen.remove(&key) else {
            return;
        };
        if process.maps_read.elapsed() >= REREAD {
            self.read_maps(key.0, key.1, &mut process);
        } else if process.perf_read.elapsed() >= REREAD_PERF_MAP {
            self.refresh_perf(key.0, &mut process);
        }
        self.seen.insert(key, process);
    }

    /// Drops processes that are gone and were not used for a while once many are kept, and
    /// the files only they held open.
    fn prune(&mut self) {
        if self.seen.len() < MAX_PROCESSES {
            return;
        }
        let now = Instant::now();
        self.forget(|&(tgid, layout), p| {
            now.duration_since(p.used) < KEEP_DEAD || process_layout(tgid) == Some(layout)
        });
        if self.seen.len() >= MAX_PROCESSES {
            let mut used: Vec<_> = self.seen.iter().map(|(k, p)| (p.used, *k)).collect();
            used.sort_unstable();
            let oldest: std::collections::HashSet<(u32, u64)> = used
                .iter()
                .take(MAX_PROCESSES / 4)
                .map(|(_, k)| *k)
                .collect();
            self.forget(|key, _| !oldest.contains(key));
        }
        self.close_unused();
    }
}

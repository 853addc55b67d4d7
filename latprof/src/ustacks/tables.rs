//! Unwind tables for the kernel side (`--user-stacks`): the files where a frame-pointer walk
//! breaks, turned into rows (`latprof_common::unwind_row`) the kernel's walk steps through
//! (latprof-ebpf's `unwind`). A file breaks the walk when one of its functions saves the
//! caller's frame pointer and uses the register for something else without making a frame
//! (a distribution's libc: `pthread_cond_timedwait`, whose futex call then leaves no chain to
//! follow). Such a file's whole `.eh_frame` is loaded, once, for every process that maps it; a
//! file with more rows than `UNWIND_FILE_ROWS` (a large program) is left to the frame pointers.
//!
//! Files of the same content share their rows (twelve copies of libc, each its own inode, took
//! twelve tables before), and the processes of users other than root may fill at most
//! `USERS_SHARE` of the table: whatever they map, root's processes find room. A file that gets
//! no rows for want of room is counted (`Counter::UnwindRowsFull`), once the rows of files no
//! live process maps were given back (`reclaim`, `row_space`).

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasher as _, RandomState},
    sync::{Arc, Mutex, atomic::Ordering},
};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use gimli::{
    CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection as _,
    Vendor,
};
use latprof_common::{
    ProcUnwind, ReturnAddress, UNWIND_FILE_ROWS, UNWIND_RANGES, UNWIND_TABLE_ROWS, UnwindRange,
    unwind_row, unwind_rule,
};

use super::{
    arch::{self, Arch},
    capture::{Processes, Tally, View},
    leaf::UnwindInfo,
    row_space::RowSpace,
};

/// The part of the table the processes of users other than root may fill.
pub const USERS_SHARE: u32 = UNWIND_TABLE_ROWS / 4 * 3;

/// Initial instructions a CIE may have for its file to get a table (compilers write a few).
const MAX_CIE_INSTRUCTIONS: usize = 256;
/// `.eh_frame` bytes a file may have for its table to be built (libc's is about 250 KiB):
/// the rows are read from all of it.
const MAX_EH_FRAME: usize = 16 << 20;

/// Files remembered as needing no table (or not fitting) before they are forgotten: a long
/// `serve` sees every binary the machine runs.
const MAX_FILES_SEEN: usize = 16_384;

/// The kernel's tables, and which files' rows are in them.
pub struct Tables {
    rows: Array<MapData, u64>,
    processes: BpfHashMap<MapData, u64, ProcUnwind>,
    /// By file (device, contents' id, `capture::Module::id`): its content's key in `by_content`, or `None` where it has no
    /// table (it needs none, cannot have one, or the rows are spent).
    files: HashMap<(u64, u64), Option<u64>>,
    /// By content (`content_key`): its table.
    by_content: HashMap<u64, Arc<FileTable>>,
    /// Keys contents with a key of this run's own: a file made to collide is not possible to
    /// make without it.
    hasher: RandomState,
    /// Where files left without rows are counted.
    tally: Option<Arc<Tally>>,
    /// Files refused for want of room in the users' share: a user's process does not try them
    /// again, root's does (it may use the rest), so a user cannot keep root's libraries out.
    users_full: std::collections::HashSet<(u64, u64)>,
    /// Whether the last `load` failed for want of room.
    last_full: bool,
    /// Which rows are given.
    space: RowSpace,
    /// The processes the capture thread keeps: which files live processes map, when rows
    /// must be given back (`reclaim`).
    known: Option<Arc<Mutex<Processes>>>,
    /// By file (device, contents' id): the rule at its Python trampolines' return addresses, if it
    /// holds CPython's template (`trampolines`).
    templates: HashMap<(u64, u64), Option<u32>>,
    /// Rows of rules that hold for whole regions, by rule.
    rules: HashMap<u32, u32>,
}

impl Tables {
    #[must_use]
    pub fn new(rows: Array<MapData, u64>, processes: BpfHashMap<MapData, u64, ProcUnwind>) -> Self {
        Self {
            rows,
            processes,
            files: HashMap::new(),
            by_content: HashMap::new(),
            hasher: RandomState::new(),
            tally: None,
            users_full: std::collections::HashSet::new(),
            last_full: false,
            space: RowSpace::default(),
            known: None,
            templates: HashMap::new(),
            rules: HashMap::new(),
        }
    }

    /// Counts the files left without rows in `tally`, and gives back the rows of files no
    /// process of `known` maps when room runs short.
    pub(super) fn count_into(&mut self, tally: Arc<Tally>, known: Arc<Mutex<Processes>>) {
        self.tally = Some(tally);
        self.known = Some(known);
    }

    /// A file's content key: its unwind information and where its segments load, hashed with
    /// this run's key.
    fn content_key(&self, cfi: &UnwindInfo) -> u64 {
        self.hasher.hash_one((cfi.eh_frame(), cfi.layout()))
    }

    /// Gives the process of layout `layout`, as `view` shows it, the tables of the files it
    /// maps executable that need one (loading those not loaded yet).
    pub(super) fn install(&mut self, layout: u64, view: &View, trampolines: &[(u64, u64)]) {
        let mut process = ProcUnwind::default();
        let mut n = 0;
        for m in view.maps.iter().filter(|m| m.exec && m.is_file()) {
            if n >= UNWIND_RANGES {
                break;
            }
            let Some(module) = view.files.get(&m.start) else {
                continue;
            };
            let key = (module.dev, module.id);
            if self.files.len().max(self.templates.len()) >= MAX_FILES_SEEN {
                // What was known of files no live process maps goes, and their rows with it
                // (`reclaim`); then files without a table are judged again when next seen.
                self.reclaim();
                self.files.retain(|_, table| table.is_some());
                self.users_full.clear();
                if self.templates.len() >= MAX_FILES_SEEN {
                    self.templates.clear();
                }
            }
            if !self.files.contains_key(&key) && view.uid != 0 && self.users_full.contains(&key) {
                continue;
            }
            if !self.files.contains_key(&key) {
                self.last_full = false;
                let content = module.cfi().and_then(|cfi| {
                    let content = self.content_key(&cfi);
                    if !self.by_content.contains_key(&content) {
                        let table = self.load(&cfi, view.uid)?;
                        self.by_content.insert(content, Arc::new(table));
                    }
                    Some(content)
                });
                if content.is_none() && self.last_full && view.uid != 0 {
                    self.users_full.insert(key);
                    continue;
                }
                self.files.insert(key, content);
            }
            let Some(table) = self
                .files
                .get(&key)
                .copied()
                .flatten()
                .and_then(|c| self.by_content.get(&c))
            else {
                continue;
            };
            let Some(bias) = table.cfi.bias(m.start, m.end, m.offset) else {
                continue;
            };
            process.ranges[n] = UnwindRange {
                start: m.start,
                end: m.end,
                bias,
                first: table.first,
                count: table.count,
            };
            n += 1;
        }
        n += self.python_trampolines(view, trampolines, &mut process.ranges[n..]);
        // A process that mapped more since replaces its ranges whole; the same ranges are not
        // written again (an announcement comes with each new backtrace: a lookup costs the
        // kernel less than a replacement in its LRU map).
        if n > 0 && self.processes.get(&layout, 0).ok() != Some(process) {
            let _ = self.processes.insert(&layout, &process, 0);
        }
    }

    /// Ranges (into `free`) for `trampolines`, the Python perf trampolines of the process
    /// `view` shows, where one of its files holds CPython's template of the shape
    /// `trampolines.rs` steps through; returns how many were given.
    fn python_trampolines(
        &mut self,
        view: &View,
        trampolines: &[(u64, u64)],
        free: &mut [UnwindRange],
    ) -> usize {
        if trampolines.is_empty() {
            return 0;
        }
        let rule = view
            .maps
            .iter()
            .filter(|m| m.exec && m.is_file())
            .find_map(|m| {
                let module = view.files.get(&m.start)?;
                *self
                    .templates
                    .entry((module.dev, module.id))
                    .or_insert_with(|| {
                        module
                            .parse
                            .then(|| super::trampolines::python_rule(&module.file))
                            .flatten()
                    })
            });
        let Some(rule) = rule else {
            return 0;
        };
        let Some(row) = self.rule_row(rule) else {
            return 0;
        };
        let mut n = 0;
        for (&(start, end), range) in trampolines.iter().zip(free.iter_mut()) {
            *range = UnwindRange {
                start,
                end,
                bias: start,
                first: row,
                count: 1,
            };
            n += 1;
        }
        n
    }

    /// The row of a rule that holds for a whole region (a trampoline's), written once.
    fn rule_row(&mut self, rule: u32) -> Option<u32> {
        if let Some(&row) = self.rules.get(&rule) {
            return Some(row);
        }
        let row = self.space.take(1, UNWIND_TABLE_ROWS)?;
        self.rows.set(row, &unwind_row(0, rule), 0).ok()?;
        self.rules.insert(rule, row);
        Some(row)
    }

    /// Loads the rows of `cfi`'s file, mapped by a process of user `uid`, if it needs them
    /// and they fit.
    fn load(&mut self, cfi: &UnwindInfo, uid: u32) -> Option<FileTable> {
        let rows = rows(cfi)?;
        let count = u32::try_from(rows.len()).ok()?;
        let room = if uid == 0 {
            UNWIND_TABLE_ROWS
        } else {
            USERS_SHARE
        };
        if count > UNWIND_FILE_ROWS {
            return None;
        }
        let taken = self.space.take(count, room);
        let Some(first) = taken.or_else(|| {
            self.reclaim();
            self.space.take(count, room)
        }) else {
            self.last_full = true;
            if let Some(tally) = &self.tally {
                tally.unwind_full.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        };
        for (i, row) in (first..).zip(&rows) {
            if self.rows.set(i, row, 0).is_err() {
                self.space.give_back(first, count);
                return None;
            }
        }
        // Where its segments load is all that is kept of it.
        Some(FileTable {
            first,
            count,
            cfi: cfi.without_eh_frame(),
        })
    }
}

impl Tables {
    /// Gives back the rows of the files no live process maps (a process gone walks nothing
    /// more). What latprof knew of files no live process maps goes with them: a file mapped
    /// again is judged again. A process the kernel still has ranges for into rows given back
    /// (one pruned while it lives) loses them, and gets them again with its next backtrace.
    fn reclaim(&mut self) {
        let Some(known) = &self.known else {
            return;
        };
        let live = known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .files_of_live();
        self.files.retain(|key, _| live.contains(key));
        self.users_full.retain(|key| live.contains(key));
        self.templates.retain(|key, _| live.contains(key));
        let kept: HashSet<u64> = self.files.values().flatten().copied().collect();
        let gone: Vec<(u32, u32)> = self
            .by_content
            .extract_if(|content, _| !kept.contains(content))
            .map(|(_, table)| (table.first, table.count))
            .collect();
        if gone.is_empty() {
            return;
        }
        let into_gone = |first: u32| gone.iter().any(|&(f, n)| first >= f && first < f + n);
        let stale: Vec<u64> = self
            .processes
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, p)| p.ranges.iter().any(|r| r.count > 0 && into_gone(r.first)))
            .map(|(layout, _)| layout)
            .collect();
        for layout in stale {
            let _ = self.processes.remove(&layout);
        }
        for (first, count) in gone {
            self.space.give_back(first, count);
        }
    }
}

/// A file's rows in the kernel's table, and where its segments load.
struct FileTable {
    first: u32,
    count: u32,
    cfi: UnwindInfo,
}

/// The rows of a file's `.eh_frame`, sorted, where it needs them (see the module's doc);
/// `None` where it does not, or where they are more than `UNWIND_FILE_ROWS` or unreadable.
#[must_use]
pub fn rows(cfi: &UnwindInfo) -> Option<Vec<u64>> {
    rows_for(cfi, Arch::HOST)
}

/// `rows` for a file of `arch`. A file needs rows where its code breaks the frame-pointer
/// walk: on x86-64 where a function saves the frame pointer without making a frame (it
/// reuses the register); on arm64 also where a function saves its return address without
/// a frame record (built without frame pointers: the walk would skip it and its caller), and
/// where any function saves x30 with no frame record the walk would see.
#[must_use]
pub fn rows_for(cfi: &UnwindInfo, arch: Arch) -> Option<Vec<u64>> {
    if cfi.eh_frame().len() > MAX_EH_FRAME {
        return None;
    }
    let (sp, fp, ra) = arch::registers(arch);
    let mut eh = EhFrame::new(cfi.eh_frame(), LittleEndian);
    if arch == Arch::Aarch64 {
        // DW_CFA_AARCH64_negate_ra_state (pointer authentication) is parsed, not refused.
        eh.set_vendor(Vendor::AArch64);
    }
    let bases = cfi.bases();
    let mut ctx = Box::new(UnwindContext::new());
    let mut starts: Vec<(u64, u32)> = Vec::new();
    let mut breaks_walk = false;
    let mut checked_cies = std::collections::HashSet::new();
    let mut entries = eh.entries(&bases);
    while let Some(entry) = entries.next().ok()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(EhFrame::cie_from_offset).ok()?;
        // gimli runs the CIE's initial instructions again for each of its FDEs: a real one
        // has a few bytes of them, a file made to hold megabytes (any user's binary is read
        // here, as root) would cost their product.
        let cie = fde.cie();
        if !checked_cies.contains(&cie.offset()) {
            let mut instructions = cie.instructions(&eh, &bases);
            let mut n = 0;
            while instructions.next().ok()?.is_some() {
                n += 1;
                if n > MAX_CIE_INSTRUCTIONS {
                    return None;
                }
            }
            checked_cies.insert(cie.offset());
        }
        let (mut frame, mut saves, mut saves_ra) = (false, false, false);
        let mut table = fde.rows(&eh, &bases, &mut ctx).ok()?;
        while let Some(row) = table.next_row().ok()? {
            let (on_fp, offset) = match row.cfa() {
                CfaRule::RegisterAndOffset { register, offset } if *register == sp => {
                    (false, *offset)
                }
                CfaRule::RegisterAndOffset { register, offset } if *register == fp => {
                    (true, *offset)
                }
                _ => (false, -1),
            };
            let below = |rule: Option<RegisterRule<usize>>| match rule {
                None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => Some(0),
                Some(RegisterRule::Offset(n)) if n < 0 => {
                    n.checked_neg().and_then(|n| u64::try_from(n).ok())
                }
                Some(_) => None,
            };
            let saved = below(row.register(fp));
            let ret = match (arch, below(row.register(ra))) {
                (Arch::X86_64, Some(8)) => Some(ReturnAddress::Saved(8)),
                (Arch::Aarch64, Some(0)) => Some(ReturnAddress::InLinkRegister),
                (Arch::Aarch64, Some(n)) => Some(ReturnAddress::Saved(n)),
                _ => None,
            };
            frame |= on_fp;
            saves |= saved.is_some_and(|s| s != 0);
            saves_ra |= matches!(ret, Some(ReturnAddress::Saved(_)));
            let rule = match (u64::try_from(offset), saved, ret) {
                (Ok(offset), Some(saved), Some(ret)) => {
                    unwind_rule(on_fp, offset, saved, ret).unwrap_or(0)
                }
                _ => 0,
            };
            starts.push((row.start_address(), rule));
            if starts.len() > 2 * UNWIND_FILE_ROWS as usize {
                return None;
            }
        }
        // Past the function: no information, unless another starts there.
        starts.push((fde.end_address(), u32::MAX));
        breaks_walk |= !frame && (saves || (arch == Arch::Aarch64 && saves_ra));
    }
    if !breaks_walk {
        return None;
    }
    // By address; where a function's end and the next one's start meet, the start's rule.
    starts.sort_by_key(|&(addr, rule)| (addr, rule != u32::MAX));
    let mut out: Vec<u64> = Vec::new();
    let mut last: Option<(u64, u32)> = None;
    for (addr, rule) in starts {
        let rule = if rule == u32::MAX { 0 } else { rule };
        let addr32 = u32::try_from(addr).ok()?;
        match last {
            Some((a, _)) if a == addr => {
                out.pop();
            }
            Some((_, r)) if r == rule => continue,
            _ => {}
        }
        out.push(unwind_row(addr32, rule));
        last = Some((addr, rule));
    }
    (out.len() <= UNWIND_FILE_ROWS as usize).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files this test process maps executable, by path.
    fn mapped(name: &str) -> Option<std::fs::File> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let path = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.rsplit('/').next().is_some_and(|b| b.starts_with(name)))?;
        std::fs::File::open(path).ok()
    }

    #[test]
    fn libc_gets_a_table_that_fits_and_the_test_binary_none() {
        let libc = mapped("libc.so").expect("this test links libc");
        let rows = rows(&UnwindInfo::read(&libc).expect("libc's .eh_frame")).expect("a table");
        eprintln!("libc: {} rows", rows.len());
        assert!(rows.len() > 1000 && rows.len() <= UNWIND_FILE_ROWS as usize);
        // Sorted by address, each address once.
        assert!(
            rows.windows(2)
                .all(|w| (w[0] & 0xffff_ffff) < (w[1] & 0xffff_ffff))
        );
        // This Rust binary keeps frame pointers (the workspace's build flags) or saves no
        // frame pointer it then reuses: no table.
        let me = std::fs::File::open("/proc/self/exe").expect("self");
        assert!(rows_of(&me).is_none());
    }

    fn rows_of(file: &std::fs::File) -> Option<Vec<u64>> {
        rows(&UnwindInfo::read(file)?)
    }
}

//! `TASK_SLOTS`, the task entries the programs index by tid (`latprof-ebpf/src/task_table.rs`):
//! their owner words (`SLOT_TIDS`, 8 bytes a slot) are mapped read-only once at attach, and a
//! read looks up only the slots that hold a task, one system call each, as it read each entry
//! of the hash. The entries themselves are not mapped: their pages (17 MB at the defaults)
//! would count in latprof's resident memory.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{Array, Map, MapData};
use latprof_common::{SLOT_CLAIMING, TaskState};

use super::{ProbeConfig, btf::Btf};

/// Owner words a read passes over at once where all are free.
const BLOCK: usize = 64;

/// The slots: their owner words, mapped read-only, and the entries.
pub struct TaskSlots {
    owners: NonNull<u64>,
    slots: usize,
    len: usize,
    entries: Array<MapData, TaskState>,
    /// Keeps the owner words' map (and so the mapping's object) alive.
    _owners_map: MapData,
}

// SAFETY: the mapping is read-only and lives as long as the value; reads copy out of it.
unsafe impl Send for TaskSlots {}
// SAFETY: as above: `&self` only reads.
unsafe impl Sync for TaskSlots {}

impl TaskSlots {
    /// Maps the owner words `owners` (`SLOT_TIDS`) of the entries `entries` (`TASK_SLOTS`),
    /// as the loaded object made them.
    pub(super) fn new(entries: Map, owners: Map) -> Result<Self> {
        let entries =
            Array::<MapData, TaskState>::try_from(entries).context("TASK_SLOTS is not an array")?;
        let Map::Array(owners) = owners else {
            bail!("SLOT_TIDS is not an array");
        };
        let info = owners.info().context("SLOT_TIDS' size")?;
        if info.value_size() != 8 {
            bail!("SLOT_TIDS holds {} bytes a slot, not 8", info.value_size());
        }
        let slots = (info.max_entries() as usize).min(entries.len() as usize);
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = (info.max_entries() as usize * 8).div_ceil(page) * page;
        // SAFETY: a new shared read-only mapping of the map's values; the kernel checks the
        // length against the map's.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                owners.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping SLOT_TIDS");
        }
        let base = NonNull::new(addr.cast::<u64>()).context("mapping SLOT_TIDS")?;
        Ok(Self {
            owners: base,
            slots,
            len,
            entries,
            _owners_map: owners,
        })
    }

    /// Each slot that holds a task: its tid and a copy of its entry. The programs write
    /// slots meanwhile: an entry is copied as a hash lookup copies one, and one freed or
    /// taken by another tid by then (its own `slot_tid` is not the owner's) is left out.
    pub fn for_each(&self, mut f: impl FnMut(u32, &TaskState)) -> Result<()> {
        // One copy of the words, then a run of free ones passed over a block at a time
        // (most slots are free: a read must cost what the tasks do, not the table's size).
        let mut owners = vec![0u64; self.slots];
        // SAFETY: the mapping holds `slots` words; the programs write each whole (a word
        // torn between two values is either, and is checked against the entry below).
        unsafe {
            std::ptr::copy_nonoverlapping(self.owners.as_ptr(), owners.as_mut_ptr(), self.slots);
        }
        for (b, block) in owners.chunks(BLOCK).enumerate() {
            if block.iter().all(|&w| w == 0) {
                continue;
            }
            for (k, &owner) in block.iter().enumerate() {
                // Free (0), being made (`SLOT_CLAIMING`), or not a word the programs write.
                let Ok(tid) = u32::try_from(owner) else {
                    continue;
                };
                if tid == 0 || tid & SLOT_CLAIMING != 0 {
                    continue;
                }
                let index = u32::try_from(b * BLOCK + k)?;
                let entry = self.entries.get(&index, 0).context("read TASK_SLOTS")?;
                if entry.slot_tid == tid {
                    f(tid, &entry);
                }
            }
        }
        Ok(())
    }
}

impl Drop for TaskSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, not used after this.
        unsafe { libc::munmap(self.owners.as_ptr().cast(), self.len) };
    }
}

/// How many slots a run has (`TASK_SLOTS_N`): `--max-tasks` where the kernel has BPF
/// compare-and-swap to claim one (Linux 5.12, which added the `bpf_check_mtu` helper in the
/// same release: BTF names helpers, not instructions), else none (said in `fallbacks`); the
/// programs without compare-and-swap are loaded with none all the same (`load::load_variant`).
/// Nor with the stack cache's bounded loop (`bounded_cache`: before 5.17): its wakeup went
/// past the verifier's million instructions when a lookup could end in either table (the
/// first form of the slots); since a run uses one table it has not been tried with slots.
pub(super) fn slots(
    config: &ProbeConfig,
    btf: &Btf,
    bounded_cache: bool,
    fallbacks: &mut Vec<String>,
) -> u32 {
    let why = if config.debug.no_task_slots {
        "--debug-no-task-slots"
    } else if !btf.has_enumerator("BPF_FUNC_check_mtu") {
        "this kernel lacks BPF compare-and-swap (Linux 5.12)"
    } else if bounded_cache {
        "the stack cache's bounded loop leaves the verifier no room for them"
    } else {
        return config.max_tasks;
    };
    fallbacks.push(format!(
        "task entries are looked up in a hash, not indexed by tid (about 40 ns more per sleep, docs/bench.md): {why}"
    ));
    0
}

/// The hash's entries: every entry where the run has no slots, else one (unused).
pub(super) fn hash_entries(config: &ProbeConfig, slots: u32) -> u32 {
    if slots == 0 { config.max_tasks } else { 1 }
}

//! `TASK_SLOTS`, the task entries the programs index by tid (`latprof-ebpf/src/task_table.rs`),
//! read in place: the array is mapped read-only once at attach, and a read copies the slots
//! that hold a task, instead of one system call per slot.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{Map, MapData};
use latprof_common::{SLOT_CLAIMING, TaskState};

use super::{ProbeConfig, btf::Btf};

/// The array, mapped read-only.
pub struct TaskSlots {
    base: NonNull<TaskState>,
    slots: usize,
    len: usize,
    /// Keeps the map (and so the mapping's object) alive.
    _map: MapData,
}

// SAFETY: the mapping is read-only and lives as long as the value; reads copy out of it.
unsafe impl Send for TaskSlots {}
// SAFETY: as above: `&self` only reads.
unsafe impl Sync for TaskSlots {}

impl TaskSlots {
    /// Maps the array `map`, as the loaded object made it.
    pub(super) fn new(map: Map) -> Result<Self> {
        let Map::Array(map) = map else {
            bail!("TASK_SLOTS is not an array");
        };
        let info = map.info().context("TASK_SLOTS' size")?;
        if info.value_size() as usize != size_of::<TaskState>() {
            bail!(
                "TASK_SLOTS holds {} bytes a slot, latprof expects {}",
                info.value_size(),
                size_of::<TaskState>()
            );
        }
        let slots = info.max_entries() as usize;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = (slots * size_of::<TaskState>()).div_ceil(page) * page;
        // SAFETY: a new shared read-only mapping of the map's values; the kernel checks the
        // length against the map's.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping TASK_SLOTS");
        }
        let base = NonNull::new(addr.cast::<TaskState>()).context("mapping TASK_SLOTS")?;
        Ok(Self {
            base,
            slots,
            len,
            _map: map,
        })
    }

    /// Each slot that holds a task: its tid and a copy of its entry. The programs write
    /// slots meanwhile: an entry is copied as a hash lookup copies one, field by field as they
    /// stand, and one freed or taken by another tid while it was copied is left out.
    pub fn for_each(&self, mut f: impl FnMut(u32, &TaskState)) {
        for i in 0..self.slots {
            // SAFETY: slot i lies within the mapping; the kernel's writes race with this read
            // as they race with a lookup's copy (plain data, any bit pattern valid).
            let slot = unsafe { self.base.as_ptr().add(i) };
            let tid = unsafe { std::ptr::read_volatile(&raw const (*slot).slot_tid) };
            if tid == 0 || tid & SLOT_CLAIMING != 0 {
                continue;
            }
            // The count before the records: a record is written before the count that takes
            // it in (`account`), so those under the count read first are whole.
            let n = unsafe { std::ptr::read_volatile(&raw const (*slot).nr_records) };
            let mut copy = unsafe { std::ptr::read_volatile(slot) };
            let after = unsafe { std::ptr::read_volatile(&raw const (*slot).slot_tid) };
            if after == tid && copy.slot_tid == tid {
                copy.nr_records = copy.nr_records.min(n);
                f(tid, &copy);
            }
        }
    }
}

impl Drop for TaskSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, not used after this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// How many slots a run has (`TASK_SLOTS_N`): `--max-tasks` where the kernel has BPF
/// compare-and-swap to claim one (Linux 5.12, which added the `bpf_check_mtu` helper in the
/// same release: BTF names helpers, not instructions), else none (said in `fallbacks`); the
/// programs without compare-and-swap are loaded with none all the same (`load_best_with`).
/// Nor with the stack cache's bounded loop (`bounded_cache`: before 5.17): each lookup that
/// may end in either table doubles what the verifier walks after it, and that program's
/// wakeup was past the verifier's million instructions.
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

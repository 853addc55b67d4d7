//! Where each task's entry (`TaskState`) lives: a slot of `TASK_SLOTS`, an array indexed by
//! the tid, where the kernel has compare-and-swap to claim one; else `TASKS`, the hash keyed
//! by tid. A run uses one or the other (`TASK_SLOTS_N`, a constant to the verifier): a lookup
//! that could end in either map would have the verifier walk all that follows it twice.
//!
//! A hash lookup hashes the key and walks its bucket: 30-34 ns even with everything in cache
//! (docs/bench.md, "Where lazy's time goes"), and a sleep takes two (its start and its
//! wakeup). An array lookup is an address computed inline; the entry's own `slot_tid` says
//! whose it is. A tid looks at `SLOT_PROBES` slots from `tid % TASK_SLOTS_N`.
//!
//! * **Claim** (a task's first sleep, by its own `sched_switch`): the first free slot of its
//!   probes is taken by compare-and-swap of its owner word (`SLOT_TIDS`) from 0 to the tid
//!   with `SLOT_CLAIMING` set (another CPU may claim it for another tid at once), filled,
//!   then given the tid (the entry's `slot_tid`, then the owner word): until then neither a
//!   lookup nor user space takes it. A tid whose probes are all taken is not
//!   tracked, and counted (`TaskTableFull`), as a full hash's.
//! * **Release** (the task retired at exit): its records emptied, then the slot freed
//!   (`slot_tid` 0, the owner word 0). A later tid of the same probes may take it; a tid in a later slot of the
//!   probes is still found there (a lookup skips free slots, it does not stop at them).
//! * Kernels without compare-and-swap (before 5.12), and the bounded stack cache's programs,
//!   have no slots (`TASK_SLOTS_N` 0): every entry is in the hash, sized to `--max-tasks`.
//!
//! User space finds the slots to read through a read-only mapping of the owner words
//! (`BPF_F_MMAPABLE`), and reads each by the system call (`latprof/src/probe/task_slots.rs`).

use core::{
    intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg},
    sync::atomic::{Ordering::Release, compiler_fence},
};

use aya_ebpf::{bindings::BPF_NOEXIST, macros::map, maps::Array};
use latprof_common::{SLOT_CLAIMING, TaskState};

use crate::{maps::TASKS, settings::TASK_SLOTS_N, shared};

/// `BPF_F_MMAPABLE`: user space maps the array instead of reading it an entry at a time.
const MMAPABLE: u32 = 1 << 10;

/// Slots a tid may take, from `tid % TASK_SLOTS_N` on.
const SLOT_PROBES: u32 = 8;

/// The task entries in slots (`TASK_SLOTS_N` of them; resized at load).
#[map]
pub(crate) static TASK_SLOTS: Array<TaskState> = Array::with_max_entries(1, 0);
/// Whose each slot is: 0 free, a tid with `SLOT_CLAIMING` while it is being made, then the
/// bare tid. A slot is claimed here by compare-and-swap; user space maps this array (8 bytes
/// a slot) to find the slots to read, instead of mapping the entries (their pages would count
/// in its resident memory).
#[map]
pub(crate) static SLOT_TIDS: Array<u64> = Array::with_max_entries(1, MMAPABLE);

/// Slot `k` of `tid`'s probes.
#[inline(always)]
fn slot_index(tid: u32, k: u32, n: u32) -> u32 {
    let i = tid % n + k;
    if i >= n { i - n } else { i }
}

/// The entry of `tid`: in its slots, or in the hash where the run has none.
#[inline(always)]
pub(crate) fn get(tid: u32) -> Option<*mut TaskState> {
    let n = TASK_SLOTS_N.load();
    if n == 0 {
        return TASKS.get_ptr_mut(&tid);
    }
    // Tid 0 (the idle tasks) would match a free slot.
    if tid != 0 {
        for k in 0..SLOT_PROBES {
            if let Some(e) = TASK_SLOTS.get_ptr_mut(slot_index(tid, k, n))
                // SAFETY: a slot of the array; another CPU may write `slot_tid` (a publish or
                // a release), an aligned word read whole.
                && unsafe { core::ptr::read_volatile(&raw const (*e).slot_tid) } == tid
            {
                return Some(e);
            }
        }
    }
    None
}

/// Whether this run keeps its entries in slots ([`claim`]), not in the hash ([`insert_hash`]).
#[inline(always)]
pub(crate) fn slots_on() -> bool {
    TASK_SLOTS_N.load() != 0
}

/// A free slot of `tid`'s probes, claimed for it (none of its entries exists), where the
/// kernel has compare-and-swap (`CAS`; the loader gives the programs without it no slots):
/// the caller fills it, then [`publish`]es it. `None`: all of its probes are taken.
#[inline(always)]
pub(crate) fn claim<const CAS: bool>(tid: u32) -> Option<*mut TaskState> {
    let n = TASK_SLOTS_N.load();
    if !CAS || n == 0 || tid == 0 {
        return None;
    }
    for k in 0..SLOT_PROBES {
        let i = slot_index(tid, k, n);
        let Some(owner) = SLOT_TIDS.get_ptr_mut(i) else {
            continue;
        };
        // SAFETY: a word of the array; the compare-and-swap makes the slot this CPU's alone.
        if unsafe { core::ptr::read_volatile(owner) } != 0 {
            continue;
        }
        shared::write();
        // The old value, not the success flag: the toolchain's linker cannot read the
        // bitcode of the flag's form.
        let won = unsafe {
            atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(owner, 0, u64::from(tid | SLOT_CLAIMING))
        }
        .0 == 0;
        if won && let Some(e) = TASK_SLOTS.get_ptr_mut(i) {
            // SAFETY: the slot this CPU claimed; its `slot_tid` is 0 since its release.
            unsafe { (*e).slot_index = i };
            return Some(e);
        }
    }
    None
}

/// Makes the slot [`claim`]ed for `tid` and filled since its entry: lookups and user space
/// take it from now on.
#[inline(always)]
pub(crate) fn publish(tid: u32, entry: *mut TaskState) {
    // The filling's stores stay before these (x86-64 keeps stores in order; the compiler
    // must too).
    compiler_fence(Release);
    // SAFETY: the slot this CPU claimed.
    unsafe {
        core::ptr::write_volatile(&raw mut (*entry).slot_tid, tid);
        if let Some(owner) = SLOT_TIDS.get_ptr_mut((*entry).slot_index) {
            core::ptr::write_volatile(owner, u64::from(tid));
        }
    }
}

/// Puts `template` (filled, its `slot_tid` 0) in the hash as `tid`'s entry, where the run has
/// no slots, and returns it there. `None`: the hash is full.
#[inline(always)]
pub(crate) fn insert_hash(tid: u32, template: &TaskState) -> Option<*mut TaskState> {
    shared::write();
    TASKS.insert(&tid, template, u64::from(BPF_NOEXIST)).ok()?;
    TASKS.get_ptr_mut(&tid)
}

/// Retires `tid`'s entry `entry` (from [`get`]): its slot freed, or its hash entry removed.
#[inline(always)]
pub(crate) fn remove(tid: u32, entry: *mut TaskState) {
    if !slots_on() {
        let _ = TASKS.remove(&tid);
        return;
    }
    // The merge's reads and the stores before stay before these.
    compiler_fence(Release);
    // SAFETY: the entry of a retired task: nothing of its own writes it any more. User space
    // skips a free slot, and an entry that is no longer the tid it found there; a read
    // between the stores sees no records.
    unsafe {
        core::ptr::write_volatile(&raw mut (*entry).nr_records, 0);
        core::ptr::write_volatile(&raw mut (*entry).slot_tid, 0);
        if let Some(owner) = SLOT_TIDS.get_ptr_mut((*entry).slot_index) {
            core::ptr::write_volatile(owner, 0);
        }
    }
}

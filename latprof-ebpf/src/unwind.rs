//! A user backtrace through frames without frame pointers, by the unwind tables
//! (`--user-stacks`): at a sleep's switch-out, each frame that lies in a file whose table user
//! space loaded for the process (`UNWIND_PROCS`: libc and the like, where the frame-pointer
//! walk breaks) is stepped by its row (a binary search of the file's rows, `UNWIND_ROWS`): the
//! caller's return address at the canonical frame address less 8, the caller's frame pointer
//! where the function saved it. Every other frame is stepped by its frame pointer, as
//! `ustacks::frame_pointer_walk` does.
//!
//! The walk runs under `bpf_loop` (Linux 5.17), one frame a call, its state in this CPU's
//! `UNWIND_WALK` and its frames counted in `USER_BUF`'s `nr`: map memory, of which the
//! verifier knows no value, so that it walks a step once and what follows the walk once (a
//! bounded loop of table steps beside the frame-pointer loop, or a state on the caller's
//! stack, was over its million instructions). A process without tables is walked here too, by
//! frame pointers only: the bounded loop of `ustacks::frame_pointer_walk` is then left out of the programs
//! the verifier walks. Inside a callback the verifier compares states exactly (a loop of its
//! own), so a step holds no branch whose two sides go on apart for long: the range is found,
//! then searched once, and the search's selects are arithmetic. Without `bpf_loop`
//! (`UNWIND_ON` 0), no process has tables here: `ustacks::frame_pointer_walk` alone.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_loop, bpf_probe_read_user, generated},
    macros::map,
    maps::{Array, PerCpuArray},
};
use latprof_common::{
    ProcUnwind, UNWIND_CFA_FP, UNWIND_RANGES, UNWIND_RULE_BITS, UNWIND_RULE_SLOT, UNWIND_SEARCH,
    USER_FRAMES, USER_STACK_WINDOW, UnwindRange, unwind_places,
};

use crate::{
    maps::{UNWIND_PROCS, UNWIND_ROWS, UNWIND_WALK, USER_BUF, UnwindWalk},
    settings::{PT_REGS_LR_OFF, UNWIND_ON, USER_PAC_MASK, USER_WALK_FRAMES},
};

/// Per CPU: the rule each of the last searches found (`rule`), in a slot of its row and
/// address (1 entry without `--user-stacks`: every lookup then misses).
#[map]
static UNWIND_RULES: PerCpuArray<RuleSlot> =
    PerCpuArray::with_max_entries(1 << UNWIND_RULE_BITS, 0);

/// Each CPU's stack window (`window`), by the CPU's number: in an array of one entry per
/// possible CPU with `--user-stacks`, one entry without (a per-CPU map's value is that size
/// on every CPU whether it is used or not).
#[map]
static STACK_WINDOWS: Array<[u64; USER_STACK_WINDOW]> = Array::with_max_entries(1, 0);

/// A rule a search found: `tag` says for which file's rows (their first row) and address in
/// the file; `RULE_TAGGED` set, so that a slot never written matches nothing.
#[repr(C)]
#[derive(Clone, Copy)]
struct RuleSlot {
    tag: u64,
    rule: u64,
}
const _: () = assert!(size_of::<RuleSlot>() as u64 == UNWIND_RULE_SLOT);
const RULE_TAGGED: u64 = 1 << 63;

/// The end of user addresses with 48-bit virtual addresses: arm64's (Debian's kernels' VA_BITS),
/// and above x86-64's (4-level paging ends at 1 << 47, and the addresses between are not
/// canonical, so nothing there is ever read). 5-level paging's and 52-bit VAs' are above, and
/// rare (mapped there only on request).
pub(crate) const USER_TOP: u64 = 1 << 48;

/// What a walk leaves for user space: the frames the tables stepped through, the first
/// counted (1: none), and the stack pointer of the last of them; and for the task's next
/// walk, the highest address of the stack it read.
pub(crate) struct Walked {
    pub(crate) stepped: u64,
    pub(crate) win_sp: u64,
    pub(crate) top: u64,
}

/// Walks the backtrace from the user registers at the syscall (`ip`, `sp`, `bp`, of the
/// process of layout `layout`) into this CPU's `USER_BUF` (its `frames[0]` their `ip`, its
/// `nr` one), by the process's tables where it has them, by frame pointers elsewhere. `top`
/// is the highest address of the task's stack its last walk read (0: none): the stack up to
/// it is read in one read first (`window`). `None` where this kernel runs no walk under
/// `bpf_loop` (`UNWIND_ON` 0: nothing done).
#[inline(always)]
pub(crate) fn table_walk(
    ip: u64,
    sp: u64,
    bp: u64,
    lr: u64,
    layout: u64,
    top: u64,
) -> Option<Walked> {
    if UNWIND_ON.load() != 1 {
        return None;
    }
    // Never missing; a backtrace of one frame where it were.
    let Some(walk) = UNWIND_WALK.get_ptr_mut(0) else {
        return Some(Walked {
            stepped: 1,
            win_sp: sp,
            top: 0,
        });
    };
    let max = USER_WALK_FRAMES.load().min(USER_FRAMES as u32);
    // SAFETY: this CPU's entry; programs on one CPU do not run concurrently here (IRQs off in
    // sched_switch). The callback is a static function of this object.
    unsafe {
        let regs = &mut *walk;
        regs.ip = ip;
        regs.sp = sp;
        regs.bp = bp;
        regs.lr = lr;
        regs.sp_known = 1;
        regs.win_sp = sp;
        regs.stepped = 1;
        regs.range = 0;
        regs.tables = 0;
        regs.top = 0;
        window(regs, sp, top);
        // The process's ranges, copied once for the walk: each step reads them from this
        // CPU's entry, not from the LRU map (a hash and a bucket walk a frame).
        if let Some(process) = UNWIND_PROCS.get_ptr(&layout) {
            let (from, to) = (process.cast::<u64>(), (&raw mut regs.process).cast::<u64>());
            // Word by word, read through volatile loads: not a byte-wise memcpy call.
            for w in 0..size_of::<ProcUnwind>() / 8 {
                to.add(w).write(core::ptr::read_volatile(from.add(w)));
            }
            regs.tables = 1;
        }
        bpf_loop(
            max.saturating_sub(1),
            step as *const () as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        Some(Walked {
            stepped: core::ptr::read_volatile(&raw const regs.stepped),
            win_sp: core::ptr::read_volatile(&raw const regs.win_sp),
            top: core::ptr::read_volatile(&raw const regs.top),
        })
    }
}

/// Reads the task's stack from `sp` up to `top` (the highest address its last walk read),
/// at most `USER_STACK_WINDOW` words, into `regs.window` in one read: a step's reads of the
/// stack (probe reads, each a helper call that opens user memory) then come from it. That
/// memory was read before and stays mapped (a stack does not shrink while its thread lives);
/// where the read fails all the same (the task's stack moved), the steps read the stack as
/// before.
#[inline(always)]
fn window(regs: &mut UnwindWalk, sp: u64, top: u64) {
    regs.window_base = sp;
    regs.window_len = 0;
    // SAFETY: a helper without arguments.
    regs.window_cpu = unsafe { bpf_get_smp_processor_id() };
    if top <= sp {
        return;
    }
    let Some(window) = STACK_WINDOWS.get_ptr_mut(regs.window_cpu) else {
        return;
    };
    // Its innermost part where the stack runs deeper than the window; whole words, so that
    // a word `read_word` takes from it was read whole.
    let len = top.wrapping_sub(sp).min((USER_STACK_WINDOW * 8) as u64) & !7;
    // A bound the verifier sees.
    let len = len as u32 & (USER_STACK_WINDOW * 8 * 2 - 1) as u32;
    if len as usize > USER_STACK_WINDOW * 8 {
        return;
    }
    // SAFETY: `len` bytes fit the window; a probe read of user memory fails safely.
    let read = unsafe { generated::bpf_probe_read_user(window.cast(), len, sp as *const c_void) };
    if read == 0 {
        regs.window_len = u64::from(len);
    }
}

/// The word of the stack at `addr`: from the window where it lies inside it, else by a probe
/// read.
#[inline(always)]
fn read_word(regs: &UnwindWalk, addr: u64) -> Result<u64, i32> {
    let off = addr.wrapping_sub(regs.window_base);
    if off.is_multiple_of(8)
        && off < regs.window_len
        && regs.window_len - off >= 8
        && let Some(window) = STACK_WINDOWS.get(regs.window_cpu)
    {
        // Masked: a bound the verifier sees (`window_len` is at most the window's size).
        return Ok(window[(off / 8) as usize & (USER_STACK_WINDOW - 1)]);
    }
    // SAFETY: a probe read of user memory fails safely.
    unsafe { bpf_probe_read_user(addr as *const u64) }
}

/// The two words of the stack at `addr` (a frame's saved frame pointer and return address).
#[inline(always)]
fn read_pair(regs: &UnwindWalk, addr: u64) -> Result<[u64; 2], i32> {
    let off = addr.wrapping_sub(regs.window_base);
    if off.is_multiple_of(8)
        && off < regs.window_len
        && regs.window_len - off >= 16
        && let Some(window) = STACK_WINDOWS.get(regs.window_cpu)
    {
        // Masked as in `read_word`.
        let i = (off / 8) as usize;
        return Ok([
            window[i & (USER_STACK_WINDOW - 1)],
            window[(i + 1) & (USER_STACK_WINDOW - 1)],
        ]);
    }
    // SAFETY: a probe read of user memory fails safely.
    unsafe { bpf_probe_read_user(addr as *const [u64; 2]) }
}

/// One step (the `i`th): the caller of the walk's last frame. Returns 1 to stop.
// Not inlined: `bpf_loop` calls it by address, as a BPF function of its own.
#[inline(never)]
extern "C" fn step(i: u64, _ctx: *mut c_void) -> i64 {
    let (Some(walk), Some(buf)) = (UNWIND_WALK.get_ptr_mut(0), USER_BUF.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: this CPU's entries (see `table_walk`).
    let (regs, buf) = unsafe { (&mut *walk, &mut *buf) };
    // A return address is looked up at its call instruction, the byte before.
    let look = if i == 0 {
        regs.ip
    } else {
        regs.ip.wrapping_sub(1)
    };
    let rule = if regs.tables == 0 {
        0
    } else {
        rule(look, regs)
    };
    let (ret, cfa, bp) = if rule == 0 {
        // By the frame pointer: the frame holds the caller's frame pointer and the return
        // address (as `ustacks::frame_pointer_walk`; arm64's frame record is the same pair).
        let fp = regs.bp;
        if fp == 0 || fp & 7 != 0 || fp < regs.sp || fp >= USER_TOP {
            return 1;
        }
        let Ok([next, ret]) = read_pair(regs, fp) else {
            return 1;
        };
        regs.top = fp + 16;
        // The caller's stack pointer: right above the frame on x86-64, whose call pushed the
        // return address and whose prologue pushed rbp next to it. arm64's functions save their
        // other registers above the frame record (x19-x28), so there it is not known: a table
        // step after this one finds its CFA from the frame record instead.
        regs.sp_known = u64::from(PT_REGS_LR_OFF.load() == 0);
        // A backward or null pointer ends the walk at the next step (its checks above), not
        // here: the frame it leads to may be in a file with a table, which needs no frame
        // pointer (a callback from code that reuses the register).
        (ret, fp + 16, next)
    } else {
        let offset = u64::from(rule & (UNWIND_CFA_FP - 1));
        let (ra, saved) = unwind_places(rule);
        let cfa = if rule & UNWIND_CFA_FP != 0 {
            regs.bp.wrapping_add(offset)
        } else if regs.sp_known != 0 {
            regs.sp.wrapping_add(offset)
        } else if saved != 0 {
            // After an arm64 frame-pointer step the stack pointer is not known, but x29 points
            // at this function's frame record, where it saved its caller's x29: `saved` below
            // the CFA.
            regs.bp.wrapping_add(saved)
        } else {
            return 1;
        };
        regs.sp_known = 1;
        // The caller's frame lies above this one; at the same place only where this frame
        // has nothing on the stack yet (arm64: the return address still in the link register).
        if cfa < regs.sp || (cfa == regs.sp && ra.is_some()) || cfa >= USER_TOP {
            return 1;
        }
        let ret = match ra {
            Some(ra) => match read_word(regs, cfa.wrapping_sub(ra)) {
                Ok(ret) => ret,
                Err(_) => return 1,
            },
            // Only the innermost frame can still have it there: an outer one made a call,
            // which wrote the link register.
            None if i == 0 => regs.lr,
            None => return 1,
        };
        regs.top = cfa;
        let bp = if saved == 0 {
            regs.bp
        } else {
            match read_word(regs, cfa.wrapping_sub(saved)) {
                Ok(bp) => bp,
                Err(_) => return 1,
            }
        };
        (ret, cfa, bp)
    };
    // Pointer authentication's signature off (arm64; the mask is 0 elsewhere).
    let ret = ret & !USER_PAC_MASK.load();
    let n = buf.nr as usize;
    if ret == 0 || n >= USER_FRAMES {
        return 1;
    }
    buf.frames[n] = ret;
    buf.nr = n as u32 + 1;
    if rule != 0 {
        regs.stepped = n as u64 + 1;
        regs.win_sp = cfa;
    }
    regs.ip = ret;
    regs.sp = cfa;
    regs.bp = bp;
    0
}

/// The rule of the row that covers `ip` in the walk's process's tables (`regs.process`); 0
/// where none does. `regs`' scratch holds the range's index between its finding and its
/// search.
#[inline(always)]
fn rule(ip: u64, regs: &mut UnwindWalk) -> u32 {
    regs.range = UNWIND_RANGES as u64;
    for r in 0..UNWIND_RANGES {
        let range = &regs.process.ranges[r];
        if range.count == 0 {
            break;
        }
        if ip >= range.start && ip < range.end {
            regs.range = r as u64;
            break;
        }
    }
    // Read back from map memory: an index of no value the verifier knows, so that it walks
    // one search, not one per range.
    // SAFETY: reads this CPU's entry (see `table_walk`).
    let r = unsafe { core::ptr::read_volatile(&raw const regs.range) } as usize;
    let Some(range) = regs.process.ranges.get(r) else {
        return 0;
    };
    let Ok(addr) = u32::try_from(ip.wrapping_sub(range.bias)) else {
        return 0;
    };
    // A file's rows never change once written (nor are they reused), so the rule of an
    // address in them stays what a search found: a hit saves the search's 17 dependent loads
    // over a table of 2 MiB (`sched_switch` 1,140 -> 1,000 ns per run with `--user-stacks` on
    // the ping-pong, whose backtrace takes 9 steps).
    let tag = RULE_TAGGED | u64::from(range.first) << 32 | u64::from(addr);
    let index = (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - UNWIND_RULE_BITS)) as u32;
    let slot = UNWIND_RULES.get_ptr_mut(index);
    if let Some(slot) = slot {
        // SAFETY: this CPU's slot (see `table_walk`).
        let slot = unsafe { &*slot };
        if slot.tag == tag {
            return slot.rule as u32;
        }
    }
    let rule = search(range, addr);
    if let Some(slot) = slot {
        // SAFETY: as above.
        unsafe {
            (*slot).tag = tag;
            (*slot).rule = u64::from(rule);
        }
    }
    rule
}

/// The rule of the last of `range`'s rows at or below `addr`; 0 where none is.
#[inline(always)]
fn search(range: &UnwindRange, addr: u32) -> u32 {
    // The last row at or below `addr`: rows[lo] <= addr < rows[hi]. Without a branch on the
    // rows (arithmetic only), so that the verifier walks each round once.
    let (mut lo, mut hi) = (0u64, u64::from(range.count));
    for _ in 0..UNWIND_SEARCH {
        let mid = u64::midpoint(lo, hi);
        let Some(&row) = UNWIND_ROWS.get(range.first.wrapping_add(mid as u32)) else {
            return 0;
        };
        // All ones where the row starts above `addr` (the difference of two 32-bit numbers
        // is negative), else 0: read back, so that the compiler knows nothing of it and does
        // not turn the selects below into branches again.
        let above = (u64::from(addr)
            .wrapping_sub(row & 0xffff_ffff)
            .cast_signed()
            >> 63)
            .cast_unsigned();
        // SAFETY: reads a local.
        let above = unsafe { core::ptr::read_volatile(&raw const above) };
        hi = (mid & above) | (hi & !above);
        lo = (lo & above) | (mid & !above);
    }
    match UNWIND_ROWS.get(range.first.wrapping_add(lo as u32)) {
        Some(&row) if (row & 0xffff_ffff) <= u64::from(addr) => (row >> 32) as u32,
        _ => 0,
    }
}

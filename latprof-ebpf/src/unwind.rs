//! A user backtrace through frames without frame pointers, by the unwind tables
//! (`--user-stacks`): at a sleep's switch-out, each frame that lies in a file whose table user
//! space loaded for the process (`UNWIND_PROCS`: libc and the like, where the frame-pointer
//! walk breaks) is stepped by its row (a binary search of the file's rows, `UNWIND_ROWS`): the
//! caller's return address at the canonical frame address less 8, the caller's frame pointer
//! where the function saved it. Every other frame is stepped by its frame pointer, as
//! `ustacks::walk` does.
//!
//! The walk runs under `bpf_loop` (Linux 5.17), one frame a call, its state in this CPU's
//! `UNWIND_WALK` and its frames counted in `USER_BUF`'s `nr`: map memory, of which the
//! verifier knows no value, so that it walks a step once and what follows the walk once (a
//! bounded loop of table steps beside the frame-pointer loop, or a state on the caller's
//! stack, was over its million instructions). Without `bpf_loop` (`UNWIND_ON` 0), no process
//! has tables here: `ustacks::walk` alone.

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_loop, bpf_probe_read_user};
use latprof_common::{ProcUnwind, UNWIND_CFA_RBP, UNWIND_RANGES, UNWIND_SEARCH, USER_FRAMES};

use crate::{
    maps::{UNWIND_PROCS, UNWIND_ROWS, UNWIND_WALK, USER_BUF, UnwindRegs},
    settings::{UNWIND_ON, USER_WALK_FRAMES},
};

/// The end of user addresses on x86-64 (as `ustacks`).
const USER_TOP: u64 = 1 << 47;

/// Where a walk stands (`maps::UnwindRegs`).
pub(crate) type Regs = UnwindRegs;

impl Regs {
    /// The user registers at the syscall, of the process of layout `layout`.
    pub(crate) fn new(ip: u64, sp: u64, bp: u64, layout: u64) -> Self {
        Self {
            ip,
            sp,
            bp,
            layout,
            win_sp: sp,
            stepped: 1,
        }
    }
}

/// Walks the backtrace from `regs` (`frames[0]` of this CPU's `USER_BUF` their `ip`, its `nr`
/// 1) into `USER_BUF`, where the process has tables; false where it has none (nothing done).
#[inline(always)]
pub(crate) fn walk(regs: &mut Regs) -> bool {
    if UNWIND_ON.load() != 1 || UNWIND_PROCS.get_ptr(&regs.layout).is_none() {
        return false;
    }
    let Some(walk) = UNWIND_WALK.get_ptr_mut(0) else {
        return false;
    };
    let max = USER_WALK_FRAMES.load().min(USER_FRAMES as u32);
    // SAFETY: this CPU's entry; programs on one CPU do not run concurrently here (IRQs off in
    // sched_switch). The callback is a static function of this object.
    unsafe {
        *walk = *regs;
        bpf_loop(
            max.saturating_sub(1),
            step as *const () as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        *regs = *walk;
    }
    true
}

/// One step (the `i`th): the caller of the walk's last frame. Returns 1 to stop.
// Not inlined: `bpf_loop` calls it by address, as a BPF function of its own.
#[inline(never)]
extern "C" fn step(i: u64, _ctx: *mut c_void) -> i64 {
    let (Some(walk), Some(buf)) = (UNWIND_WALK.get_ptr_mut(0), USER_BUF.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: this CPU's entries (see `walk`).
    let (regs, buf) = unsafe { (&mut *walk, &mut *buf) };
    // A return address is looked up at its call instruction, the byte before.
    let look = if i == 0 {
        regs.ip
    } else {
        regs.ip.wrapping_sub(1)
    };
    // SAFETY: a map value read in place; user space replaces it whole.
    let rule = unsafe { UNWIND_PROCS.get(&regs.layout) }.map_or(0, |p| rule(p, look));
    let (ret, cfa, bp, last) = if rule == 0 {
        // By the frame pointer: the frame holds the caller's frame pointer and the return
        // address (as `ustacks::walk`).
        let fp = regs.bp;
        if fp == 0 || fp & 7 != 0 || fp < regs.sp || fp >= USER_TOP {
            return 1;
        }
        // SAFETY: a probe read of user memory fails safely.
        let Ok([next, ret]) = (unsafe { bpf_probe_read_user(fp as *const [u64; 2]) }) else {
            return 1;
        };
        // A backward or null pointer ends the walk at the next step (its checks above), not
        // here: the frame it leads to may be in a file with a table, which needs no frame
        // pointer (a callback from code that reuses the register).
        (ret, fp + 16, next, false)
    } else {
        let offset = u64::from(rule & (UNWIND_CFA_RBP - 1));
        let base = if rule & UNWIND_CFA_RBP != 0 {
            regs.bp
        } else {
            regs.sp
        };
        let cfa = base.wrapping_add(offset);
        // The caller's frame lies above this one.
        if cfa <= regs.sp || cfa >= USER_TOP {
            return 1;
        }
        // SAFETY: probe reads of user memory fail safely.
        let Ok(ret) = (unsafe { bpf_probe_read_user(cfa.wrapping_sub(8) as *const u64) }) else {
            return 1;
        };
        let saved = u64::from(rule >> 16);
        let bp = if saved == 0 {
            regs.bp
        } else {
            // SAFETY: as above.
            match unsafe { bpf_probe_read_user(cfa.wrapping_sub(saved) as *const u64) } {
                Ok(bp) => bp,
                Err(_) => return 1,
            }
        };
        (ret, cfa, bp, false)
    };
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
    i64::from(last)
}

/// The rule of the row that covers `ip` in `process`'s tables; 0 where none does.
#[inline(always)]
fn rule(process: &ProcUnwind, ip: u64) -> u32 {
    for r in 0..UNWIND_RANGES {
        let range = &process.ranges[r];
        if range.count == 0 {
            break;
        }
        if ip < range.start || ip >= range.end {
            continue;
        }
        let Ok(addr) = u32::try_from(ip.wrapping_sub(range.bias)) else {
            return 0;
        };
        // The last row at or below `addr`: rows[lo] <= addr < rows[hi]. Without a branch on
        // the rows (arithmetic only), so that the verifier walks each round once.
        let (mut lo, mut hi) = (0u64, u64::from(range.count));
        for _ in 0..UNWIND_SEARCH {
            let mid = u64::midpoint(lo, hi);
            let Some(&row) = UNWIND_ROWS.get(range.first.wrapping_add(mid as u32)) else {
                return 0;
            };
            // 1 where the row starts above `addr`, read back so that the compiler does not
            // turn the arithmetic below into branches again.
            let above = u64::from(addr).wrapping_sub(row & 0xffff_ffff) >> 63;
            // SAFETY: reads a local.
            let above = unsafe { core::ptr::read_volatile(&raw const above) } & 1;
            hi = mid * above + hi * (1 - above);
            lo = lo * above + mid * (1 - above);
        }
        return match UNWIND_ROWS.get(range.first.wrapping_add(lo as u32)) {
            Some(&row) if (row & 0xffff_ffff) <= u64::from(addr) => (row >> 32) as u32,
            _ => 0,
        };
    }
    0
}

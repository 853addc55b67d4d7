//! Stepping through frames without frame pointers by the unwind tables (`--user-stacks`): at
//! a sleep's switch-out, the first frames of its user backtrace, while they lie in files whose
//! tables user space loaded for the process (`UNWIND_PROCS`: libc and the like, where the
//! frame-pointer walk breaks). Each step finds the row of its instruction pointer by a binary
//! search of the file's rows (`UNWIND_ROWS`), takes the caller's return address at the
//! canonical frame address less 8, and the caller's frame pointer where the function saved it.
//! The frame-pointer walk goes on from the first frame the tables do not cover.
//!
//! The steps run under `bpf_loop` (Linux 5.17), whose callback the verifier walks once: as a
//! bounded loop beside the frame-pointer walk they were more than its million instructions.
//! Without `bpf_loop` (`UNWIND_ON` 0) there are no steps.

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_loop, bpf_probe_read_user};
use latprof_common::{
    ProcUnwind, UNWIND_CFA_RBP, UNWIND_RANGES, UNWIND_SEARCH, UNWIND_STEPS, USER_FRAMES,
};

use crate::{
    maps::{UNWIND_PROCS, UNWIND_ROWS, USER_BUF},
    settings::UNWIND_ON,
};

/// Where a walk stands: the instruction pointer, stack pointer and frame pointer of its last
/// frame, and the process's layout. The frames stored so far are counted in `USER_BUF`'s `nr`:
/// in map memory, of which the verifier knows no value, so that it walks the step once (a
/// count on this stack would be another constant each step, another state each time).
#[repr(C)]
pub(crate) struct Regs {
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    pub(crate) layout: u64,
}

/// Steps from `regs` (the task's user registers at its syscall, `frames[0]` of this CPU's
/// `USER_BUF` their `ip`, its `nr` 1) by the tables of the process, storing each caller in
/// `USER_BUF` (`nr` counting them); `regs` then holds the last frame's, for the frame-pointer
/// walk.
#[inline(always)]
pub(crate) fn steps(regs: &mut Regs) {
    if UNWIND_ON.load() != 1 || UNWIND_PROCS.get_ptr(&regs.layout).is_none() {
        return;
    }
    // SAFETY: the callback is a static function of this object; regs lives on this stack for
    // the whole call.
    unsafe {
        bpf_loop(
            UNWIND_STEPS as u32,
            step as *const () as *mut c_void,
            core::ptr::from_mut(regs).cast(),
            0,
        );
    }
}

/// One step (the `i`th): the caller of the frame at `ctx` (a `Regs`). Returns 1 to stop.
// Not inlined: `bpf_loop` calls it by address, as a BPF function of its own.
#[inline(never)]
extern "C" fn step(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is `steps`' Regs.
    let regs = unsafe { &mut *ctx.cast::<Regs>() };
    // SAFETY: a map value read in place; user space replaces it whole.
    let Some(process) = (unsafe { UNWIND_PROCS.get(&regs.layout) }) else {
        return 1;
    };
    // A return address is looked up at its call instruction, the byte before.
    let look = if i == 0 {
        regs.ip
    } else {
        regs.ip.wrapping_sub(1)
    };
    let rule = rule(process, look);
    if rule == 0 {
        return 1;
    }
    let offset = u64::from(rule & (UNWIND_CFA_RBP - 1));
    let base = if rule & UNWIND_CFA_RBP != 0 {
        regs.bp
    } else {
        regs.sp
    };
    let cfa = base.wrapping_add(offset);
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
    let Some(buf) = USER_BUF.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's buffer.
    let n = unsafe { (*buf).nr } as usize;
    if ret == 0 || n >= USER_FRAMES {
        return 1;
    }
    // SAFETY: this CPU's buffer, `n` in range.
    unsafe {
        (*buf).frames[n] = ret;
        (*buf).nr = n as u32 + 1;
    }
    regs.ip = ret;
    regs.sp = cfa;
    regs.bp = bp;
    0
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

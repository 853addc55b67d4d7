//! User-space backtraces (`--user-stacks`): walked at switch-out, where the sleeper is the
//! current task and its user memory the one mapped (the kernel refuses a user stack of any
//! other task: `bpf_get_task_stack` with `BPF_F_USER_STACK` answers -EOPNOTSUPP for a task
//! that is not current), with the frame pointers the program was built with. latprof follows
//! them itself (`frame_pointer_walk`) rather than with `bpf_get_stack`: the kernel's walk read each frame in
//! two accesses and ended every whole chain with a fault on its null frame pointer (its cost:
//! docs/bench.md, "Measured while building"); this one reads each frame once and stops before a
//! null or backward pointer. Stored once per (process, frames) in `USER_STACKS`
//! with the stack words at the user stack pointer, and announced on `USER_SEEN` so user space
//! reads the process's memory map while it lives.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_probe_read_user, bpf_probe_read_user_buf},
};
use latprof_common::{
    CauseParts, Counter, DEFECT_USER_FRAME, NO_USER, TaskState, USER_FRAMES, USER_WINDOW, UserSeen,
    combine, layout_key, user_stack_hash,
};

use crate::{
    defects,
    kfuncs::read_kernel,
    maps::{CAUSE_PARTS, USER_BUF, USER_SEEN, USER_STACKS, count},
    settings::{
        MM_END_CODE_OFF, MM_START_CODE_OFF, MM_START_STACK_OFF, PT_REGS_BP_OFF, PT_REGS_IN_STACK,
        PT_REGS_IP_OFF, PT_REGS_LR_OFF, PT_REGS_SP_OFF, TASK_EXEC_ID_OFF, TASK_MM_OFF,
        TASK_STACK_OFF, USER_PAC_MASK, USER_WALK_FRAMES,
    },
    shared,
    unwind::{self, USER_TOP},
};

/// The layout of the address space `mm` (`layout_key`); 0 where it is unreadable, or not
/// made yet: an exec sets the code's and the stack's bounds together at its end, and a task
/// that sleeps in exec before that (reading the program from disk) has a new map with no code
/// yet (and the old program's registers).
#[inline(always)]
fn layout(mm: *const u8) -> u64 {
    match (
        read_kernel::<u64>(mm, MM_START_CODE_OFF.load()),
        read_kernel::<u64>(mm, MM_END_CODE_OFF.load()),
        read_kernel::<u64>(mm, MM_START_STACK_OFF.load()),
    ) {
        (Ok(start), Ok(end), Ok(stack)) if !mm.is_null() && end != 0 => {
            layout_key(start, end, stack)
        }
        _ => 0,
    }
}

/// Walks the current task's user backtrace and stores it; returns its id, or `NO_USER` (also
/// for a task without a memory map). `CAS`: the build for kernels with compare-and-swap, the
/// only one with the unwind tables' steps. `entry` is the task's: its memo saves reading the
/// layout again until an exec, and the table lookup when the backtrace is its last sleep's.
// Not inlined: one return, verified once for both sched_switch variants' callers (verifier
// rule 4 in `stack_cache`), and its buffers are per-CPU (rule 6).
#[inline(never)]
pub(crate) fn take<const CAS: bool>(
    tid: u32,
    tgid: u32,
    task: *const u8,
    entry: &mut TaskState,
) -> u64 {
    let mm = match read_kernel::<u64>(task, TASK_MM_OFF.load()) {
        Ok(mm) if mm != 0 => mm,
        _ => return NO_USER,
    };
    // The low half of the exec count: a u32 before Linux 5.7, and a change is all the memo
    // asks of it.
    let exec = u64::from(read_kernel::<u32>(task, TASK_EXEC_ID_OFF.load()).unwrap_or(0));
    if entry.user_mm != mm || entry.user_exec != exec {
        let layout = layout(mm as *const u8);
        if layout == 0 {
            // In the middle of an exec: no user backtrace, and nothing kept for the next.
            entry.user_mm = 0;
            count(Counter::UserStackEmpty);
            return NO_USER;
        }
        entry.user_mm = mm;
        entry.user_exec = exec;
        entry.user_layout = layout;
        entry.user_top = 0;
    }
    let layout = entry.user_layout;
    let Some(buf) = USER_BUF.get_ptr_mut(0) else {
        return NO_USER;
    };
    // SAFETY: this CPU's buffer; programs on one CPU do not run concurrently here (IRQs off in
    // sched_switch).
    let buf = unsafe { &mut *buf };
    // The user registers sit at the top of the task's kernel stack (task_pt_regs, on x86-64
    // and arm64 alike).
    let Ok(stack) = read_kernel::<u64>(task, TASK_STACK_OFF.load()) else {
        count(Counter::UserStackEmpty);
        return NO_USER;
    };
    let regs = (stack + u64::from(PT_REGS_IN_STACK.load())) as *const u8;
    let (Ok(ip), Ok(sp), Ok(bp)) = (
        read_kernel::<u64>(regs, PT_REGS_IP_OFF.load()),
        read_kernel::<u64>(regs, PT_REGS_SP_OFF.load()),
        read_kernel::<u64>(regs, PT_REGS_BP_OFF.load()),
    ) else {
        count(Counter::UserStackEmpty);
        return NO_USER;
    };
    // arm64's link register: the innermost caller's return address where the function at `ip`
    // has not saved it (a leaf: glibc's and musl's syscall wrappers); the tables say so.
    let lr = match PT_REGS_LR_OFF.load() {
        0 => 0,
        off => read_kernel::<u64>(regs, off).unwrap_or(0) & !USER_PAC_MASK.load(),
    };
    // Not a user context (a kernel-side worker with a memory map): no user frame.
    if ip == 0 || ip >= USER_TOP {
        count(Counter::UserStackEmpty);
        return NO_USER;
    }
    buf.frames[0] = ip;
    // By the unwind tables where they cover a frame, by frame pointers elsewhere, under
    // bpf_loop (the kernels with compare-and-swap only, their verifier knows callbacks, 5.13);
    // by frame pointers only, in a bounded loop, where the kernel lacks bpf_loop.
    buf.nr = 1;
    let walked = if CAS {
        unwind::table_walk(ip, sp, bp, lr, layout, entry.user_top)
    } else {
        None
    };
    let (stepped, win_sp) = if let Some(w) = walked {
        entry.user_top = w.top;
        (w.stepped, w.win_sp)
    } else {
        buf.nr = frame_pointer_walk(&mut buf.frames, bp, sp) as u32;
        (1, sp)
    };
    // Read back from map memory, of which the verifier knows no value: what follows is walked
    // once, not once per frame count either walk can end with (each would be a walk of the
    // hash's loop and of the rest, over half the verifier's million instructions).
    // SAFETY: reads this CPU's buffer.
    let len = (unsafe { core::ptr::read_volatile(&raw const buf.nr) } as usize) * 8;
    let nr = (len / 8).min(USER_FRAMES);
    if layout == 0 {
        count(Counter::UserStackEmpty);
        return NO_USER;
    }
    if nr > 2 && defects::hit(DEFECT_USER_FRAME) {
        // `--debug-defect user-frame`: a frame and its neighbour swapped.
        buf.frames.swap(1, 2);
    }
    let id = user_stack_hash(layout, &buf.frames, nr);
    // The last sleep's: stored then (entries are never removed).
    if id == entry.sleep_ustack || USER_STACKS.get_ptr(&id).is_some() {
        return id;
    }
    buf.tgid = tgid;
    buf.layout = layout;
    buf.nr = nr as u32;
    // The window is the stack words of the frame the tables last stepped to (the first frame
    // where they did not), from which user space unwinds frameless callers they do not cover.
    buf.stepped = stepped as u32;
    buf.sp = win_sp;
    let window: &mut [u8; USER_WINDOW * 8] =
        // SAFETY: the window's words as bytes, the same size.
        unsafe { &mut *buf.window.as_mut_ptr().cast() };
    // SAFETY: a probe read of user memory fails safely (a page not present: no fault taken).
    if buf.sp == 0 || unsafe { bpf_probe_read_user_buf(buf.sp as *const u8, window) }.is_err() {
        buf.sp = 0;
    }
    shared::write();
    match USER_STACKS.insert(&id, buf, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            let seen = UserSeen {
                tgid,
                tid,
                user_stack: id,
                layout,
            };
            if USER_SEEN.output(&seen, 0).is_err() {
                count(Counter::UserSeenLost);
            }
            id
        }
        // -EEXIST: another CPU stored it first.
        Err(-17) => id,
        Err(_) => {
            count(Counter::UserStackTableFull);
            NO_USER
        }
    }
}

/// Follows the frame pointers from `fp` (the user `rbp`, arm64's x29, at the syscall), the user stack
/// pointer being `sp`: each frame holds the caller's frame pointer and a return address.
/// Stores the return addresses after `frames[0]`; returns the frames stored, `frames[0]`
/// included (`unwind::table_walk` is the same walk with the tables' steps between). It stops at a null or misaligned frame pointer, one below the stack pointer or not
/// above the last (the chain runs outward, to higher addresses), and at a read that fails: a
/// program without frame pointers ends it at once most of the time, and a whole chain ends on
/// its null frame pointer without a read (the kernel's own walk faults on it).
// An index the verifier sees bounded by the loop (an iterator over the array hides it).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn frame_pointer_walk(frames: &mut [u64; USER_FRAMES], mut fp: u64, sp: u64) -> usize {
    let max = (USER_WALK_FRAMES.load() as usize).min(USER_FRAMES);
    let mut nr = 1;
    for i in 1..USER_FRAMES {
        if i >= max || fp == 0 || fp & 7 != 0 || fp < sp || fp >= USER_TOP {
            break;
        }
        // SAFETY: a probe read of user memory fails safely (no fault taken). Read into a
        // value of its own: no buffer zeroed first (a byte loop the verifier walks per frame).
        let Ok([next, ret]) = (unsafe { bpf_probe_read_user(fp as *const [u64; 2]) }) else {
            break;
        };
        // Pointer authentication's signature off (arm64; the mask is 0 elsewhere).
        let ret = ret & !USER_PAC_MASK.load();
        if ret == 0 {
            break;
        }
        frames[i] = ret;
        nr = i + 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    nr
}

/// The record id of a sleep of the task of `entry` at kernel backtrace `kernel` and user
/// backtrace `user`, its parts stored for user space the first time.
#[inline(always)]
pub(crate) fn cause(kernel: u64, user: u64, entry: &mut TaskState) -> u64 {
    let id = combine(kernel, user);
    if id == kernel || id == entry.user_cause {
        return id;
    }
    if CAUSE_PARTS.get_ptr(&id).is_none() {
        let parts = CauseParts { kernel, user };
        shared::write();
        match CAUSE_PARTS.insert(&id, &parts, u64::from(BPF_NOEXIST)) {
            Ok(()) | Err(-17) => {}
            Err(_) => {
                count(Counter::CausePartsFull);
                return kernel;
            }
        }
    }
    entry.user_cause = id;
    id
}

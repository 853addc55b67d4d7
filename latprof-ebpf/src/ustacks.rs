//! User-space backtraces (`--user-stacks`): walked at switch-out, where the sleeper is the
//! current task (the kernel refuses a user stack of any other task: `bpf_get_task_stack` with
//! `BPF_F_USER_STACK` answers -EOPNOTSUPP for a task that is not current), with the frame
//! pointers the program was built with. Stored once per (process, frames) in `USER_STACKS`
//! with the stack words at the user stack pointer, and announced on `USER_SEEN` so user space
//! reads the process's memory map while it lives.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_stack, bpf_probe_read_user_buf},
    programs::RawTracePointContext,
};
use latprof_common::{
    CauseParts, Counter, NO_USER, TaskState, USER_FRAMES, USER_WINDOW, UserSeen, combine,
    layout_key, user_stack_hash,
};

use crate::{
    maps::{CAUSE_PARTS, USER_BUF, USER_SEEN, USER_STACKS, count},
    settings::{
        MM_END_CODE_OFF, MM_START_CODE_OFF, MM_START_STACK_OFF, PT_REGS_IN_STACK, PT_REGS_SP_OFF,
        TASK_MM_OFF, TASK_STACK_OFF, USER_WALK_FRAMES, read_field,
    },
};

/// The layout of the address space `mm` (`layout_key`); 0 where it is unreadable.
#[inline(always)]
fn layout(mm: *const u8) -> u64 {
    match (
        read_field::<u64>(mm, MM_START_CODE_OFF.load()),
        read_field::<u64>(mm, MM_END_CODE_OFF.load()),
        read_field::<u64>(mm, MM_START_STACK_OFF.load()),
    ) {
        (Ok(start), Ok(end), Ok(stack)) if !mm.is_null() => layout_key(start, end, stack),
        _ => 0,
    }
}

/// Walks the current task's user backtrace and stores it; returns its id, or `NO_USER` (also
/// for a task without a memory map). `entry` is the task's: its memo saves reading the
/// layout again until an exec, and the table lookup when the backtrace is its last sleep's.
// Not inlined: one return, verified once for both sched_switch variants' callers (verifier
// rule 4 in `stack_cache`), and its buffers are per-CPU (rule 6).
#[inline(never)]
pub(crate) fn take(
    ctx: &RawTracePointContext,
    tid: u32,
    tgid: u32,
    task: *const u8,
    entry: &mut TaskState,
) -> u64 {
    let mm = match read_field::<u64>(task, TASK_MM_OFF.load()) {
        Ok(mm) if mm != 0 => mm,
        _ => return NO_USER,
    };
    if entry.user_mm != mm {
        entry.user_mm = mm;
        entry.user_layout = layout(mm as *const u8);
    }
    let layout = entry.user_layout;
    let Some(buf) = USER_BUF.get_ptr_mut(0) else {
        return NO_USER;
    };
    // SAFETY: this CPU's buffer; programs on one CPU do not run concurrently here (IRQs off in
    // sched_switch).
    let buf = unsafe { &mut *buf };
    let size = USER_WALK_FRAMES.load().min(USER_FRAMES as u32) * 8;
    // SAFETY: the helper writes at most `size` bytes into the frames array.
    let len = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            buf.frames.as_mut_ptr().cast(),
            size,
            u64::from(BPF_F_USER_STACK),
        )
    };
    if len <= 0 {
        count(Counter::UserStackEmpty);
        return NO_USER;
    }
    let nr = (len as usize / 8).min(USER_FRAMES);
    if layout == 0 {
        count(Counter::UserStackEmpty);
        return NO_USER;
    }
    let id = user_stack_hash(layout, &buf.frames, nr);
    // The last sleep's: stored then (entries are never removed).
    if id == entry.sleep_ustack || USER_STACKS.get_ptr(&id).is_some() {
        return id;
    }
    buf.tgid = tgid;
    buf.layout = layout;
    buf.nr = nr as u32;
    // The user registers sit at the top of the task's kernel stack (x86-64's task_pt_regs).
    buf.sp = read_field::<u64>(task, TASK_STACK_OFF.load())
        .and_then(|stack| {
            read_field::<u64>(
                (stack + u64::from(PT_REGS_IN_STACK.load())) as *const u8,
                PT_REGS_SP_OFF.load(),
            )
        })
        .unwrap_or(0);
    let window: &mut [u8; USER_WINDOW * 8] =
        // SAFETY: the window's words as bytes, the same size.
        unsafe { &mut *buf.window.as_mut_ptr().cast() };
    // SAFETY: a probe read of user memory fails safely (a page not present: no fault taken).
    if buf.sp == 0 || unsafe { bpf_probe_read_user_buf(buf.sp as *const u8, window) }.is_err() {
        buf.sp = 0;
    }
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

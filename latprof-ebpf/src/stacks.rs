//! Backtraces: walked by the kernel into `STACK_BUF`, stored in `STACKS` under the hash of
//! their frames (the stack id every record is keyed by).

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_NOEXIST, task_struct},
    helpers::{bpf_get_stack, bpf_get_task_stack},
};
use latprof_common::{Counter, NO_STACK, RawStack, STACK_FRAMES, stack_hash};

use crate::{
    maps::{STACK_BUF, STACKS, WALKED_FRAMES, count},
    settings::STACK_WALK_FRAMES,
    shared,
};

/// Walks the current kernel stack and stores it; returns its id, or `NO_STACK`.
pub(crate) fn take_stack<C: EbpfContext>(ctx: &C) -> u64 {
    let Some(buf) = STACK_BUF.get_ptr_mut(0) else {
        return NO_STACK;
    };
    // SAFETY: buf is a per-CPU map value of at least `walk_size()` bytes.
    let len = unsafe { bpf_get_stack(ctx.as_ptr(), buf.cast(), walk_size(), 0) };
    count(Counter::StackWalks);
    store_stack(buf, len)
}

/// The backtrace of a task that is not running (where it went to sleep), as latencytop takes
/// it: the kernel leaves out the scheduler's own frames. The frames stay in `STACK_BUF`, their
/// count in `WALKED_FRAMES`.
pub(crate) fn task_stack(task: *mut task_struct) -> u64 {
    let Some(buf) = STACK_BUF.get_ptr_mut(0) else {
        return NO_STACK;
    };
    // SAFETY: task is the BTF tracepoint's trusted task pointer; buf as above.
    let len = unsafe { bpf_get_task_stack(task, buf.cast(), walk_size(), 0) };
    count(Counter::StackWalks);
    // The frame count goes through map memory (verifier rule 3 in `stack_cache`).
    if let Some(walked) = WALKED_FRAMES.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        unsafe { *walked = if len > 0 { len as u64 / 8 } else { 0 } };
    }
    store_stack(buf, len)
}

#[inline(always)]
fn walk_size() -> u32 {
    STACK_WALK_FRAMES.load().min(STACK_FRAMES as u32) * 8
}

/// Stores the `len` bytes of frames in `buf` (the kernel zero-fills the rest of the walk size;
/// the buffer past it is never written) and returns their id, or `NO_STACK`.
fn store_stack(buf: *mut RawStack, len: i64) -> u64 {
    if len <= 0 {
        return NO_STACK;
    }
    let frames = (len as usize / 8).min(STACK_FRAMES);
    // SAFETY: per-CPU buffer, filled by the caller.
    let id = stack_hash(unsafe { &*buf }, frames);
    if STACKS.get_ptr(&id).is_some() {
        return id;
    }
    // SAFETY: as above.
    shared::write();
    match STACKS.insert(&id, unsafe { &*buf }, u64::from(BPF_NOEXIST)) {
        // -EEXIST: another CPU stored the same stack first.
        Ok(()) | Err(-17) => id,
        Err(_) => NO_STACK,
    }
}

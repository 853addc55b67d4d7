//! `task_rename`: a tracked task's name follows the task (exec, `prctl(PR_SET_NAME)`, a write
//! to /proc/PID/comm all pass through the kernel's `__set_task_comm`), so lines show the name a
//! task has now, not the one of its first sleep, at no cost to the scheduler's hooks.

use aya_ebpf::{
    helpers::generated::bpf_probe_read_kernel_str, macros::raw_tracepoint,
    programs::RawTracePointContext,
};

use crate::{
    settings::{TASK_PID_OFF, read_field},
    task_table,
};

#[raw_tracepoint(tracepoint = "task_rename")]
pub fn task_rename(ctx: RawTracePointContext) -> i32 {
    try_task_rename(&ctx).unwrap_or(1)
}

fn try_task_rename(ctx: &RawTracePointContext) -> Result<i32, i32> {
    // TP_PROTO(struct task_struct *task, const char *comm): before the name is set.
    let task: *const u8 = ctx.arg(0);
    let comm: *const u8 = ctx.arg(1);
    let tid = read_field::<i32>(task, TASK_PID_OFF.load())? as u32;
    let Some(entry) = task_table::get(tid) else {
        return Ok(0);
    };
    let mut name = [0u8; 16];
    // SAFETY: the helper writes at most 16 bytes, NUL included, into the zeroed buffer (the
    // kernel keeps 15 bytes of a name and a NUL); the bytes after the NUL stay zero.
    let read = unsafe {
        bpf_probe_read_kernel_str(name.as_mut_ptr().cast(), name.len() as u32, comm.cast())
    };
    if read < 0 {
        return Ok(0);
    }
    // SAFETY: the task's entry; another CPU may read the name while it changes, and sees the
    // old name, the new one, or a mix of the two for one line (it is never used as a key).
    unsafe { (*entry).comm = name };
    Ok(0)
}

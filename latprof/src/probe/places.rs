//! Where the programs find what they read in the kernel: offsets and places from the kernel's
//! BTF (or /proc/kallsyms), for the waker context, the user registers and recovery.

use anyhow::Result;

use super::btf;
use crate::symbols::{Kallsyms, PercpuSymbols};

/// How the waker programs find the context a waking runs in (see `wakers` in the eBPF
/// crate): all zero where they cannot, and every waking outside a timer callback is the
/// current task's.
#[derive(Clone, Copy, Default)]
pub(super) struct WakerContext {
    pub(super) pc_from_rq: u64,
    pub(super) task_cfs_rq_off: u32,
    pub(super) cfs_rq_rq_off: u32,
    pub(super) rq_cpu_off: u32,
    pub(super) task_softirq_cnt_off: u32,
    /// arm64: the preempt count's offset in the task (`thread_info.preempt_count`).
    pub(super) task_preempt_off: u32,
}

/// Where this CPU's preempt count is next to its run queue: the distance between the per-CPU
/// variables `runqueues` and `__preempt_count` (or `pcpu_hot.preempt_count`, Linux 6.2 to
/// 6.14), from the BTF's per-CPU section or else from /proc/kallsyms; and the way from a task
/// to its run queue (`se.cfs_rq->rq`, CONFIG_FAIR_GROUP_SCHED). On arm64 the preempt count is
/// the current task's (`task_struct.thread_info.preempt_count`, which interrupts raise in the
/// task they interrupt). Err says why not.
pub(super) fn waker_context(
    btf: &btf::Btf,
    percpu: Option<PercpuSymbols>,
) -> Result<WakerContext, String> {
    // PREEMPT_RT counts softirqs in the task.
    let task_softirq_cnt_off = btf
        .member_offset("task_struct", "softirq_disable_cnt")
        .unwrap_or(0);
    if cfg!(target_arch = "aarch64") {
        let off = btf
            .member_offset("task_struct", "thread_info")
            .and_then(|info| Ok(info + btf.member_offset("thread_info", "preempt_count")?));
        return match off {
            // Never 0: `flags` comes first in thread_info.
            Ok(off) if off != 0 => Ok(WakerContext {
                task_softirq_cnt_off,
                task_preempt_off: off,
                ..WakerContext::default()
            }),
            _ => Err("the kernel's BTF has no thread_info.preempt_count in the task".to_owned()),
        };
    }
    if !cfg!(target_arch = "x86_64") {
        return Err("the preempt count is read only on x86-64 and arm64".to_owned());
    }
    let path = || -> Result<(u32, u32, u32)> {
        Ok((
            btf.member_offset("task_struct", "se")?
                + btf.member_offset("sched_entity", "cfs_rq")?,
            btf.member_offset("cfs_rq", "rq")?,
            btf.member_offset("rq", "cpu")?,
        ))
    };
    let (task_cfs_rq_off, cfs_rq_rq_off, rq_cpu_off) =
        path().map_err(|e| format!("no way from a task to its run queue: {e}"))?;
    // (runqueues, preempt count) as offsets or addresses of one section: only the
    // difference counts.
    let from_btf = || {
        let rq = btf.percpu_var_offset("runqueues")?;
        let pc = match btf.percpu_var_offset("__preempt_count") {
            Some(pc) => pc,
            None => {
                btf.percpu_var_offset("pcpu_hot")?
                    + btf.member_offset("pcpu_hot", "preempt_count").ok()?
            }
        };
        Some((u64::from(rq), u64::from(pc)))
    };
    let places = match from_btf() {
        Some(p) => p,
        None => kallsyms_places(btf, percpu).ok_or_else(|| {
            "neither the BTF nor /proc/kallsyms places the per-CPU runqueues and preempt count"
                .to_owned()
        })?,
    };
    Ok(WakerContext {
        pc_from_rq: places.1.wrapping_sub(places.0),
        task_cfs_rq_off,
        cfs_rq_rq_off,
        rq_cpu_off,
        task_softirq_cnt_off,
        task_preempt_off: 0,
    })
}

/// `runqueues` and the preempt count's addresses from /proc/kallsyms: as the session read it
/// (`known`), else read now (a probe attached on its own, as the tests do).
pub(super) fn kallsyms_places(btf: &btf::Btf, known: Option<PercpuSymbols>) -> Option<(u64, u64)> {
    let percpu = match known {
        Some(p) => p,
        None => Kallsyms::load().ok()?.percpu(),
    };
    let rq = percpu.runqueues;
    let pc = if percpu.preempt_count != 0 {
        percpu.preempt_count
    } else if percpu.pcpu_hot != 0 {
        percpu.pcpu_hot + u64::from(btf.member_offset("pcpu_hot", "preempt_count").ok()?)
    } else {
        0
    };
    (rq != 0 && pc != 0).then_some((rq, pc))
}

/// Where x86-64 and arm64 keep a task's user registers (`task_pt_regs()` on both): at
/// `task_struct.stack` plus THREAD_SIZE (16 KiB without KASAN, with arm64's 4 KiB pages as
/// Debian's kernels have them) less `sizeof(struct pt_regs)`; (0, 0) where unknown. A wrong
/// guess costs cache hits, never a wrong kernel backtrace: a hit needs every return address in
/// its place.
pub(super) fn pt_regs_place(btf: &btf::Btf) -> (u32, u32) {
    const THREAD_SIZE: u32 = 16 * 1024;
    match (
        btf.member_offset("task_struct", "stack"),
        btf.struct_size("pt_regs"),
    ) {
        (Ok(stack), Ok(regs))
            if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) && regs < THREAD_SIZE =>
        {
            (stack, THREAD_SIZE - regs)
        }
        _ => (0, 0),
    }
}

/// Offsets of `se.sum_exec_runtime` and `sched_info.run_delay` in `struct task_struct`: both, or
/// (0, 0) where the kernel lacks either (no recovery of sleeps whose wakeup was hidden).
pub(super) fn recovery_offsets(btf: &btf::Btf) -> (u32, u32) {
    match (
        btf.member_offset("task_struct", "se"),
        btf.member_offset("sched_entity", "sum_exec_runtime"),
        btf.member_offset("task_struct", "sched_info"),
        btf.member_offset("sched_info", "run_delay"),
    ) {
        (Ok(se), Ok(exec), Ok(info), Ok(delay)) => (se + exec, info + delay),
        _ => (0, 0),
    }
}

/// Offset of the saved kernel stack pointer in `struct task_struct` (`thread.sp`), where the
/// stack cache knows how to use it (x86-64); 0 otherwise.
pub(super) fn thread_sp_offset(btf: &btf::Btf) -> u32 {
    if !cfg!(target_arch = "x86_64") {
        return 0;
    }
    match (
        btf.member_offset("task_struct", "thread"),
        btf.member_offset("thread_struct", "sp"),
    ) {
        (Ok(thread), Ok(sp)) => thread + sp,
        _ => 0,
    }
}

/// Offsets of `task_struct.cgroups`, `css_set.dfl_cgrp`, `cgroup.kn` and `kernfs_node.id`: the
/// way from a task to its cgroup v2 id (`cgroup_id(task_dfl_cgroup(task))`, what
/// `bpf_get_current_cgroup_id` returns); all 0 where one is missing (the helper is called).
pub(super) fn cgroup_id_offsets(btf: &btf::Btf) -> [u32; 4] {
    match (
        btf.member_offset("task_struct", "cgroups"),
        btf.member_offset("css_set", "dfl_cgrp"),
        btf.member_offset("cgroup", "kn"),
        btf.member_offset("kernfs_node", "id"),
    ) {
        (Ok(cgroups), Ok(dfl), Ok(kn), Ok(id)) => [cgroups, dfl, kn, id],
        _ => [0; 4],
    }
}

//! The values the loader writes into the eBPF object's globals, from the one table of
//! settings (`latprof_common::settings!` and `debug_settings!`): a struct per table, each
//! field named as the global it sets (upper case, as the object names it), and the loader's
//! writes of all of them.

use crate::ustacks::arch::{self, Arch};
use anyhow::Result;
use aya::EbpfLoader;
use latprof_common::{
    DEFECT_NONE, MODE_LAZY, MODE_NORMAL, USER_FRAMES, WAKEUP_ADAPTIVE, WAKEUP_ALWAYS,
};

use super::{
    DebugConfig, Mode, ProbeConfig, Wakeup,
    btf::Btf,
    config::{LATENCYTOP_UNIT_NS, STACK_SLACK_FRAMES},
    latencytop_cutoff_ns,
    places::{
        WakerContext, cgroup_id_offsets, pt_regs_place, recovery_offsets, thread_sp_offset,
        waker_context,
    },
};

/// A struct with a field per setting of a table, the names of its globals, and the writes.
macro_rules! globals {
    ([$(#[$what:meta])* $struct:ident] $($(#[$doc:meta])* $name:ident: $ty:ty = $default:expr,)*) => {
        $(#[$what])*
        #[derive(Clone, Debug)]
        pub(super) struct $struct {
            $(
                $(#[$doc])*
                pub(super) $name: $ty,
            )*
        }

        impl $struct {
            /// The globals this struct sets, as the object names them.
            #[cfg(test)]
            pub(super) const NAMES: &[&str] = &[$(stringify!($name)),*];

            /// Writes every setting into its global: none is left at the object's default.
            pub(super) fn write<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
                $(
                    loader.override_global(stringify!($name), &self.$name, true);
                )*
            }
        }
    };
}

latprof_common::settings!(
    globals[/// The run's settings, written into the object's globals.
    Globals]
);
latprof_common::debug_settings!(
    globals[/// The tests' and debugging knobs, written into the object's globals.
    DebugGlobals]
);

/// What the kernel side of a run has besides the config: the `--cgroup` directories opened,
/// whether cgroups are attributed (the host mounts cgroup2), and whether the stack cache's
/// best form has its helpers (`cache_helpers`).
pub(super) struct Kernel {
    pub(super) filters: usize,
    pub(super) cgroups_on: bool,
    pub(super) cache_helpers: bool,
    /// The stack cache will be learnt in a bounded loop (no `cache_helpers`, or forced).
    pub(super) bounded_cache: bool,
    pub(super) kfuncs: super::kfuncs::Kfuncs,
}

/// `DEBUG_HIDE_WAKEUPS`'s bit that leaves the wakeups it hides out of the `HIDDEN` log.
const HIDE_UNLOGGED: u32 = 1 << 31;

/// The settings of a run on this kernel: the config's, and the offsets and places its BTF
/// gives. What the programs will do without (no recovery, no stack cache, interrupts not told
/// apart) is said in `fallbacks`.
#[expect(
    clippy::too_many_lines,
    reason = "one struct literal that names every setting, so that none is left at its default"
)]
pub(super) fn from_config(
    config: &ProbeConfig,
    btf: &Btf,
    kernel: &Kernel,
    fallbacks: &mut Vec<String>,
) -> Result<(Globals, DebugGlobals)> {
    let task = TaskOffsets::read(btf)?;
    let user = UserOffsets::read(btf, config.user_stacks)?;
    let (exec_runtime_off, run_delay_off) = recovery_offsets(btf);
    if exec_runtime_off == 0 {
        fallbacks.push(
            "sleeps whose wakeup the kernel hides are lost, not recovered: no se.sum_exec_runtime or sched_info.run_delay in this kernel's task_struct (CONFIG_SCHED_INFO)".to_owned(),
        );
    }
    let thread_sp_off = thread_sp_offset(btf);
    if config.stack_cache && config.btf_wakeup {
        if thread_sp_off == 0 {
            fallbacks.push("stack cache off: it knows only x86-64's kernel stacks".to_owned());
        } else if !kernel.cache_helpers {
            fallbacks.push(
                "stack cache learnt in a bounded loop: this kernel lacks bpf_loop (Linux 5.17) or bpf_task_pt_regs (5.15)"
                    .to_owned(),
            );
        }
        if thread_sp_off != 0 && kernel.kfuncs.rdonly_cast.is_none() {
            let why = if config.debug.no_kfuncs {
                "--debug-no-kfuncs"
            } else {
                "this kernel lacks the bpf_rdonly_cast kfunc (Linux 6.2)"
            };
            fallbacks.push(format!(
                "stack cache copies the sleeping task's stack by a helper call, not plain loads (1.2x the kernel time per ping-pong round trip, docs/bench.md): {why}"
            ));
        }
    }
    // The unwind tables' steps run under bpf_loop: a bounded loop of them is more than the
    // verifier walks beside the frame-pointer walk.
    let unwind_loop = btf.has_enumerator("BPF_FUNC_loop");
    if config.user_stacks && !unwind_loop {
        fallbacks.push(
            "user frames are walked by frame pointers only (no unwind tables: this kernel lacks bpf_loop, Linux 5.17): a caller of a function without a frame (libc's) may be missing"
                .to_owned(),
        );
    }
    let unwind_loop = unwind_loop && !config.debug.no_unwind_tables;
    let (task_stack_off, pt_regs_in_stack) = pt_regs_place(btf);
    let cgroup_id = cgroup_id_offsets(btf);
    let context = if config.wakers {
        waker_context(btf, config.percpu).unwrap_or_else(|why| {
            fallbacks.push(format!(
                "wakeups from interrupts other than timers are attributed to the task they interrupted: {why}"
            ));
            WakerContext::default()
        })
    } else {
        WakerContext::default()
    };
    let globals = Globals {
        MODE: match config.mode {
            Mode::Lazy => MODE_LAZY,
            Mode::Normal => MODE_NORMAL,
        },
        FILTER_TGID: config.pid.unwrap_or(0),
        SELF_TGID: if config.include_self {
            0
        } else {
            std::process::id()
        },
        // With a pid filter the user asked for that process, kernel thread or not.
        SKIP_KTHREADS: u32::from(config.pid.is_none()),
        INTER_CUTOFF_NS: config.inter_cutoff.map_or(u64::MAX, latencytop_cutoff_ns),
        MIN_SLEEP_NS: config.debug.min_sleep.map_or(LATENCYTOP_UNIT_NS, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        }),
        // btf_trace_sched_switch(void *data, bool preempt, prev, next[, prev_state]).
        SWITCH_HAS_PREV_STATE: u32::from(
            !config.debug.state_from_task && btf.fn_pointer_arity("btf_trace_sched_switch")? >= 5,
        ),
        TASK_SLOTS_N: super::task_slots::slots(config, btf, kernel.bounded_cache, fallbacks),
        RUNQ: u32::from(config.details && !config.debug.skip.runq),
        HISTOGRAMS_ON: u32::from(config.details && !config.debug.skip.histograms),
        // Set per variant (`load_variant`): whether its wakeup program takes the backtraces.
        STACK_AT_WAKEUP: 0,
        TASK_STACK_OFF: task_stack_off,
        PT_REGS_IN_STACK: pt_regs_in_stack,
        // Set per load (`load_best_with`), with the kfunc calls its object holds.
        RDONLY_CAST_WORDS_ID: 0,
        THREAD_SP_OFF: thread_sp_off,
        // Above the cause frames sit the tracing frames and the scheduler's (about 10).
        STACK_WALK_FRAMES: (u32::from(config.stack_depth) + STACK_SLACK_FRAMES).min(127),
        TASK_STATE_OFF: task.state,
        TASK_PID_OFF: task.pid,
        TASK_TGID_OFF: task.tgid,
        TASK_FLAGS_OFF: task.flags,
        TASK_MM_OFF: task.mm,
        TASK_EXEC_ID_OFF: user.exec_id,
        USER_STACKS_ON: u32::from(config.user_stacks),
        UNWIND_ON: u32::from(config.user_stacks && unwind_loop),
        USER_WALK_FRAMES: u32::try_from(USER_FRAMES).unwrap_or(u32::MAX),
        PT_REGS_SP_OFF: user.pt_regs[0],
        PT_REGS_IP_OFF: user.pt_regs[1],
        PT_REGS_BP_OFF: user.pt_regs[2],
        PT_REGS_LR_OFF: user.pt_regs[3],
        USER_PAC_MASK: user.pac_mask,
        MM_START_CODE_OFF: user.mm_layout[0],
        MM_END_CODE_OFF: user.mm_layout[1],
        MM_START_STACK_OFF: user.mm_layout[2],
        TASK_COMM_OFF: task.comm,
        TASK_EXEC_RUNTIME_OFF: exec_runtime_off,
        TASK_RUN_DELAY_OFF: run_delay_off,
        CGROUPS_ON: u32::from(kernel.cgroups_on),
        TASK_CGROUPS_OFF: cgroup_id[0],
        CSS_SET_DFL_CGRP_OFF: cgroup_id[1],
        CGROUP_KN_OFF: cgroup_id[2],
        KERNFS_NODE_ID_OFF: cgroup_id[3],
        EXITS_ON: u32::from(config.exits),
        FILTER_CGROUPS: u32::try_from(kernel.filters).unwrap_or(u32::MAX),
        WAKERS_ON: u32::from(config.wakers),
        WAKER_STACKS: u32::from(config.waker_stacks_on()),
        CHAINS_ON: u32::from(config.chains_on()),
        PC_FROM_RQ: context.pc_from_rq,
        TASK_CFS_RQ_OFF: context.task_cfs_rq_off,
        CFS_RQ_RQ_OFF: context.cfs_rq_rq_off,
        RQ_CPU_OFF: context.rq_cpu_off,
        TASK_SOFTIRQ_CNT_OFF: context.task_softirq_cnt_off,
        TASK_PREEMPT_OFF: context.task_preempt_off,
        SPIKE_NS: config.spike.map_or(u64::MAX, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        }),
        WAKEUP_POLICY: match config.wakeup {
            Wakeup::Adaptive => WAKEUP_ADAPTIVE,
            Wakeup::Always => WAKEUP_ALWAYS,
        },
    };
    Ok((globals, debug_globals(&config.debug)))
}

/// The debug knobs as the programs take them.
fn debug_globals(debug: &DebugConfig) -> DebugGlobals {
    DebugGlobals {
        // The top bit asks not to log them (see DEBUG_HIDE_WAKEUPS).
        DEBUG_HIDE_WAKEUPS: if debug.hide_wakeups != 0 && debug.hide_unlogged {
            debug.hide_wakeups | HIDE_UNLOGGED
        } else {
            debug.hide_wakeups
        },
        DEBUG_DEFECT: debug.defect.map_or(DEFECT_NONE, |d| d.kind),
        DEBUG_DEFECT_ONE_IN: debug.defect.map_or(0, |d| d.one_in),
        DEBUG_SKIP: debug.skip.kernel_bits(),
        DEBUG_CHECKS: u32::from(debug.checks),
        FORCE_REJECT: u32::from(debug.force_reject),
    }
}

/// The stack cache's best form: bpf_loop (5.17) and bpf_task_pt_regs (5.15) where the kernel
/// has them; a bounded loop and the task's stack elsewhere.
pub(super) fn cache_helpers(btf: &Btf) -> bool {
    btf.has_enumerator("BPF_FUNC_loop") && btf.has_enumerator("BPF_FUNC_task_pt_regs")
}

/// Offsets in `struct task_struct` every run reads.
struct TaskOffsets {
    state: u32,
    pid: u32,
    tgid: u32,
    flags: u32,
    mm: u32,
    comm: u32,
}

impl TaskOffsets {
    fn read(btf: &Btf) -> Result<Self> {
        Ok(Self {
            state: btf
                .member_offset("task_struct", "__state")
                .or_else(|_| btf.member_offset("task_struct", "state"))?,
            pid: btf.member_offset("task_struct", "pid")?,
            tgid: btf.member_offset("task_struct", "tgid")?,
            flags: btf.member_offset("task_struct", "flags")?,
            mm: btf.member_offset("task_struct", "mm")?,
            comm: btf.member_offset("task_struct", "comm")?,
        })
    }
}

/// Offsets the user walk reads (`--user-stacks`; all 0 without it).
#[derive(Default)]
struct UserOffsets {
    /// `self_exec_id` in task_struct (the memo of a task's map layout).
    exec_id: u32,
    /// The user stack pointer, instruction pointer, frame pointer and link register (0: none)
    /// in `struct pt_regs` (the walk's start; `ustacks::arch`).
    pt_regs: [u32; 4],
    /// `start_code`, `end_code`, `start_stack` in `struct mm_struct` (`layout_key`).
    mm_layout: [u32; 3],
    /// The bits pointer authentication signs in a user return address (arm64; 0 elsewhere).
    pac_mask: u64,
}

impl UserOffsets {
    fn read(btf: &Btf, user_stacks: bool) -> Result<Self> {
        if !user_stacks {
            return Ok(Self::default());
        }
        Ok(Self {
            exec_id: btf.member_offset("task_struct", "self_exec_id")?,
            pt_regs: {
                let mut offsets = [0; 4];
                for (at, member) in offsets.iter_mut().zip(arch::pt_regs_members(Arch::HOST)) {
                    if let Some((name, word)) = member {
                        *at = btf.member_offset("pt_regs", name)? + 8 * word;
                    }
                }
                offsets
            },
            mm_layout: [
                btf.member_offset("mm_struct", "start_code")?,
                btf.member_offset("mm_struct", "end_code")?,
                btf.member_offset("mm_struct", "start_stack")?,
            ],
            pac_mask: arch::pac_mask(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};

    use super::{DebugGlobals, Globals};

    /// The object's globals are the table's settings, no more and no fewer: a static added to
    /// the eBPF crate outside the table (which the loader would never write) fails here, as
    /// would a setting the programs lost. `write` writes each one, and a struct literal names
    /// every field, so none is left at its default.
    #[test]
    fn the_objects_globals_are_the_settings() {
        let file = object::File::parse(super::super::EBPF_OBJECT).expect("the object parses");
        let in_data = |index| {
            file.section_by_index(index)
                .ok()
                .and_then(|s| s.name().ok().map(str::to_owned))
                .is_some_and(|n| {
                    [".data", ".rodata", ".bss"]
                        .iter()
                        .any(|p| n.starts_with(p))
                })
        };
        let globals: BTreeSet<String> = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Data && s.is_global())
            .filter(|s| s.section_index().is_some_and(in_data))
            .filter_map(|s| s.name().ok().map(str::to_owned))
            // aya-log's own, which its loader sets.
            .filter(|n| !n.starts_with("AYA_LOG"))
            .collect();
        let settings: BTreeSet<String> = Globals::NAMES
            .iter()
            .chain(DebugGlobals::NAMES)
            .map(|n| (*n).to_owned())
            .collect();
        assert_eq!(globals, settings);
    }
}

//! Loading: the object with its settings, then the programs of the best variant the kernel
//! verifies, each rejection said with the verifier's reason.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{BtfTracePoint, RawTracePoint},
};

use super::{
    Backtraces, EBPF_OBJECT, Globals, Probe, ProbeConfig, Variant, names,
    verifier::{self, Rejection},
};

/// The BTF wakeup programs can run here: their globals and what the kernel knows.
pub(super) struct KernelSupport {
    /// Kernel BTF for the BTF tracepoint programs (`None`: none, or not asked for).
    pub(super) btf: Option<aya::Btf>,
    /// The stack cache is wanted and knows this architecture's stacks.
    pub(super) cache: bool,
    /// The helpers of the stack cache's best form exist (`bpf_loop`, `bpf_task_pt_regs`).
    pub(super) cache_helpers: bool,
}

pub(super) fn prog_mut<'a, T>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(prog)
        .with_context(|| format!("eBPF object has no program {prog}"))?
        .try_into()
        .with_context(|| format!("{prog} is not the expected kind of program"))
}

/// Verifies one program; a rejection is said with the verifier's own reason.
pub(super) fn load_program(
    ebpf: &mut Ebpf,
    prog: &str,
    btf: Option<&aya::Btf>,
) -> Result<(), Rejection> {
    let loaded = match btf {
        Some(btf) => prog_mut::<BtfTracePoint>(ebpf, prog)
            .map_err(|e| plain_rejection(prog, &e))?
            .load("sched_wakeup", btf),
        None => prog_mut::<RawTracePoint>(ebpf, prog)
            .map_err(|e| plain_rejection(prog, &e))?
            .load(),
    };
    loaded.map_err(|e| verifier::rejection(prog, &e))
}

pub(super) fn plain_rejection(prog: &str, err: &anyhow::Error) -> Rejection {
    Rejection {
        program: prog.to_owned(),
        reason: format!("{err:#}"),
        instruction: None,
        log: None,
    }
}

/// A kernel without BPF compare-and-swap refuses the instruction wherever it appears (Linux
/// 5.10 says "BPF_STX uses reserved fields"): that is a missing feature, not a defect.
pub(super) fn lacks_cas(rejection: &Rejection) -> bool {
    rejection.reason.contains("reserved fields") || rejection.reason.contains("unknown opcode")
}

/// Loads the object with `g`, then verifies the programs of the first of `candidates` the
/// kernel accepts. Returns the object and the variant, or every rejection.
pub(super) fn load_variant(
    g: &Globals,
    config: &ProbeConfig,
    btf: Option<&aya::Btf>,
    candidates: &[Variant],
    rejected: &mut Vec<(Variant, Rejection)>,
) -> Result<Option<(Ebpf, Variant)>> {
    let stack_at_wakeup = u32::from(btf.is_some());
    let mut loader = EbpfLoader::new();
    loader
        .override_global(names::GLOBAL_MODE, &g.mode, true)
        .override_global(names::GLOBAL_FILTER_TGID, &g.filter, true)
        .override_global(names::GLOBAL_SELF_TGID, &g.self_tgid, true)
        .override_global(names::GLOBAL_SKIP_KTHREADS, &g.skip_kthreads, true)
        .override_global(names::GLOBAL_INTER_CUTOFF_NS, &g.cutoff, true)
        .override_global(names::GLOBAL_MIN_SLEEP_NS, &g.min_sleep, true)
        .override_global(names::GLOBAL_SWITCH_HAS_PREV_STATE, &g.has_prev_state, true)
        .override_global(names::GLOBAL_TASK_STATE_OFF, &g.state_off, true)
        .override_global(names::GLOBAL_TASK_PID_OFF, &g.pid_off, true)
        .override_global(names::GLOBAL_TASK_TGID_OFF, &g.tgid_off, true)
        .override_global(names::GLOBAL_TASK_FLAGS_OFF, &g.flags_off, true)
        .override_global(names::GLOBAL_TASK_MM_OFF, &g.mm_off, true)
        .override_global(names::GLOBAL_TASK_COMM_OFF, &g.comm_off, true)
        .override_global(names::GLOBAL_USER_STACKS_ON, &g.user_stacks, true)
        .override_global(names::GLOBAL_USER_WALK_FRAMES, &g.user_walk_frames, true)
        .override_global(names::GLOBAL_PT_REGS_SP_OFF, &g.pt_regs_sp_off, true)
        .override_global(names::GLOBAL_TASK_EXEC_ID_OFF, &g.exec_id_off, true)
        .override_global(names::GLOBAL_PT_REGS_IP_OFF, &g.pt_regs_ip_bp[0], true)
        .override_global(names::GLOBAL_PT_REGS_BP_OFF, &g.pt_regs_ip_bp[1], true)
        .override_global(names::GLOBAL_MM_START_CODE_OFF, &g.mm_layout_offs[0], true)
        .override_global(names::GLOBAL_MM_END_CODE_OFF, &g.mm_layout_offs[1], true)
        .override_global(names::GLOBAL_MM_START_STACK_OFF, &g.mm_layout_offs[2], true)
        .override_global(
            names::GLOBAL_TASK_EXEC_RUNTIME_OFF,
            &g.exec_runtime_off,
            true,
        )
        .override_global(names::GLOBAL_TASK_RUN_DELAY_OFF, &g.run_delay_off, true)
        .override_global(names::GLOBAL_DEBUG_HIDE_WAKEUPS, &g.hide_wakeups, true)
        .override_global(names::GLOBAL_DEBUG_DROP_SLEEPS, &g.drop_sleeps, true)
        .override_global(names::GLOBAL_THREAD_SP_OFF, &g.thread_sp_off, true)
        .override_global(names::GLOBAL_TASK_STACK_OFF, &g.task_stack_off, true)
        .override_global(names::GLOBAL_PT_REGS_IN_STACK, &g.pt_regs_in_stack, true)
        .override_global(names::GLOBAL_RUNQ, &g.details, true)
        .override_global(names::GLOBAL_HISTOGRAMS_ON, &g.details, true)
        .override_global(names::GLOBAL_STACK_WALK_FRAMES, &g.walk, true)
        .override_global(names::GLOBAL_STACK_AT_WAKEUP, &stack_at_wakeup, true)
        .override_global(names::GLOBAL_SPIKE_NS, &g.spike_ns, true)
        .override_global(names::GLOBAL_WAKEUP_POLICY, &g.wakeup, true)
        .override_global(names::GLOBAL_DEBUG_CHECKS, &g.debug_checks, true)
        .override_global(names::GLOBAL_FORCE_REJECT, &g.force_reject, true)
        .override_global(names::GLOBAL_CGROUPS_ON, &g.cgroups_on, true)
        .override_global(names::GLOBAL_FILTER_CGROUPS, &g.filter_cgroups, true)
        .override_global(names::GLOBAL_WAKERS_ON, &g.wakers_on, true)
        .override_global(names::GLOBAL_WAKER_STACKS, &g.waker_stacks, true)
        .override_global(names::GLOBAL_PC_FROM_RQ, &g.context.pc_from_rq, true)
        .override_global(
            names::GLOBAL_TASK_CFS_RQ_OFF,
            &g.context.task_cfs_rq_off,
            true,
        )
        .override_global(names::GLOBAL_CFS_RQ_RQ_OFF, &g.context.cfs_rq_rq_off, true)
        .override_global(names::GLOBAL_RQ_CPU_OFF, &g.context.rq_cpu_off, true)
        .override_global(
            names::GLOBAL_TASK_SOFTIRQ_CNT_OFF,
            &g.context.task_softirq_cnt_off,
            true,
        )
        .map_max_entries(
            names::MAP_WAKERS,
            if config.wakers { config.max_wakers } else { 1 },
        )
        .map_max_entries(
            names::MAP_WAKERS_OTHER,
            if config.wakers { config.max_wakers } else { 1 },
        )
        .map_max_entries(
            names::MAP_USER_STACKS,
            if config.user_stacks {
                config.max_user_stacks
            } else {
                1
            },
        )
        .map_max_entries(
            names::MAP_CAUSE_PARTS,
            if config.user_stacks {
                config.max_records
            } else {
                1
            },
        )
        .map_max_entries(names::MAP_TASKS, config.max_tasks)
        .map_max_entries(names::MAP_GLOBAL_LATENCY, config.max_records)
        .map_max_entries(names::MAP_MERGED, config.max_records)
        .map_max_entries(names::MAP_HISTOGRAMS, config.max_records)
        .map_max_entries(names::MAP_CGROUP_LATENCY, config.max_records)
        .map_max_entries(names::MAP_STACKS, config.max_stacks);
    let mut ebpf = loader
        .load(EBPF_OBJECT)
        .context("loading latprof's eBPF object")?;
    // Once one program showed that compare-and-swap is missing, its variants are not tried.
    let mut cas_missing = false;
    for &variant in candidates {
        if variant.cas && cas_missing {
            continue;
        }
        let programs = [
            (variant.wakeup_program(), btf),
            (variant.switch_program(), None),
            (variant.exit_program(), None),
            (variant.free_program(), None),
        ];
        let mut loaded = Vec::new();
        let mut failed = None;
        for (prog, btf) in programs {
            match load_program(&mut ebpf, prog, btf) {
                Ok(()) => loaded.push((prog, btf.is_some())),
                Err(rejection) => {
                    failed = Some(rejection);
                    break;
                }
            }
        }
        let Some(rejection) = failed else {
            return Ok(Some((ebpf, variant)));
        };
        for (prog, is_btf) in loaded {
            let _ = if is_btf {
                prog_mut::<BtfTracePoint>(&mut ebpf, prog).map(aya::programs::BtfTracePoint::unload)
            } else {
                prog_mut::<RawTracePoint>(&mut ebpf, prog).map(aya::programs::RawTracePoint::unload)
            };
        }
        cas_missing |= variant.cas && lacks_cas(&rejection);
        rejected.push((variant, rejection));
    }
    Ok(None)
}

/// Why a better variant than the one loaded is not running, for the user.
pub(super) fn fallback_reason(variant: Variant, rejection: &Rejection) -> String {
    if variant.cas && lacks_cas(rejection) {
        return "no BPF compare-and-swap in this kernel (Linux 5.12)".to_owned();
    }
    rejection.to_string()
}

impl Probe {
    /// The best variant the kernel accepts: backtraces at wakeup (through the stack cache where
    /// it can run) on BTF tracepoints, else walked at switch-out; with compare-and-swap where
    /// the kernel has it. Each variant passed over is said in `fallbacks`.
    pub(super) fn load_best(
        globals: &Globals,
        config: &ProbeConfig,
        support: &KernelSupport,
        fallbacks: &mut Vec<String>,
    ) -> Result<(Ebpf, Variant)> {
        let variant = |backtraces, cas| Variant { backtraces, cas };
        let mut rejected = Vec::new();
        if let Some(btf) = &support.btf {
            let mut candidates = Vec::new();
            if support.cache && support.cache_helpers {
                candidates.push(variant(Backtraces::AtWakeupCached, true));
            }
            for cas in [true, false] {
                if support.cache && !support.cache_helpers {
                    candidates.push(variant(Backtraces::AtWakeupCachedBounded, cas));
                }
                candidates.push(variant(Backtraces::AtWakeup, cas));
            }
            // Without the stack cache the object needs no saved stack pointer.
            let g = Globals {
                thread_sp_off: if support.cache {
                    globals.thread_sp_off
                } else {
                    0
                },
                ..globals.clone()
            };
            if let Some(loaded) = load_variant(&g, config, Some(btf), &candidates, &mut rejected)? {
                fallbacks.extend(rejected.iter().map(|(v, r)| fallback_reason(*v, r)));
                return Ok(loaded);
            }
        }
        let candidates = [
            variant(Backtraces::AtSwitchOut, true),
            variant(Backtraces::AtSwitchOut, false),
        ];
        let g = Globals {
            thread_sp_off: 0,
            ..globals.clone()
        };
        if let Some(loaded) = load_variant(&g, config, None, &candidates, &mut rejected)? {
            fallbacks.extend(rejected.iter().map(|(v, r)| fallback_reason(*v, r)));
            return Ok(loaded);
        }
        // Nothing loads: the last rejection is of the simplest variant, the one that should
        // load anywhere; the others are said before it.
        let (_, last) = rejected
            .pop()
            .context("no variant of latprof's programs was tried")?;
        for (v, r) in rejected.iter().filter(|(_, r)| r.reason != last.reason) {
            eprintln!(
                "latprof: {} not loaded: {}",
                v.describe(),
                fallback_reason(*v, r)
            );
        }
        Err(anyhow::Error::new(last))
    }
}

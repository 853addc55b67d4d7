//! Loads latprof's eBPF object, configures it for one run, attaches it and owns it: dropping the
//! [`Probe`] detaches every program and frees every map.
pub mod btf;
mod config;
pub mod facts;
pub mod log;
pub mod memory;
pub mod names;
mod variant;
pub mod verifier;

use config::{LATENCYTOP_UNIT_NS, STACK_SLACK_FRAMES};
pub use config::{Mode, ProbeConfig, Wakeup, latencytop_cutoff_ns};
pub use facts::KernelFacts;
pub use variant::{Backtraces, Variant};

use std::os::fd::AsRawFd as _;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    maps::CgroupArray,
    programs::{BtfTracePoint, RawTracePoint},
};
use latprof_common::{MODE_LAZY, MODE_NORMAL};
use verifier::Rejection;

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/latprof"));

/// Capability bits from linux/capability.h.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails with one line naming what is missing when this process may not load latprof.
pub fn check_privileges() -> Result<(), crate::Error> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| caps & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    Err(crate::Error::Privileges)
}

/// Settings written into the eBPF object's globals.
#[derive(Clone)]
struct Globals {
    mode: u32,
    filter: u32,
    self_tgid: u32,
    skip_kthreads: u32,
    cutoff: u64,
    min_sleep: u64,
    has_prev_state: u32,
    state_off: u32,
    pid_off: u32,
    tgid_off: u32,
    flags_off: u32,
    mm_off: u32,
    comm_off: u32,
    /// `--user-stacks`, frames per user walk, and `sp` in `struct pt_regs`.
    user_stacks: u32,
    user_walk_frames: u32,
    pt_regs_sp_off: u32,
    /// `self_exec_id` in task_struct (the memo of a task's map layout).
    exec_id_off: u32,
    /// `start_code`, `end_code`, `start_stack` in `struct mm_struct` (`layout_key`).
    mm_layout_offs: [u32; 3],
    /// `ip` and `bp` in `struct pt_regs` (the user walk's start).
    pt_regs_ip_bp: [u32; 2],
    /// `se.sum_exec_runtime` and `sched_info.run_delay` in task_struct; 0: no recovery of
    /// sleeps whose wakeup was hidden.
    exec_runtime_off: u32,
    run_delay_off: u32,
    hide_wakeups: u32,
    drop_sleeps: u32,
    /// `thread.sp` in task_struct; 0: no stack cache.
    thread_sp_off: u32,
    /// `stack` in task_struct, and the user registers' place above it.
    task_stack_off: u32,
    pt_regs_in_stack: u32,
    details: u32,
    walk: u32,
    spike_ns: u64,
    wakeup: u32,
    debug_checks: u32,
    force_reject: u32,
    cgroups_on: u32,
    filter_cgroups: u32,
    wakers_on: u32,
    waker_stacks: u32,
    context: WakerContext,
}

/// How the waker programs find the context a waking runs in (see `wakers` in the eBPF
/// crate): all zero where they cannot, and every waking outside a timer callback is the
/// current task's.
#[derive(Clone, Copy, Default)]
struct WakerContext {
    pc_from_rq: u64,
    task_cfs_rq_off: u32,
    cfs_rq_rq_off: u32,
    rq_cpu_off: u32,
    task_softirq_cnt_off: u32,
}

/// Where this CPU's preempt count is next to its run queue: the distance between the per-CPU
/// variables `runqueues` and `__preempt_count` (or `pcpu_hot.preempt_count`, Linux 6.2 to
/// 6.14), from the BTF's per-CPU section or else from /proc/kallsyms; and the way from a task
/// to its run queue (`se.cfs_rq->rq`, CONFIG_FAIR_GROUP_SCHED). x86-64 only (elsewhere the
/// preempt count is in the task). Err says why not.
fn waker_context(btf: &btf::Btf) -> Result<WakerContext, String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("the preempt count is read only on x86-64".to_owned());
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
        None => kallsyms_places(btf).ok_or_else(|| {
            "neither the BTF nor /proc/kallsyms places the per-CPU runqueues and preempt count"
                .to_owned()
        })?,
    };
    Ok(WakerContext {
        pc_from_rq: places.1.wrapping_sub(places.0),
        task_cfs_rq_off,
        cfs_rq_rq_off,
        rq_cpu_off,
        // PREEMPT_RT counts softirqs in the task.
        task_softirq_cnt_off: btf
            .member_offset("task_struct", "softirq_disable_cnt")
            .unwrap_or(0),
    })
}

/// `runqueues` and the preempt count's addresses from /proc/kallsyms (per-CPU symbols are
/// there with CONFIG_KALLSYMS_ALL, as on Debian's kernels).
fn kallsyms_places(btf: &btf::Btf) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    let find = |name: &str| {
        text.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let addr = f.next()?;
            let _kind = f.next()?;
            (f.next()? == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
    };
    let rq = find("runqueues")?;
    let pc = match find("__preempt_count") {
        Some(pc) => pc,
        None => find("pcpu_hot")? + u64::from(btf.member_offset("pcpu_hot", "preempt_count").ok()?),
    };
    // Addresses hidden from this process (kptr_restrict) read as 0.
    (rq != 0 && pc != 0).then_some((rq, pc))
}

/// The BTF wakeup programs can run here: their globals and what the kernel knows.
struct KernelSupport {
    /// Kernel BTF for the BTF tracepoint programs (`None`: none, or not asked for).
    btf: Option<aya::Btf>,
    /// The stack cache is wanted and knows this architecture's stacks.
    cache: bool,
    /// The helpers of the stack cache's best form exist (`bpf_loop`, `bpf_task_pt_regs`).
    cache_helpers: bool,
}

fn prog_mut<'a, T>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(prog)
        .with_context(|| format!("eBPF object has no program {prog}"))?
        .try_into()
        .with_context(|| format!("{prog} is not the expected kind of program"))
}

/// Verifies one program; a rejection is said with the verifier's own reason.
fn load_program(ebpf: &mut Ebpf, prog: &str, btf: Option<&aya::Btf>) -> Result<(), Rejection> {
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

fn plain_rejection(prog: &str, err: &anyhow::Error) -> Rejection {
    Rejection {
        program: prog.to_owned(),
        reason: format!("{err:#}"),
        instruction: None,
        log: None,
    }
}

/// A kernel without BPF compare-and-swap refuses the instruction wherever it appears (Linux
/// 5.10 says "BPF_STX uses reserved fields"): that is a missing feature, not a defect.
fn lacks_cas(rejection: &Rejection) -> bool {
    rejection.reason.contains("reserved fields") || rejection.reason.contains("unknown opcode")
}

/// Loads the object with `g`, then verifies the programs of the first of `candidates` the
/// kernel accepts. Returns the object and the variant, or every rejection.
fn load_variant(
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

/// Attaches the programs that end sleeps before the one that starts them: a sleep that starts
/// while its end is not yet watched would never be closed.
fn attach_variant(ebpf: &mut Ebpf, variant: Variant) -> Result<()> {
    // Before anything makes entries: it retires those of tasks first seen while exiting.
    prog_mut::<RawTracePoint>(ebpf, variant.free_program())?
        .attach("sched_process_free")
        .context("attach raw tracepoint sched_process_free")?;
    prog_mut::<RawTracePoint>(ebpf, variant.exit_program())?
        .attach("sched_process_exit")
        .context("attach raw tracepoint sched_process_exit")?;
    if variant.backtraces == Backtraces::AtSwitchOut {
        prog_mut::<RawTracePoint>(ebpf, variant.wakeup_program())?
            .attach("sched_wakeup")
            .context("attach raw tracepoint sched_wakeup")?;
    } else {
        prog_mut::<BtfTracePoint>(ebpf, variant.wakeup_program())?
            .attach()
            .context("attach BTF tracepoint sched_wakeup")?;
    }
    prog_mut::<RawTracePoint>(ebpf, variant.switch_program())?
        .attach("sched_switch")
        .context("attach raw tracepoint sched_switch")?;
    Ok(())
}

/// Why a better variant than the one loaded is not running, for the user.
fn fallback_reason(variant: Variant, rejection: &Rejection) -> String {
    if variant.cas && lacks_cas(rejection) {
        return "no BPF compare-and-swap in this kernel (Linux 5.12)".to_owned();
    }
    rejection.to_string()
}

/// Loads and attaches the rename program; a kernel without its tracepoint keeps each task's
/// name from its first sleep, and latprof says so.
fn attach_rename(ebpf: &mut Ebpf, fallbacks: &mut Vec<String>) -> Result<()> {
    let p: &mut RawTracePoint = prog_mut(ebpf, names::PROG_TASK_RENAME)?;
    if let Err(e) = p.load() {
        fallbacks.push(format!(
            "names are those of each task's first sleep: {}",
            verifier::rejection(names::PROG_TASK_RENAME, &e)
        ));
        return Ok(());
    }
    if let Err(e) = p.attach("task_rename") {
        p.unload().context("unloading task_rename")?;
        fallbacks.push(format!(
            "names are those of each task's first sleep: attaching task_rename: {e}"
        ));
    }
    Ok(())
}

/// Loads and attaches the waker programs: `sched_waking` (Linux 4.3) must load; a kernel
/// without the timer tracepoints counts timers' wakeups as interrupts', and latprof says so.
fn attach_waker_programs(ebpf: &mut Ebpf, fallbacks: &mut Vec<String>) -> Result<()> {
    for prog in names::WAKER_PROGRAMS {
        let p: &mut RawTracePoint = prog_mut(ebpf, prog)?;
        p.load().map_err(|e| verifier::rejection(prog, &e))?;
        // The program is named after its tracepoint.
        if let Err(e) = p.attach(prog) {
            if prog == names::PROG_SCHED_WAKING {
                return Err(e).context("attach raw tracepoint sched_waking");
            }
            p.unload().with_context(|| format!("unloading {prog}"))?;
            fallbacks.push(format!(
                "timer wakeups are not told from other interrupts': attaching {prog}: {e}"
            ));
        }
    }
    Ok(())
}

/// Loads and attaches each tick program whose tracepoint this kernel has; the others are
/// unloaded again. Returns (program, attached) for each.
fn attach_tick_programs(ebpf: &mut Ebpf) -> Result<Vec<(&'static str, bool)>> {
    let mut out = Vec::new();
    for prog in names::TICK_PROGRAMS {
        let p: &mut RawTracePoint = ebpf
            .program_mut(prog)
            .with_context(|| format!("eBPF object has no program {prog}"))?
            .try_into()
            .with_context(|| format!("{prog} is not a raw tracepoint program"))?;
        p.load()
            .with_context(|| format!("verifier rejected {prog}"))?;
        // The program is named after its tracepoint.
        let attached = p.attach(prog).is_ok();
        if !attached {
            p.unload()
                .with_context(|| format!("unloading {prog} (no such tracepoint)"))?;
        }
        out.push((prog, attached));
    }
    Ok(out)
}

/// Opens `--cgroup`'s directories, each checked to be cgroup v2 (a bad one is an
/// [`crate::Error::BadInput`]).
fn open_cgroup_filters(paths: &[std::path::PathBuf]) -> Result<Vec<std::fs::File>> {
    if paths.len() > config::MAX_CGROUP_FILTERS {
        return Err(crate::Error::BadInput(format!(
            "--cgroup: at most {} cgroups",
            config::MAX_CGROUP_FILTERS
        ))
        .into());
    }
    paths
        .iter()
        .map(|p| {
            if !crate::cgroups::is_cgroup2_dir(p) {
                let why = if p.exists() {
                    "not a cgroup v2 directory"
                } else {
                    "no such directory"
                };
                return Err(
                    crate::Error::BadInput(format!("--cgroup {}: {why}", p.display())).into(),
                );
            }
            std::fs::File::open(p).with_context(|| format!("--cgroup {}", p.display()))
        })
        .collect()
}

/// `DEBUG_HIDE_WAKEUPS`'s bit that leaves the wakeups it hides out of the `HIDDEN` log.
const HIDE_UNLOGGED: u32 = 1 << 31;

/// A loaded and attached latprof session.
pub struct Probe {
    ebpf: Ebpf,
    config: ProbeConfig,
    ticks: Vec<(&'static str, bool)>,
    variant: Variant,
    fallbacks: Vec<String>,
    /// Cgroup attribution was asked for but the host mounts no cgroup2 (legacy only).
    cgroups_unavailable: bool,
    /// With `--user-stacks`: the ring buffer that announces each process whose frames will
    /// need naming, taken from the object before the programs attach (none is missed); the
    /// collector's naming thread takes it.
    user_seen: Option<aya::maps::RingBuf<aya::maps::MapData>>,
}

/// What `announce` says once, and `top` in its status line, on a host with the legacy cgroup
/// hierarchy only. Not a fallback: no variant of the programs would do better.
pub const NO_CGROUP_VIEWS: &str = "cgroup views are not available: this host mounts no cgroup v2 file system (legacy hierarchy only)";

/// Where x86-64 keeps a task's user registers: `task_struct.stack` and their distance from it
/// (THREAD_SIZE, 16 KiB without KASAN, less `sizeof(struct pt_regs)`); (0, 0) where unknown. A
/// wrong guess costs cache hits, never a wrong backtrace: a hit needs every return address in
/// its place.
fn pt_regs_place(btf: &btf::Btf) -> (u32, u32) {
    const THREAD_SIZE: u32 = 16 * 1024;
    match (
        btf.member_offset("task_struct", "stack"),
        btf.struct_size("pt_regs"),
    ) {
        (Ok(stack), Ok(regs)) if cfg!(target_arch = "x86_64") && regs < THREAD_SIZE => {
            (stack, THREAD_SIZE - regs)
        }
        _ => (0, 0),
    }
}

/// Offsets of `se.sum_exec_runtime` and `sched_info.run_delay` in `struct task_struct`: both, or
/// (0, 0) where the kernel lacks either (no recovery of sleeps whose wakeup was hidden).
fn recovery_offsets(btf: &btf::Btf) -> (u32, u32) {
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
fn thread_sp_offset(btf: &btf::Btf) -> u32 {
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

impl Probe {
    /// Checks privileges and kernel support, loads, configures and attaches all programs.
    pub fn attach(config: ProbeConfig) -> Result<Self> {
        check_privileges()?;
        // Every offset comes from this kernel's BTF.
        let btf = btf::Btf::from_sys_fs()?;
        // btf_trace_sched_switch(void *data, bool preempt, prev, next[, prev_state]).
        let has_prev_state = u32::from(
            !config.state_from_task && btf.fn_pointer_arity("btf_trace_sched_switch")? >= 5,
        );
        let state_off = btf
            .member_offset("task_struct", "__state")
            .or_else(|_| btf.member_offset("task_struct", "state"))?;
        let pid_off = btf.member_offset("task_struct", "pid")?;
        let tgid_off = btf.member_offset("task_struct", "tgid")?;
        let flags_off = btf.member_offset("task_struct", "flags")?;
        let mm_off = btf.member_offset("task_struct", "mm")?;
        let comm_off = btf.member_offset("task_struct", "comm")?;
        let (pt_regs_sp_off, exec_id_off, pt_regs_ip_bp, mm_layout_offs) = if config.user_stacks {
            (
                btf.member_offset("pt_regs", "sp")?,
                btf.member_offset("task_struct", "self_exec_id")?,
                [
                    btf.member_offset("pt_regs", "ip")?,
                    btf.member_offset("pt_regs", "bp")?,
                ],
                [
                    btf.member_offset("mm_struct", "start_code")?,
                    btf.member_offset("mm_struct", "end_code")?,
                    btf.member_offset("mm_struct", "start_stack")?,
                ],
            )
        } else {
            (0, 0, [0; 2], [0; 3])
        };
        let mut fallbacks = Vec::new();
        let (exec_runtime_off, run_delay_off) = recovery_offsets(&btf);
        if exec_runtime_off == 0 {
            fallbacks.push(
                "sleeps whose wakeup the kernel hides are lost, not recovered: no se.sum_exec_runtime or sched_info.run_delay in this kernel's task_struct (CONFIG_SCHED_INFO)".to_owned(),
            );
        }
        let thread_sp_off = thread_sp_offset(&btf);
        // The stack cache: x86-64's saved stack pointer; bpf_loop (5.17) and bpf_task_pt_regs
        // (5.15) where the kernel has them, a bounded loop and the task's stack elsewhere.
        let cache_helpers =
            btf.has_enumerator("BPF_FUNC_loop") && btf.has_enumerator("BPF_FUNC_task_pt_regs");
        let (task_stack_off, pt_regs_in_stack) = pt_regs_place(&btf);
        if config.stack_cache && config.btf_wakeup {
            if thread_sp_off == 0 {
                fallbacks.push("stack cache off: it knows only x86-64's kernel stacks".to_owned());
            } else if !cache_helpers {
                fallbacks.push(
                    "stack cache learnt in a bounded loop: this kernel lacks bpf_loop (Linux 5.17) or bpf_task_pt_regs (5.15)"
                        .to_owned(),
                );
            }
        }

        let context = if config.wakers {
            waker_context(&btf).unwrap_or_else(|why| {
                fallbacks.push(format!(
                    "wakeups from interrupts other than timers are attributed to the task they interrupted: {why}"
                ));
                WakerContext::default()
            })
        } else {
            WakerContext::default()
        };
        let filters = open_cgroup_filters(&config.cgroup_filter)?;
        // Without a cgroup2 file system every task is in its root: nothing to attribute.
        let cgroups_on = u32::from(config.cgroups && crate::cgroups::mount_point().is_some());
        let cgroups_unavailable = config.cgroups && cgroups_on == 0;
        let mode = match config.mode {
            Mode::Lazy => MODE_LAZY,
            Mode::Normal => MODE_NORMAL,
        };
        let filter = config.pid.unwrap_or(0);
        let self_tgid = if config.include_self {
            0
        } else {
            std::process::id()
        };
        // With a pid filter the user asked for that process, kernel thread or not.
        let skip_kthreads = u32::from(config.pid.is_none());
        let cutoff = config.inter_cutoff.map_or(u64::MAX, latencytop_cutoff_ns);
        let min_sleep = LATENCYTOP_UNIT_NS;
        let details = u32::from(config.details);
        // Above the cause frames sit the tracing frames and the scheduler's (about 10).
        let walk = (u32::from(config.stack_depth) + STACK_SLACK_FRAMES).min(127);
        let globals = Globals {
            mode,
            filter,
            self_tgid,
            skip_kthreads,
            cutoff,
            min_sleep,
            has_prev_state,
            state_off,
            pid_off,
            tgid_off,
            flags_off,
            mm_off,
            comm_off,
            user_stacks: u32::from(config.user_stacks),
            user_walk_frames: u32::try_from(latprof_common::USER_FRAMES).unwrap_or(u32::MAX),
            pt_regs_sp_off,
            exec_id_off,
            pt_regs_ip_bp,
            mm_layout_offs,
            exec_runtime_off,
            run_delay_off,
            // The top bit asks not to log them (see DEBUG_HIDE_WAKEUPS).
            hide_wakeups: if config.hide_wakeups != 0 && config.hide_unlogged {
                config.hide_wakeups | HIDE_UNLOGGED
            } else {
                config.hide_wakeups
            },
            drop_sleeps: config.drop_sleeps,
            thread_sp_off,
            task_stack_off,
            pt_regs_in_stack,
            details,
            walk,
            spike_ns: config.spike.map_or(u64::MAX, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
            }),
            wakeup: match config.wakeup {
                Wakeup::Adaptive => latprof_common::WAKEUP_ADAPTIVE,
                Wakeup::Always => latprof_common::WAKEUP_ALWAYS,
            },
            debug_checks: u32::from(config.debug_checks),
            force_reject: u32::from(config.force_reject),
            cgroups_on,
            filter_cgroups: u32::try_from(filters.len()).unwrap_or(u32::MAX),
            wakers_on: u32::from(config.wakers),
            waker_stacks: u32::from(config.wakers && config.waker_stacks),
            context,
        };
        let support = KernelSupport {
            btf: if config.btf_wakeup {
                match aya::Btf::from_sys_fs() {
                    Ok(btf) => Some(btf),
                    Err(e) => {
                        fallbacks.push(format!("no BTF tracepoints: reading kernel BTF: {e}"));
                        None
                    }
                }
            } else {
                None
            },
            cache: config.stack_cache && thread_sp_off != 0,
            cache_helpers: cache_helpers && !config.bounded_cache,
        };
        let (mut ebpf, variant) = Self::load_best(&globals, &config, &support, &mut fallbacks)?;
        if !filters.is_empty() {
            let mut array = CgroupArray::try_from(
                ebpf.map_mut(names::MAP_CGROUP_FILTER)
                    .context("no CGROUP_FILTER map")?,
            )?;
            for (i, dir) in (0u32..).zip(&filters) {
                array
                    .set(i, dir.as_raw_fd(), 0)
                    .context("setting the --cgroup filter")?;
            }
        }
        // Before the programs run: every announced process stays in the ring until read.
        let user_seen = if config.user_stacks {
            Some(
                aya::maps::RingBuf::try_from(
                    ebpf.take_map(names::MAP_USER_SEEN)
                        .context("no USER_SEEN map")?,
                )
                .context("USER_SEEN is not a ring buffer")?,
            )
        } else {
            None
        };
        // The wakers first: a sleep that starts once the latency programs run finds its
        // waking watched.
        if config.wakers {
            attach_waker_programs(&mut ebpf, &mut fallbacks)?;
        }
        attach_variant(&mut ebpf, variant)?;
        attach_rename(&mut ebpf, &mut fallbacks)?;
        let ticks = attach_tick_programs(&mut ebpf)?;
        Ok(Self {
            ebpf,
            config,
            ticks,
            variant,
            fallbacks,
            cgroups_unavailable,
            user_seen,
        })
    }

    /// The best variant the kernel accepts: backtraces at wakeup (through the stack cache where
    /// it can run) on BTF tracepoints, else walked at switch-out; with compare-and-swap where
    /// the kernel has it. Each variant passed over is said in `fallbacks`.
    fn load_best(
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

    /// The programs loaded: which variant, and what it costs next to the best.
    #[must_use]
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Why each better variant did not load (empty when the best one runs).
    #[must_use]
    pub fn fallbacks(&self) -> &[String] {
        &self.fallbacks
    }

    /// Says on stderr which variant loaded, and why no better one did.
    pub fn announce(&self) {
        eprintln!("latprof: programs: {}", self.variant.describe());
        for why in &self.fallbacks {
            eprintln!("latprof: warning: not the best variant: {why}");
        }
        if self.cgroups_unavailable {
            eprintln!("latprof: {NO_CGROUP_VIEWS}");
        }
    }

    /// Whether cgroup attribution was asked for and the host cannot give it (no cgroup2
    /// mounted): the views say so instead of showing nothing.
    #[must_use]
    pub fn cgroups_unavailable(&self) -> bool {
        self.cgroups_unavailable
    }

    /// The tick and time-accounting programs and whether this kernel has their tracepoints.
    #[must_use]
    pub fn tick_sources(&self) -> &[(&'static str, bool)] {
        &self.ticks
    }

    /// Where the loaded programs take backtraces.
    #[must_use]
    pub fn backtraces(&self) -> Backtraces {
        self.variant.backtraces
    }

    #[must_use]
    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    #[must_use]
    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// The ring buffer that announces processes to name frames of (`--user-stacks`), for the
    /// one collector that names them.
    pub fn take_user_seen(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        self.user_seen.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every map and program the object has is named in `names`, and every name there is in
    /// the object: the two lists cannot drift apart unnoticed.
    #[test]
    fn names_match_the_object_both_ways() {
        use std::collections::BTreeSet;
        let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded object parses");
        // The globals' sections and aya-log's buffers are maps too, but not latprof's.
        let not_ours = |name: &str| name.starts_with('.') || name.starts_with("AYA_LOG");
        let maps: BTreeSet<&str> = object
            .maps
            .keys()
            .map(String::as_str)
            .filter(|m| !not_ours(m))
            .collect();
        assert_eq!(maps, names::MAPS.into_iter().collect());
        let programs: BTreeSet<&str> = object.programs.keys().map(String::as_str).collect();
        assert_eq!(programs, names::PROGRAMS.into_iter().collect());
    }
}

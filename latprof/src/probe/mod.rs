//! Loads latprof's eBPF object, configures it for one run, attaches it and owns it: dropping the
//! [`Probe`] detaches every program and frees every map.
pub mod btf;
pub mod names;

use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{BtfTracePoint, RawTracePoint},
};
use latprof_common::{MODE_LAZY, MODE_NORMAL};

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/latprof"));

/// How accounted sleeps reach the global table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Per-task records only; merged into the global table when the task exits.
    #[default]
    Lazy,
    /// Every accounted sleep also updates the global table (latencytop's mode 1).
    Normal,
}

impl Mode {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lazy => "lazy",
            Self::Normal => "normal",
        }
    }
}

/// Everything fixed for one run.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    pub mode: Mode,
    /// Only this process (tgid); `None` traces all.
    pub pid: Option<u32>,
    pub include_self: bool,
    /// Interruptible sleeps longer than this are not counted; `None` counts all.
    pub inter_cutoff: Option<Duration>,
    pub max_tasks: u32,
    pub max_records: u32,
    pub max_stacks: u32,
    /// Frames shown per backtrace (the walk takes this many plus room for dropped ones).
    pub stack_depth: u16,
    /// Also keep run-queue latency and per-cause histograms (what `top` shows).
    pub details: bool,
    /// Take backtraces at wakeup from the BTF tracepoint where the kernel has one (false forces
    /// the raw-tracepoint fallback that walks at every switch-out, as on older kernels).
    pub btf_wakeup: bool,
    /// With the BTF wakeup program, answer a task's repeated sleeps from its stack cache
    /// instead of walking its stack each time (false walks every counted sleep).
    pub stack_cache: bool,
    /// Sleeps and run-queue waits at least this long go to the spike ring buffer; `None`: no
    /// spike events.
    pub spike: Option<Duration>,
    pub wakeup: Wakeup,
    /// Count (and log through aya-log) consistency anomalies; off, the checks are not loaded.
    pub debug_checks: bool,
}

/// When the spike reader is woken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Wakeup {
    /// Only when the reader said it is about to sleep, or the buffer passes its fill mark.
    #[default]
    Adaptive,
    /// On every event.
    Always,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Lazy,
            pid: None,
            include_self: false,
            inter_cutoff: Some(Duration::from_millis(5)),
            max_tasks: 8192,
            max_records: 16384,
            max_stacks: 8192,
            stack_depth: 12,
            details: true,
            btf_wakeup: true,
            stack_cache: true,
            spike: None,
            wakeup: Wakeup::Adaptive,
            debug_checks: false,
        }
    }
}

/// Frames walked beyond the shown depth: the tracing frames and the scheduler's own, which
/// are dropped before the cause frames.
const STACK_SLACK_FRAMES: u32 = 16;

/// latencytop measures in units of 1024 ns (`ns >> 10`, which it calls usecs).
const LATENCYTOP_UNIT_NS: u64 = 1024;

/// The longest interruptible sleep that still counts, compared the way latencytop compares: it
/// drops a sleep when `ns >> 10 > limit_in_usecs`, so `--inter-cutoff 5ms` keeps sleeps up to
/// 5000 * 1024 + 1023 ns, exactly the sleeps the kernel's latencytop keeps. Sleeps shorter than
/// one unit (`ns >> 10 == 0`) are dropped the same way (`MIN_SLEEP_NS`).
#[must_use]
pub fn latencytop_cutoff_ns(limit: Duration) -> u64 {
    let usecs = u64::try_from(limit.as_micros()).unwrap_or(u64::MAX);
    usecs
        .saturating_mul(LATENCYTOP_UNIT_NS)
        .saturating_add(LATENCYTOP_UNIT_NS - 1)
}

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
    flags_off: u32,
    mm_off: u32,
    /// `thread.sp` in task_struct; 0: no stack cache.
    thread_sp_off: u32,
    details: u32,
    walk: u32,
    spike_ns: u64,
    wakeup: u32,
    debug_checks: u32,
}

/// Loads the object, verifies every program, then attaches the programs that end sleeps before
/// the one that starts them: a sleep that starts while its end is not yet watched would never
/// be closed (verifying one program takes long enough for that to happen). With `btf`, the
/// wakeup program is the BTF tracepoint one.
fn load(g: &Globals, config: &ProbeConfig, btf: Option<&aya::Btf>) -> Result<Ebpf> {
    fn raw<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut RawTracePoint> {
        ebpf.program_mut(prog)
            .with_context(|| format!("eBPF object has no program {prog}"))?
            .try_into()
            .with_context(|| format!("{prog} is not a raw tracepoint program"))
    }
    fn btf_tp<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut BtfTracePoint> {
        ebpf.program_mut(prog)
            .with_context(|| format!("eBPF object has no program {prog}"))?
            .try_into()
            .with_context(|| format!("{prog} is not a BTF tracepoint program"))
    }
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
        .override_global(names::GLOBAL_TASK_FLAGS_OFF, &g.flags_off, true)
        .override_global(names::GLOBAL_TASK_MM_OFF, &g.mm_off, true)
        .override_global(names::GLOBAL_THREAD_SP_OFF, &g.thread_sp_off, true)
        .override_global(names::GLOBAL_RUNQ, &g.details, true)
        .override_global(names::GLOBAL_HISTOGRAMS_ON, &g.details, true)
        .override_global(names::GLOBAL_STACK_WALK_FRAMES, &g.walk, true)
        .override_global(names::GLOBAL_STACK_AT_WAKEUP, &stack_at_wakeup, true)
        .override_global(names::GLOBAL_SPIKE_NS, &g.spike_ns, true)
        .override_global(names::GLOBAL_WAKEUP_POLICY, &g.wakeup, true)
        .override_global(names::GLOBAL_DEBUG_CHECKS, &g.debug_checks, true)
        .map_max_entries(names::MAP_TASKS, config.max_tasks)
        .map_max_entries(names::MAP_GLOBAL_LATENCY, config.max_records)
        .map_max_entries(names::MAP_MERGED, config.max_records)
        .map_max_entries(names::MAP_HISTOGRAMS, config.max_records)
        .map_max_entries(names::MAP_STACKS, config.max_stacks);
    let mut ebpf = loader
        .load(EBPF_OBJECT)
        .context("loading latprof's eBPF object")?;
    let wakeup = match btf {
        Some(btf) => {
            btf_tp(&mut ebpf, names::PROG_SCHED_WAKEUP_BTF)?
                .load("sched_wakeup", btf)
                .context("verifier rejected sched_wakeup_btf")?;
            names::PROG_SCHED_WAKEUP_BTF
        }
        None => {
            raw(&mut ebpf, names::PROG_SCHED_WAKEUP)?
                .load()
                .context("verifier rejected sched_wakeup")?;
            names::PROG_SCHED_WAKEUP
        }
    };
    for prog in [names::PROG_SCHED_SWITCH, names::PROG_SCHED_PROCESS_EXIT] {
        raw(&mut ebpf, prog)?
            .load()
            .with_context(|| format!("verifier rejected {prog}"))?;
    }
    raw(&mut ebpf, names::PROG_SCHED_PROCESS_EXIT)?
        .attach("sched_process_exit")
        .context("attach raw tracepoint sched_process_exit")?;
    if wakeup == names::PROG_SCHED_WAKEUP_BTF {
        btf_tp(&mut ebpf, wakeup)?
            .attach()
            .context("attach BTF tracepoint sched_wakeup")?;
    } else {
        raw(&mut ebpf, wakeup)?
            .attach("sched_wakeup")
            .context("attach raw tracepoint sched_wakeup")?;
    }
    raw(&mut ebpf, names::PROG_SCHED_SWITCH)?
        .attach("sched_switch")
        .context("attach raw tracepoint sched_switch")?;
    Ok(ebpf)
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

/// A loaded and attached latprof session.
pub struct Probe {
    ebpf: Ebpf,
    config: ProbeConfig,
    ticks: Vec<(&'static str, bool)>,
    backtraces: Backtraces,
}

/// Where the loaded programs take backtraces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backtraces {
    /// At wakeup, only for sleeps that count, from the task's stack cache when it can vouch for
    /// the backtrace (x86-64, BTF tracepoints and bpf_loop).
    AtWakeupCached,
    /// At wakeup, only for sleeps that count; every one walked.
    AtWakeup,
    /// Walked at every switch-out (no BTF tracepoints).
    AtSwitchOut,
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
        let has_prev_state = u32::from(btf.fn_pointer_arity("btf_trace_sched_switch")? >= 5);
        let state_off = btf
            .member_offset("task_struct", "__state")
            .or_else(|_| btf.member_offset("task_struct", "state"))?;
        let pid_off = btf.member_offset("task_struct", "pid")?;
        let flags_off = btf.member_offset("task_struct", "flags")?;
        let mm_off = btf.member_offset("task_struct", "mm")?;
        let thread_sp_off = if config.stack_cache {
            thread_sp_offset(&btf)
        } else {
            0
        };

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
            flags_off,
            mm_off,
            thread_sp_off,
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
        };
        // Prefer taking backtraces at wakeup from the BTF tracepoint (only for sleeps that
        // count); kernels without BTF tracepoints get the raw one and walk at every switch-out.
        let kernel_btf = aya::Btf::from_sys_fs().ok().filter(|_| config.btf_wakeup);
        // The stack cache needs bpf_loop (Linux 5.17): without it, the BTF wakeup program
        // without the cache; without BTF tracepoints, the raw one.
        let no_cache = Globals {
            thread_sp_off: 0,
            ..globals.clone()
        };
        let loaded = kernel_btf.as_ref().and_then(|b| {
            let cached = (globals.thread_sp_off != 0)
                .then(|| load(&globals, &config, Some(b)).ok())
                .flatten();
            match cached {
                Some(ebpf) => Some((ebpf, Backtraces::AtWakeupCached)),
                None => load(&no_cache, &config, Some(b))
                    .ok()
                    .map(|ebpf| (ebpf, Backtraces::AtWakeup)),
            }
        });
        let (mut ebpf, backtraces) = match loaded {
            Some(loaded) => loaded,
            None => (load(&no_cache, &config, None)?, Backtraces::AtSwitchOut),
        };
        let ticks = attach_tick_programs(&mut ebpf)?;
        Ok(Self {
            ebpf,
            config,
            ticks,
            backtraces,
        })
    }

    /// The tick and time-accounting programs and whether this kernel has their tracepoints.
    #[must_use]
    pub fn tick_sources(&self) -> &[(&'static str, bool)] {
        &self.ticks
    }

    /// Where the loaded programs take backtraces.
    #[must_use]
    pub fn backtraces(&self) -> Backtraces {
        self.backtraces
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoff_matches_latencytop_units() {
        let cutoff = latencytop_cutoff_ns(Duration::from_millis(5));
        // latencytop: `if (inter && usecs > 5000) return;` with usecs = ns >> 10.
        assert_eq!(cutoff >> 10, 5000);
        assert_eq!((cutoff + 1) >> 10, 5001);
        assert_eq!(latencytop_cutoff_ns(Duration::MAX), u64::MAX);
    }
}

//! Loads latprof's eBPF object, configures it for one run, attaches it and owns it: dropping the
//! [`Probe`] detaches every program and frees every map.
mod attach;
pub mod btf;
mod config;
pub mod facts;
mod load;
pub mod log;
pub mod memory;
pub mod names;
mod places;
mod variant;
pub mod verifier;

use config::{LATENCYTOP_UNIT_NS, STACK_SLACK_FRAMES};
pub use config::{Mode, ProbeConfig, Wakeup, latencytop_cutoff_ns};
pub use facts::KernelFacts;
pub use variant::{Backtraces, Variant};

use std::os::fd::AsRawFd as _;

use anyhow::{Context as _, Result};
use attach::{
    attach_rename, attach_tick_programs, attach_variant, attach_waker_programs, open_cgroup_filters,
};
use aya::{Ebpf, maps::CgroupArray};
use latprof_common::{MODE_LAZY, MODE_NORMAL};
use load::KernelSupport;
use places::{WakerContext, pt_regs_place, recovery_offsets, thread_sp_offset, waker_context};

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

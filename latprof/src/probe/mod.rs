//! Loads latprof's eBPF object, configures it for one run, attaches it and owns it: dropping the
//! [`Probe`] detaches every program and frees every map.
mod attach;
pub mod btf;
mod cgroup_room;
mod config;
pub mod facts;
mod floor;
mod kfuncs;
mod load;
pub mod log;
mod maps;
pub mod memory;
pub mod names;
mod places;
mod settings;
mod task_slots;
mod variant;
pub mod verifier;

pub use config::{
    DebugConfig, INTER_CUTOFF, MAX_CHAINS, MAX_RECORDS, MAX_STACKS, MAX_TASKS, MAX_USER_STACKS,
    MAX_WAKERS, Mode, ProbeConfig, STACK_DEPTH, Skip, Wakeup, latencytop_cutoff_ns,
};
pub use facts::KernelFacts;
pub use maps::Maps;
pub use variant::{Backtraces, Variant};

use std::os::fd::AsRawFd as _;

use anyhow::{Context as _, Result};
use attach::{
    attach_rename, attach_tick_programs, attach_variant, attach_waker_programs, open_cgroup_filters,
};
use aya::{Ebpf, maps::CgroupArray};
use kfuncs::Kfuncs;
use load::KernelSupport;
use settings::Kernel;

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

/// A loaded and attached latprof session.
pub struct Probe {
    ebpf: Ebpf,
    /// The maps the snapshots read, taken out of `ebpf` at attach.
    maps: Maps,
    config: ProbeConfig,
    ticks: Vec<(&'static str, bool)>,
    variant: Variant,
    fallbacks: Vec<String>,
    /// Cgroup attribution was asked for but the host mounts no cgroup2 (legacy only).
    cgroups_unavailable: bool,
    /// With `--user-stacks`: the ring buffer that announces each process whose frames will
    /// need naming, taken from the object before the programs attach (none is missed), and
    /// the unwind tables the capture thread fills; the collector's naming thread takes them.
    user_seen: Option<UserSeen>,
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
        let mut fallbacks = Vec::new();
        let filters = open_cgroup_filters(&config.cgroup_filter)?;
        // Without a cgroup2 file system every task is in its root: nothing to attribute.
        let cgroups_on = config.cgroups && crate::cgroups::mount_point().is_some();
        let cgroups_unavailable = config.cgroups && !cgroups_on;
        let cache_helpers = settings::cache_helpers(&btf);
        let kfuncs = Kfuncs::find(&btf, &config.debug);
        // `sched_waking_btf` calls `bpf_get_current_task_btf` (Linux 5.11).
        let btf_waking = btf.has_enumerator("BPF_FUNC_get_current_task_btf");
        let (globals, debug) = settings::from_config(
            &config,
            &btf,
            &Kernel {
                filters: filters.len(),
                cgroups_on,
                cache_helpers,
                bounded_cache: config.stack_cache
                    && config.btf_wakeup
                    && (!cache_helpers || config.debug.bounded_cache),
                kfuncs,
            },
            &mut fallbacks,
        )?;
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
            cache: config.stack_cache && globals.THREAD_SP_OFF != 0,
            cache_helpers: cache_helpers && !config.debug.bounded_cache,
            kfuncs,
        };
        let (mut ebpf, variant) =
            Self::load_best(&globals, &debug, &config, &support, &mut fallbacks)?;
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
            Some(take_user_maps(&mut ebpf)?)
        } else {
            None
        };
        let maps = Maps::take(&mut ebpf)?;
        // `sched_waking` on its BTF tracepoint beside the variant's, where the kernel has what
        // that program calls.
        let waking_btf = support.btf.as_ref().filter(|_| variant.btf() && btf_waking);
        let ticks = if config.debug.floor {
            floor::attach_floor(
                &mut ebpf,
                variant,
                config.wakers,
                waking_btf.is_some(),
                support.btf.as_ref(),
            )?
        } else {
            // The wakers first: a sleep that starts once the latency programs run finds its
            // waking watched.
            if config.wakers {
                attach_waker_programs(&mut ebpf, waking_btf, &mut fallbacks)?;
            }
            attach_variant(&mut ebpf, variant)?;
            attach_rename(&mut ebpf, &mut fallbacks)?;
            attach_tick_programs(&mut ebpf)?
        };
        Ok(Self {
            ebpf,
            maps,
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

    /// The maps the snapshots read.
    #[must_use]
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// The ring buffer that announces processes to name frames of (`--user-stacks`), for the
    /// one collector that names them.
    pub fn take_user_seen(&mut self) -> Option<UserSeen> {
        self.user_seen.take()
    }
}

/// With `--user-stacks`: the ring buffer of processes to read, and the unwind tables to fill.
pub type UserSeen = (
    aya::maps::RingBuf<aya::maps::MapData>,
    crate::ustacks::tables::Tables,
);

fn take_user_maps(ebpf: &mut Ebpf) -> Result<UserSeen> {
    let mut take = |name: &str| {
        ebpf.take_map(name)
            .with_context(|| format!("no {name} map"))
    };
    let ring = aya::maps::RingBuf::try_from(take(names::MAP_USER_SEEN)?)
        .context("USER_SEEN is not a ring buffer")?;
    let rows = aya::maps::Array::try_from(take(names::MAP_UNWIND_ROWS)?)
        .context("UNWIND_ROWS is not an array")?;
    let processes = aya::maps::HashMap::try_from(take(names::MAP_UNWIND_PROCS)?)
        .context("UNWIND_PROCS is not a hash map")?;
    Ok((ring, crate::ustacks::tables::Tables::new(rows, processes)))
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
        let named = names::PROGRAMS
            .into_iter()
            .chain(names::FLOOR_PROGRAMS.map(|(p, _)| p));
        assert_eq!(programs, named.collect());
    }
}

//! Loading: the object with its settings, then the programs of the best variant the kernel
//! verifies, each rejection said with the verifier's reason.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{BtfTracePoint, RawTracePoint},
};
use latprof_common::{UNWIND_PROCESSES, UNWIND_RULE_BITS, UNWIND_TABLE_ROWS};

use super::{
    Backtraces, EBPF_OBJECT, Probe, ProbeConfig, Variant,
    kfuncs::Kfuncs,
    names,
    settings::{DebugGlobals, Globals},
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
    /// The kfuncs the object's marker calls become.
    pub(super) kfuncs: super::kfuncs::Kfuncs,
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
    btf: Option<(&aya::Btf, &str)>,
) -> Result<(), Rejection> {
    let loaded = match btf {
        Some((btf, tracepoint)) => prog_mut::<BtfTracePoint>(ebpf, prog)
            .map_err(|e| plain_rejection(prog, &e))?
            .load(tracepoint, btf),
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

/// Loads the object `object` (its kfunc calls rewritten for this kernel) with `g`, then
/// verifies the programs of the first of `candidates` the kernel accepts: those with
/// compare-and-swap first, then, where none loaded, those without, in an object of their own
/// whose task entries are all in the hash (no task slots: a slot is claimed by
/// compare-and-swap). Returns the object and the variant, or every rejection.
pub(super) fn load_variant(
    object: &[u8],
    g: &Globals,
    debug: &DebugGlobals,
    config: &ProbeConfig,
    btf: Option<&aya::Btf>,
    candidates: &[Variant],
    rejected: &mut Vec<(Variant, Rejection)>,
) -> Result<Option<(Ebpf, Variant)>> {
    let (cas, nocas): (Vec<Variant>, Vec<Variant>) = candidates.iter().partition(|v| v.cas);
    for (group, slots) in [(cas, g.TASK_SLOTS_N), (nocas, 0)] {
        if group.is_empty() {
            continue;
        }
        let g = Globals {
            // Whether this variant's wakeup program takes the backtraces: it is the BTF one.
            STACK_AT_WAKEUP: u32::from(btf.is_some()),
            TASK_SLOTS_N: slots,
            ..g.clone()
        };
        let mut ebpf = loader(&g, debug, config)
            .load(object)
            .context("loading latprof's eBPF object")?;
        if let Some(variant) = first_accepted(&mut ebpf, btf, &group, rejected) {
            return Ok(Some((ebpf, variant)));
        }
    }
    Ok(None)
}

/// The loader of the object with `g` and the maps sized for `config`.
fn loader<'a>(g: &'a Globals, debug: &'a DebugGlobals, config: &ProbeConfig) -> EbpfLoader<'a> {
    let mut loader = EbpfLoader::new();
    g.write(&mut loader);
    debug.write(&mut loader);
    loader
        .map_max_entries(
            names::MAP_WAKERS,
            if config.wakers { config.max_wakers } else { 1 },
        )
        .map_max_entries(
            names::MAP_WAKERS_OTHER,
            if config.wakers { config.max_wakers } else { 1 },
        )
        .map_max_entries(
            names::MAP_CHAINS,
            if config.chains_on() {
                config.max_chains
            } else {
                1
            },
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
            names::MAP_UNWIND_ROWS,
            if config.user_stacks {
                UNWIND_TABLE_ROWS
            } else {
                1
            },
        )
        .map_max_entries(
            names::MAP_UNWIND_PROCS,
            if config.user_stacks {
                UNWIND_PROCESSES
            } else {
                1
            },
        )
        .map_max_entries(
            names::MAP_UNWIND_RULES,
            if config.user_stacks {
                1 << UNWIND_RULE_BITS
            } else {
                1
            },
        )
        .map_max_entries(
            names::MAP_STACK_WINDOWS,
            if config.user_stacks {
                u32::try_from(crate::cpus::possible_numbers()).unwrap_or(1)
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
        .map_max_entries(names::MAP_TASK_SLOTS, g.TASK_SLOTS_N.max(1))
        .map_max_entries(names::MAP_SLOT_TIDS, g.TASK_SLOTS_N.max(1))
        .map_max_entries(
            names::MAP_TASKS,
            super::task_slots::hash_entries(config, g.TASK_SLOTS_N),
        )
        .map_max_entries(names::MAP_GLOBAL_LATENCY, config.max_records)
        .map_max_entries(names::MAP_MERGED, config.max_records)
        .map_max_entries(names::MAP_HISTOGRAMS, config.max_records)
        .map_max_entries(names::MAP_CGROUP_LATENCY, config.max_records)
        .map_max_entries(names::MAP_STACKS, config.max_stacks);
    loader
}

/// The first of `candidates` whose programs the kernel accepts in the loaded `ebpf` (the BTF
/// tracepoints' programs attach by `btf`), each rejected one in `rejected`.
fn first_accepted(
    ebpf: &mut Ebpf,
    btf: Option<&aya::Btf>,
    candidates: &[Variant],
    rejected: &mut Vec<(Variant, Rejection)>,
) -> Option<Variant> {
    // Once one program showed that compare-and-swap is missing, its variants are not tried.
    let mut cas_missing = false;
    for &variant in candidates {
        if variant.cas && cas_missing {
            continue;
        }
        // The BTF tracepoints' programs with their tracepoints.
        let programs = [
            (variant.wakeup_program(), btf.map(|b| (b, "sched_wakeup"))),
            (variant.switch_program(), btf.map(|b| (b, "sched_switch"))),
            (variant.exit_program(), None),
            (variant.free_program(), None),
        ];
        let mut loaded = Vec::new();
        let mut failed = None;
        for (prog, btf) in programs {
            match load_program(ebpf, prog, btf) {
                Ok(()) => loaded.push((prog, btf.is_some())),
                Err(rejection) => {
                    failed = Some(rejection);
                    break;
                }
            }
        }
        let Some(rejection) = failed else {
            return Some(variant);
        };
        for (prog, is_btf) in loaded {
            let _ = if is_btf {
                prog_mut::<BtfTracePoint>(ebpf, prog).map(aya::programs::BtfTracePoint::unload)
            } else {
                prog_mut::<RawTracePoint>(ebpf, prog).map(aya::programs::RawTracePoint::unload)
            };
        }
        cas_missing |= variant.cas && lacks_cas(&rejection);
        rejected.push((variant, rejection));
    }
    None
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
    /// the kernel has it. Each variant passed over is said in `fallbacks`. Where the programs
    /// that call kfuncs load a worse variant than the best, or none (a kernel may have a kfunc
    /// and refuse its calls: without a JIT it refuses every one), they are loaded again
    /// without them, and the better load is kept.
    pub(super) fn load_best(
        globals: &Globals,
        debug: &DebugGlobals,
        config: &ProbeConfig,
        support: &KernelSupport,
        fallbacks: &mut Vec<String>,
    ) -> Result<(Ebpf, Variant)> {
        let first = Self::load_best_with(globals, debug, config, support, support.kfuncs)?;
        if first.rejected.is_empty() || support.kfuncs == Kfuncs::default() {
            return first.finish(fallbacks);
        }
        // The kfunc calls may have cost the best variant, or every one: a kernel that has a
        // kfunc may refuse its calls (without a JIT it refuses every one). The programs
        // without them are kept where they do better; a hard error of theirs keeps the first.
        let Ok(second) = Self::load_best_with(globals, debug, config, support, Kfuncs::default())
        else {
            return first.finish(fallbacks);
        };
        let better = match (&first.loaded, &second.loaded) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(_), Some(_)) => second.rejected.len() < first.rejected.len(),
        };
        if !better {
            second.forget();
            return first.finish(fallbacks);
        }
        let mut first = first;
        let (v, why) = first.rejected.remove(0);
        fallbacks.push(format!(
            "no kfunc calls (the stack cache copies the sleeping task's stack by a helper): the programs that call them were refused: {}",
            fallback_reason(v, &why)
        ));
        first.forget();
        second.finish(fallbacks)
    }

    /// [`Self::load_best`] with the object's kfunc calls rewritten for `kfuncs`, and the
    /// setting that lets the programs take the kfuncs' paths written to match.
    fn load_best_with(
        globals: &Globals,
        debug: &DebugGlobals,
        config: &ProbeConfig,
        support: &KernelSupport,
        kfuncs: Kfuncs,
    ) -> Result<Attempt> {
        let variant = |backtraces, cas| Variant { backtraces, cas };
        let mut rejected = Vec::new();
        let (object, _) = kfuncs.rewrite(EBPF_OBJECT)?;
        let object = object.bytes();
        let globals = &Globals {
            RDONLY_CAST_WORDS_ID: kfuncs.rdonly_cast_words(),
            ..globals.clone()
        };
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
                THREAD_SP_OFF: if support.cache {
                    globals.THREAD_SP_OFF
                } else {
                    0
                },
                ..globals.clone()
            };
            if let Some(loaded) = load_variant(
                object,
                &g,
                debug,
                config,
                Some(btf),
                &candidates,
                &mut rejected,
            )? {
                return Ok(Attempt {
                    loaded: Some(loaded),
                    rejected,
                });
            }
        }
        let candidates = [
            variant(Backtraces::AtSwitchOut, true),
            variant(Backtraces::AtSwitchOut, false),
        ];
        let g = Globals {
            THREAD_SP_OFF: 0,
            ..globals.clone()
        };
        let loaded = load_variant(object, &g, debug, config, None, &candidates, &mut rejected)?;
        Ok(Attempt { loaded, rejected })
    }
}

/// One load of the object: the best variant the kernel took (`None`: none), and the
/// rejection of each variant tried before it.
struct Attempt {
    loaded: Option<(Ebpf, Variant)>,
    rejected: Vec<(Variant, Rejection)>,
}

impl Attempt {
    /// The variant loaded, each rejection before it said in `fallbacks`; or the error when
    /// none loads.
    fn finish(self, fallbacks: &mut Vec<String>) -> Result<(Ebpf, Variant)> {
        match self.loaded {
            Some(loaded) => {
                fallbacks.extend(self.rejected.iter().map(|(v, r)| fallback_reason(*v, r)));
                Ok(loaded)
            }
            None => Err(nothing_loads(self.rejected)),
        }
    }

    /// A load not kept: its programs unloaded, and the verifier logs it wrote, which no line
    /// names, removed.
    fn forget(self) {
        for (_, r) in self.rejected {
            if let Some(log) = r.log {
                let _ = std::fs::remove_file(log);
            }
        }
    }
}

/// Nothing loads: the last rejection is of the simplest variant, the one that should load
/// anywhere; the others are said before it, but those for the same reason, whose verifier
/// logs no line would name (they are removed).
fn nothing_loads(mut rejected: Vec<(Variant, Rejection)>) -> anyhow::Error {
    let Some((_, last)) = rejected.pop() else {
        return anyhow::anyhow!("no variant of latprof's programs was tried");
    };
    for (v, r) in rejected {
        if r.reason != last.reason {
            eprintln!(
                "latprof: {} not loaded: {}",
                v.describe(),
                fallback_reason(v, &r)
            );
        } else if let Some(log) = r.log {
            let _ = std::fs::remove_file(log);
        }
    }
    anyhow::Error::new(last)
}

//! `--debug-floor`, the benchmark's floor: the session loads its programs as always (the same
//! variant, the same settings) but attaches, on each of their hooks, the object's program that
//! does nothing there, of the same type. What those cost is what the kernel charges for
//! running any program on latprof's hooks: the least latprof's own could cost.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{BtfTracePoint, RawTracePoint},
};

use super::{Variant, load::prog_mut, names};

/// The floor's program on `hook` (a raw tracepoint's).
fn floor_of(hook: &str) -> Result<&'static str> {
    names::FLOOR_PROGRAMS
        .iter()
        .find(|(p, h)| *h == hook && !p.ends_with("_btf"))
        .map(|(p, _)| *p)
        .with_context(|| format!("no floor program for {hook}"))
}

/// Attaches a do-nothing raw tracepoint program to `hook`; false where the kernel has no
/// such tracepoint and `optional` (it is unloaded again).
fn attach_raw(ebpf: &mut Ebpf, hook: &str, optional: bool) -> Result<bool> {
    let prog = floor_of(hook)?;
    let p: &mut RawTracePoint = prog_mut(ebpf, prog)?;
    p.load().with_context(|| format!("loading {prog}"))?;
    match p.attach(hook) {
        Ok(_) => Ok(true),
        Err(_) if optional => {
            p.unload().with_context(|| format!("unloading {prog}"))?;
            Ok(false)
        }
        Err(e) => Err(e).with_context(|| format!("attach raw tracepoint {hook}")),
    }
}

/// Attaches the do-nothing BTF tracepoint program `prog` to `hook`.
fn attach_btf(ebpf: &mut Ebpf, prog: &str, hook: &str, btf: &aya::Btf) -> Result<()> {
    let p: &mut BtfTracePoint = prog_mut(ebpf, prog)?;
    p.load(hook, btf)
        .with_context(|| format!("loading {prog}"))?;
    p.attach()
        .with_context(|| format!("attach BTF tracepoint {hook}"))?;
    Ok(())
}

/// Attaches the floor on the hooks the session's programs would have: the variant's four
/// (with the wakeup's program type), the wakers' where asked for, the rename and the tick
/// hooks where the kernel has them. Returns the tick programs as `attach_tick_programs` does.
pub(super) fn attach_floor(
    ebpf: &mut Ebpf,
    variant: Variant,
    wakers: bool,
    waking_btf: bool,
    btf: Option<&aya::Btf>,
) -> Result<Vec<(&'static str, bool)>> {
    let btf = if variant.btf() {
        Some(btf.context("the variant's programs are BTF tracepoints', but no BTF was read")?)
    } else {
        None
    };
    if wakers {
        // The waker programs are named after their tracepoints; `sched_waking`'s is a BTF
        // tracepoint's where latprof's is (`waking_btf`, as `attach_waker_programs` is told).
        for hook in names::WAKER_PROGRAMS {
            match btf {
                Some(btf) if hook == names::PROG_SCHED_WAKING && waking_btf => {
                    attach_btf(ebpf, names::FLOOR_WAKING_BTF, hook, btf)?;
                }
                _ => {
                    attach_raw(ebpf, hook, hook != names::PROG_SCHED_WAKING)?;
                }
            }
        }
    }
    attach_raw(ebpf, "sched_process_free", false)?;
    attach_raw(ebpf, "sched_process_exit", false)?;
    if let Some(btf) = btf {
        attach_btf(ebpf, names::FLOOR_WAKEUP_BTF, "sched_wakeup", btf)?;
        attach_btf(ebpf, names::FLOOR_SWITCH_BTF, "sched_switch", btf)?;
    } else {
        attach_raw(ebpf, "sched_wakeup", false)?;
        attach_raw(ebpf, "sched_switch", false)?;
    }
    attach_raw(ebpf, "task_rename", true)?;
    names::TICK_PROGRAMS
        .into_iter()
        .map(|hook| Ok((hook, attach_raw(ebpf, hook, true)?)))
        .collect()
}

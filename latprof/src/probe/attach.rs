//! Attaching the loaded programs: the variant's, and the optional ones (renames, wakers, ticks)
//! where the kernel has their hooks; the cgroup filter's directories.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{BtfTracePoint, RawTracePoint},
};

use super::{Backtraces, Variant, config, load::prog_mut, names, verifier};

/// Attaches the programs that end sleeps before the one that starts them: a sleep that starts
/// while its end is not yet watched would never be closed.
pub(super) fn attach_variant(ebpf: &mut Ebpf, variant: Variant) -> Result<()> {
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
    if variant.btf() {
        prog_mut::<BtfTracePoint>(ebpf, variant.switch_program())?
            .attach()
            .context("attach BTF tracepoint sched_switch")?;
    } else {
        prog_mut::<RawTracePoint>(ebpf, variant.switch_program())?
            .attach("sched_switch")
            .context("attach raw tracepoint sched_switch")?;
    }
    Ok(())
}

/// Loads and attaches the rename program; a kernel without its tracepoint keeps each task's
/// name from its first sleep, and latprof says so.
pub(super) fn attach_rename(ebpf: &mut Ebpf, fallbacks: &mut Vec<String>) -> Result<()> {
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

/// Loads and attaches the waker programs: `sched_waking` (Linux 4.3) must load, on its BTF
/// tracepoint with `btf` (given where the variant's programs are on theirs and the kernel has
/// `bpf_get_current_task_btf`: the wakee's pid and the waker's name are plain loads there),
/// else on the raw one; a kernel without the timer tracepoints counts timers' wakeups as
/// interrupts', and latprof says so.
pub(super) fn attach_waker_programs(
    ebpf: &mut Ebpf,
    btf: Option<&aya::Btf>,
    fallbacks: &mut Vec<String>,
) -> Result<()> {
    for prog in names::WAKER_PROGRAMS {
        if let Some(btf) = btf
            && prog == names::PROG_SCHED_WAKING
        {
            let p: &mut BtfTracePoint = prog_mut(ebpf, names::PROG_SCHED_WAKING_BTF)?;
            p.load(prog, btf)
                .map_err(|e| verifier::rejection(names::PROG_SCHED_WAKING_BTF, &e))?;
            p.attach().context("attach BTF tracepoint sched_waking")?;
            continue;
        }
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
pub(super) fn attach_tick_programs(ebpf: &mut Ebpf) -> Result<Vec<(&'static str, bool)>> {
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
pub(super) fn open_cgroup_filters(paths: &[std::path::PathBuf]) -> Result<Vec<std::fs::File>> {
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

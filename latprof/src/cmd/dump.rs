//! `latprof dump`: a recording's numbers at one moment, or between two, in any export format.
use std::io::Write as _;

use anyhow::{Context as _, Result, anyhow};

use crate::{
    cli::{Cli, DumpArgs},
    collect::Spike,
    export,
    reasons::Reasons,
    store::reader::Recording,
    time,
};

pub fn run(cli: &Cli, args: &DumpArgs) -> Result<()> {
    export::check_wakers_flag(cli.wakers_on(), args.format, args.by)?;
    let mut rec = Recording::open(&args.file)?;
    rec.set_depth(cli.stack_depth);
    for p in &rec.problems {
        eprintln!("latprof: warning: {}: {p}", args.file.display());
    }
    let reasons = Reasons::load(args.reasons.as_deref())?;
    let find = |spec: &str| rec.find(spec).map_err(|e| anyhow!("{e}"));
    let (base, at) = match (&args.at, &args.from, &args.to) {
        (Some(at), _, _) => (None, find(at)?),
        (None, Some(from), to) => {
            let from = find(from)?;
            let to = find(to.as_deref().unwrap_or("end"))?;
            if to < from {
                return Err(anyhow!("--to is before --from"));
            }
            (Some(from), to)
        }
        (None, None, _) => (None, rec.len() - 1),
    };
    if args.info {
        let i = &rec.info;
        let (_, first) = rec.times(0);
        let (_, last) = rec.times(rec.len() - 1);
        eprintln!(
            "latprof: {}: {} snapshots, {} to {} (UTC), {} mode, every {} ms, host {} kernel {} ({} CPUs), latprof {}, {}",
            args.file.display(),
            rec.len(),
            time::rfc3339_utc(first),
            time::rfc3339_utc(last),
            i.mode.as_str(),
            i.interval_ns / 1_000_000,
            i.hostname,
            i.kernel_release,
            i.cpus,
            i.latprof_version,
            rec.end.as_deref().map_or_else(
                || "not finished cleanly".to_owned(),
                |e| format!("finished: {e}")
            ),
        );
        eprintln!(
            "latprof: {}: {} spikes recorded, {} more left out (over --max-spikes in an interval)",
            args.file.display(),
            rec.spikes.len(),
            rec.spikes_not_recorded
        );
    }
    let file = || args.file.display().to_string();
    let cur = rec.snapshot(at).with_context(file)?;
    let base = base
        .map(|b| rec.snapshot(b))
        .transpose()
        .with_context(file)?;
    let after = base.as_ref().map_or(0, |b| b.taken_ns);
    let spikes: Vec<Spike> = rec
        .spikes
        .iter()
        .map(|(s, _)| s)
        .filter(|s| s.end_ns > after && s.end_ns <= cur.taken_ns)
        .cloned()
        .collect();
    // The spikes of the interval are named from the same backtraces: charged with them.
    rec.check_views(&cur, &spikes).with_context(file)?;
    let depth = rec.depth();
    let scope = export::Scope {
        cur: &cur,
        base: base.as_ref(),
        pid: args.pid,
        traced: None,
        syms: &rec.syms,
        reasons: &reasons,
        depth,
        info: Some(&rec.info),
        kernel: Some(&rec.info.kernel),
        chain_depth: usize::from(cli.chain_depth),
        labels: cli.profile_labels,
        spikes: &spikes,
        reader_sleeps: Some(rec.spikes_until(cur.taken_ns, 0).1),
    };
    let mut out = std::io::stdout().lock();
    let bytes = match args.by {
        export::By::Cause if cli.chains && args.format == export::Format::Folded => {
            if !rec.info.chains {
                return Err(crate::Error::BadInput(format!(
                    "{}: recorded without --chains: it has no wait chains to fold",
                    args.file.display()
                ))
                .into());
            }
            export::chains::render_folded(&scope).into_bytes()
        }
        export::By::Cause if cli.wakers_on() && args.format == export::Format::Folded => {
            export::folded::render_wakers(&scope).into_bytes()
        }
        export::By::Cause => export::render(args.format, &scope),
        export::By::Cgroup => export::cgroups::render(args.format, &scope),
    };
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

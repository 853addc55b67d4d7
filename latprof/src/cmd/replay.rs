//! `latprof replay`: the `top` screens over a recording, with time navigation; no root, no eBPF.
use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow};

use crate::{
    cli::{Cli, ReplayArgs},
    reasons::Reasons,
    store::reader::Recording,
    tui::{Input, TerminalGuard, app::Settings, replay::Replay, ui},
};

pub fn run(cli: &Cli, args: &ReplayArgs) -> Result<()> {
    let mut rec = Recording::open(&args.file)?;
    rec.set_depth(cli.stack_depth);
    let reasons = Reasons::load(args.reasons.as_deref())?;
    let find = |spec: &str| rec.find(spec).map_err(|e| anyhow!("{e}"));
    let at = match &args.at {
        Some(at) => find(at)?,
        None => rec.len() - 1,
    };
    let mark = args.from.as_deref().map(find).transpose()?;
    for p in &rec.problems {
        eprintln!("latprof: warning: {}: {p}", args.file.display());
    }
    let settings = Settings {
        mode: rec.info.mode,
        interval_ms: rec.info.interval_ns / 1_000_000,
        depth: rec.depth(),
        syms: rec.syms.clone(),
        reasons,
        kernel: rec.info.kernel.clone(),
        spike_ns: rec.info.spike_ns,
        wakers: rec.info.wakers,
        // Shown where the recording kept them (`record --chains`, format 10 on).
        chain_depth: if rec.info.chains {
            usize::from(cli.chain_depth)
        } else {
            0
        },
    };
    let interval = Duration::from_nanos(rec.info.interval_ns.max(10_000_000));
    let stop = super::stop_flag()?;
    let file = args.file.display().to_string();
    let mut replay = Replay::new(rec, settings, at, mark).context(file)?;
    let mut guard = TerminalGuard::new()?;
    let mut last_tick = Instant::now();
    while !replay.app.quit && !stop.load(Ordering::Relaxed) {
        guard.terminal.draw(|f| ui::render(f, &replay.app))?;
        match crate::tui::next_input(Duration::from_millis(50))? {
            Input::Keys(keys) => keys.into_iter().for_each(|key| replay.handle_key(key)),
            Input::Nothing => {}
            Input::Gone => break,
        }
        if last_tick.elapsed() >= interval {
            last_tick = Instant::now();
            replay.tick();
        }
    }
    drop(guard);
    replay.failed.map_or(Ok(()), Err)
}

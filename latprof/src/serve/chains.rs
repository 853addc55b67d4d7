//! Wait chains in `serve` (`--chains`): what each read added to every chain, the window's
//! `chained_off_cpu` samples (export/chains.rs builds them as `stats --format pprof` does).
//!
//! Memory stays bounded: the chains are kept once each, at most [`MAX_PATHS`] of them (the
//! rest under one frame), and the last read's rows are the chain and waker tables' size.
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use super::threads::Threads;
use crate::{
    collect::Snapshot,
    export::{
        chains::{ChainFrame, samples},
        pprof,
    },
    model::Chains,
    reasons::Reasons,
    symbols::Kallsyms,
};

/// The most chains kept apart; the time of those past it goes under [`OTHER`].
pub const MAX_PATHS: usize = 10_000;

/// The one frame of the chains past [`MAX_PATHS`].
pub const OTHER: &str = "[other chains]";

/// A chain's frames, innermost first (`export::chains::ChainSample::frames`).
pub type Path = Arc<[ChainFrame]>;

/// One chain's time in one read, of one sleeping process (`None`: no label shows it).
pub type ChainPart = (Path, Option<Arc<pprof::Thread>>, u64);

/// Each read's chained time, from the chain and waker tables' growth since the read before.
pub struct ChainReads {
    /// The rows of the read before (the interval's base; only its chains and wakers).
    before: Snapshot,
    /// Levels of a chain (`--chain-depth`).
    levels: usize,
    paths: HashSet<Path>,
    other: Path,
}

impl ChainReads {
    #[must_use]
    pub fn new(levels: usize) -> Self {
        Self {
            before: Snapshot::default(),
            levels,
            paths: HashSet::new(),
            other: Arc::from([ChainFrame::Latprof(OTHER.to_owned())]),
        }
    }

    /// The chain kept for `frames`: the one kept already, a new one while fewer than
    /// [`MAX_PATHS`] are, else [`OTHER`].
    fn path(&mut self, frames: Vec<ChainFrame>) -> Path {
        if let Some(p) = self.paths.get(frames.as_slice()) {
            return Arc::clone(p);
        }
        if self.paths.len() >= MAX_PATHS {
            return Arc::clone(&self.other);
        }
        let p: Path = Arc::from(frames);
        self.paths.insert(Arc::clone(&p));
        p
    }

    /// What `snap` added to each chain since the read before, its sleepers' processes as
    /// `labels` show them, shared with the backtraces' (`threads`: untold past its bound).
    pub fn read(
        &mut self,
        snap: &Snapshot,
        syms: &Kallsyms,
        reasons: &Reasons,
        depth: usize,
        labels: pprof::Labels,
        threads: &mut Threads,
    ) -> Vec<ChainPart> {
        let parts = samples(
            &Chains::new(snap, Some(&self.before), syms, depth, self.levels)
                .deeper_levels_since_start(),
            reasons,
            None,
        );
        self.before = Snapshot {
            chains: snap.chains.clone(),
            wakers: snap.wakers.clone(),
            ..Snapshot::default()
        };
        let mut out: Vec<ChainPart> = Vec::with_capacity(parts.len());
        for s in parts.into_iter().filter(|s| s.ns > 0) {
            let thread = labels
                .mask(pprof::Thread {
                    pid: s.tgid,
                    ..pprof::Thread::default()
                })
                .and_then(|t| threads.intern(t));
            out.push((self.path(s.frames), thread, s.ns));
        }
        out
    }
}

/// The chains' time of the reads in `window` (each read's time and chain parts) taken after
/// `after_ns`, merged per chain and process (each kept once, across reads), the largest first.
#[must_use]
pub fn chained<'a>(
    window: impl Iterator<Item = (u64, &'a [ChainPart])>,
    after_ns: u64,
) -> Vec<pprof::Chained<'a>> {
    type Key = (*const [ChainFrame], Option<*const pprof::Thread>);
    let mut merged: HashMap<Key, pprof::Chained<'a>> = HashMap::new();
    for (_, parts) in window.filter(|(taken_ns, _)| *taken_ns > after_ns) {
        for (path, thread, ns) in parts {
            let thread = thread.as_deref();
            merged
                .entry((Arc::as_ptr(path), thread.map(std::ptr::from_ref)))
                .or_insert_with(|| pprof::Chained {
                    frames: path.iter().map(ChainFrame::pprof).collect(),
                    thread,
                    ns: 0,
                })
                .ns += ns;
        }
    }
    let mut out: Vec<pprof::Chained<'a>> = merged.into_values().collect();
    out.sort_by(|a, b| {
        let (fa, fb) = (
            a.frames.iter().map(|f| f.name),
            b.frames.iter().map(|f| f.name),
        );
        b.ns.cmp(&a.ns)
            .then_with(|| fa.cmp(fb))
            .then_with(|| a.thread.cmp(&b.thread))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain is kept once, however many reads hold it, and no more than `MAX_PATHS` are
    /// kept apart: the next ones share `OTHER`.
    #[test]
    fn chains_are_kept_once_and_bounded() {
        let mut reads = ChainReads::new(4);
        let frames = |i: usize| vec![ChainFrame::Kernel(format!("f{i}"))];
        let first = reads.path(frames(0));
        assert!(Arc::ptr_eq(&first, &reads.path(frames(0))));
        for i in 1..MAX_PATHS {
            reads.path(frames(i));
        }
        let past = reads.path(frames(MAX_PATHS));
        assert_eq!(&*past, &[ChainFrame::Latprof(OTHER.to_owned())]);
        assert!(Arc::ptr_eq(&past, &reads.path(frames(MAX_PATHS + 1))));
        assert!(Arc::ptr_eq(&first, &reads.path(frames(0))));
        assert_eq!(reads.paths.len(), MAX_PATHS);
    }
}

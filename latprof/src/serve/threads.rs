//! serve's profiles told by thread: each read's sleeps by process, thread name and container
//! (the `pid`, `thread_name` and `container_id` labels), found between it and the read
//! before (`model::threads`).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use latprof_common::GlobalRecord;

use crate::{
    collect::Snapshot,
    export::pprof::{Labels, Thread},
    model::{ThreadBase, threads},
};

/// Distinct threads the window may tell: past this, those no read in the window holds go,
/// and while all are held, a new thread's sleeps go out untold (a machine that starts and
/// ends thousands of processes a second would otherwise keep each one for the whole window).
const KEEP_THREADS: usize = 4096;

/// What the reads before left: the base of the next, and the threads the window's reads share.
#[derive(Default)]
pub struct Threads {
    base: Option<ThreadBase>,
    known: HashMap<Thread, Arc<Thread>>,
    /// Whether this read already dropped the threads no read holds (once a read is enough).
    pruned: bool,
}

impl Threads {
    /// Takes in one read: by record id, its sleeps since the read before told by thread as
    /// `labels` show them (threads alike in what they show merged), in their order; empty
    /// where no label shows a thread.
    pub fn read(
        &mut self,
        snap: &Snapshot,
        labels: Labels,
    ) -> HashMap<u64, Vec<(Arc<Thread>, GlobalRecord)>> {
        let mut out = HashMap::new();
        if !labels.threads() {
            return out;
        }
        let parts = threads(snap, self.base.as_ref());
        self.base = Some(ThreadBase::of(snap));
        self.pruned = false;
        for (stack, parts) in parts {
            let mut merged: BTreeMap<Thread, GlobalRecord> = BTreeMap::default();
            for (key, rec) in parts {
                if let Some(thread) = crate::export::profiles::thread_of(snap, labels, &key) {
                    let r = merged.entry(thread).or_default();
                    r.count += rec.count;
                    r.total_ns += rec.total_ns;
                }
            }
            let interned = merged
                .into_iter()
                .filter_map(|(thread, rec)| Some((self.intern(thread)?, rec)))
                .collect();
            out.insert(stack, interned);
        }
        out
    }

    /// `thread` shared with the reads that told it before (the wait chains' too);
    /// `None` past [`KEEP_THREADS`].
    pub(super) fn intern(&mut self, thread: Thread) -> Option<Arc<Thread>> {
        if let Some(known) = self.known.get(&thread) {
            return Some(Arc::clone(known));
        }
        if self.known.len() >= KEEP_THREADS && !self.pruned {
            self.known.retain(|_, t| Arc::strong_count(t) > 1);
            self.pruned = true;
        }
        if self.known.len() >= KEEP_THREADS {
            return None;
        }
        let shared = Arc::new(thread.clone());
        self.known.insert(thread, Arc::clone(&shared));
        Some(shared)
    }
}

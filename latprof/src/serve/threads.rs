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

/// Threads kept for sharing past this: those no read in the window holds go.
const KEEP_THREADS: usize = 4096;

/// What the reads before left: the base of the next, and the threads the window's reads share.
#[derive(Default)]
pub struct Threads {
    base: Option<ThreadBase>,
    known: HashMap<Thread, Arc<Thread>>,
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
        if self.known.len() > KEEP_THREADS {
            self.known.retain(|_, t| Arc::strong_count(t) > 1);
        }
        for (stack, parts) in parts {
            let mut merged: BTreeMap<Thread, GlobalRecord> = BTreeMap::default();
            for (key, rec) in parts {
                let container = snap
                    .cgroup_paths
                    .get(&key.cgroup)
                    .and_then(|p| p.path.as_deref())
                    .and_then(crate::cgroups::container_id);
                let thread = Thread {
                    pid: key.tgid,
                    name: key.name,
                    container,
                };
                if let Some(thread) = labels.mask(thread) {
                    let r = merged.entry(thread).or_default();
                    r.count += rec.count;
                    r.total_ns += rec.total_ns;
                }
            }
            let interned = merged
                .into_iter()
                .map(|(thread, rec)| {
                    let shared = self
                        .known
                        .entry(thread)
                        .or_insert_with_key(|t| Arc::new(t.clone()));
                    (Arc::clone(shared), rec)
                })
                .collect();
            out.insert(stack, interned);
        }
        out
    }
}

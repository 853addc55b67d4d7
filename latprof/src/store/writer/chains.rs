//! The chain table's changes for the next frame (`--chains`), its backtrace ids as the
//! recording writes them.

use super::Writer;
use crate::{collect::Snapshot, store::Body};

impl Writer {
    pub(super) fn chains_body(&mut self, snap: &Snapshot, body: &mut Body) {
        let chains: Vec<_> = snap
            .chains
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c.key.cause = self.public_id(c.key.cause);
                // 0: the waker's sleep was no counted one.
                if c.key.waker_cause != 0 {
                    c.key.waker_cause = self.public_id(c.key.waker_cause);
                }
                (c.key, c)
            })
            .collect();
        let (gone, changed) = super::body::diff(&mut self.chains, chains.into_iter());
        body.chains_gone = gone;
        body.chains = changed.into_iter().map(|(_, c)| c).collect();
    }
}

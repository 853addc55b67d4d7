//! The chain table in recordings (`--chains`, version 10 on), as the waker table: the rows
//! gone since the frame before, and those new or changed.

use latprof_common::ChainKey;

use super::{
    FormatError,
    body::Body,
    codec::{Dec, Enc},
};
use crate::collect::Chain;

fn encode_key(e: &mut Enc, k: &ChainKey) {
    e.u64(k.cause);
    e.u64(k.waker_cause);
    e.u32(k.sleeper_tgid);
    e.u32(k.waker_tgid);
    e.u32(k.link);
}

fn decode_key(d: &mut Dec<'_>) -> Result<ChainKey, FormatError> {
    Ok(ChainKey {
        cause: d.u64()?,
        waker_cause: d.u64()?,
        sleeper_tgid: d.u32()?,
        waker_tgid: d.u32()?,
        link: d.u32()?,
        pad: 0,
    })
}

impl Body {
    /// The chain table (version 10 on).
    pub(super) fn encode_chains(&self, e: &mut Enc) {
        e.usize(self.chains_gone.len());
        for k in &self.chains_gone {
            encode_key(e, k);
        }
        e.usize(self.chains.len());
        for c in &self.chains {
            encode_key(e, &c.key);
            e.u64(c.count);
            e.u64(c.total_ns);
            e.u64(c.behind_ns);
            e.u64(c.runq_ns);
            e.str(&c.comm);
        }
    }

    /// `encode_chains`'s.
    pub(super) fn decode_chains(&mut self, d: &mut Dec<'_>) -> Result<(), FormatError> {
        // At least a byte a number: 5 a key, 10 a row (its name's length included).
        for _ in 0..d.len(5, size_of::<ChainKey>())? {
            self.chains_gone.push(decode_key(d)?);
        }
        for _ in 0..d.len(10, size_of::<Chain>())? {
            self.chains.push(Chain {
                key: decode_key(d)?,
                count: d.u64()?,
                total_ns: d.u64()?,
                behind_ns: d.u64()?,
                runq_ns: d.u64()?,
                comm: d.str()?,
            });
        }
        Ok(())
    }
}

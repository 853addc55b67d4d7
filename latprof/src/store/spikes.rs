//! A spike frame's body: the spikes since the frame before, and the reader's sleep count.

use super::{
    FormatError,
    codec::{Dec, Enc},
};

/// A spike frame's contents.
/// Spikes in time order; each end time as the difference from the one before.
pub fn encode_spikes(
    e: &mut Enc,
    spikes: &[crate::collect::Spike],
    reader_sleeps: u64,
    not_recorded: u64,
) {
    e.u64(reader_sleeps);
    e.u64(not_recorded);
    e.usize(spikes.len());
    let mut sorted: Vec<&crate::collect::Spike> = spikes.iter().collect();
    sorted.sort_by_key(|s| s.end_ns);
    let mut prev = 0;
    for s in sorted {
        e.u64(s.end_ns - prev);
        prev = s.end_ns;
        e.u64(s.duration_ns);
        e.u64(s.stack_id);
        e.u32(s.tid);
        e.u32(s.tgid);
        e.u32(s.cpu);
        e.u32(s.kind);
        e.str(&s.comm);
        e.u32(s.waker_kind);
        e.u32(s.waker_tgid);
        e.u32(s.waker_tid);
        e.str(&s.waker_comm);
    }
}

/// (spikes, reader sleeps, spikes left out so far).
pub fn decode_spikes(
    d: &mut Dec<'_>,
    version: u16,
) -> Result<(Vec<crate::collect::Spike>, u64, u64), FormatError> {
    let sleeps = d.u64()?;
    let not_recorded = d.u64()?;
    let mut out = Vec::new();
    let mut end_ns: u64 = 0;
    for _ in 0..d.len(
        if version >= 6 { 12 } else { 8 },
        size_of::<crate::collect::Spike>(),
    )? {
        end_ns = end_ns
            .checked_add(d.u64()?)
            .ok_or(FormatError::Malformed("spike time overflows"))?;
        out.push(crate::collect::Spike {
            end_ns,
            duration_ns: d.u64()?,
            stack_id: d.u64()?,
            tid: d.u32()?,
            tgid: d.u32()?,
            cpu: d.u32()?,
            kind: d.u32()?,
            comm: d.str()?,
            waker_kind: if version >= 6 { d.u32()? } else { 0 },
            waker_tgid: if version >= 6 { d.u32()? } else { 0 },
            waker_tid: if version >= 6 { d.u32()? } else { 0 },
            waker_comm: if version >= 6 {
                d.str()?
            } else {
                String::new()
            },
        });
    }
    Ok((out, sleeps, not_recorded))
}

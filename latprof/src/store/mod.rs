//! Recordings (`.lpr`): raw cumulative snapshots, appended one frame at a time.
//!
//! File: an 8-byte magic, the format version (u16 LE), 2 reserved bytes; then frames. A frame is
//! a 4-byte sync mark, a header (payload length u32, kind u8, flags u8, decoded length u32) and
//! its payload, with a CRC-32 over header and payload. A key frame holds everything (the
//! recording's facts, the whole snapshot, the backtraces and symbols it names); a delta frame
//! holds what changed since the frame before. Each file starts with a key frame and one follows
//! every [`KEY_EVERY`] snapshots, so a damaged frame costs at most the snapshots up to the next
//! key frame, and a file cut anywhere (SIGKILL, power loss) replays up to its last whole frame.
pub mod codec;
pub mod reader;
pub mod writer;

use std::{
    collections::{BTreeMap, HashMap},
    ops::Range,
};

use latprof_common::{
    COUNTER_COUNT, GlobalRecord, HIST_BUCKETS, Histogram, LatencyRecord, TICK_COUNTER_COUNT,
};

use crate::{
    collect::{Counters, Snapshot, TaskSnapshot, TickCounts},
    probe::Mode,
};
use codec::{Dec, Enc};

pub const MAGIC: [u8; 8] = *b"\x7fLATPROF";
/// The version this latprof writes; it reads every version from 1 to this one.
/// Version 2 added the per-CPU tick counters and the kernel's tick facts.
pub const VERSION: u16 = 3;
pub const FILE_HEADER_LEN: usize = 12;
pub const SYNC: [u8; 4] = *b"LPF\x1e";
/// Sync mark, length, kind, flags, decoded length, CRC.
pub const FRAME_HEADER_LEN: usize = 4 + 4 + 1 + 1 + 4 + 4;
/// No frame decodes to more than this; larger lengths are damage, not data.
pub const MAX_FRAME: usize = 256 << 20;
/// A key frame every this many snapshots.
pub const KEY_EVERY: u64 = 60;

pub const KIND_KEY: u8 = 1;
pub const KIND_DELTA: u8 = 2;
/// The recorder finished cleanly (Ctrl-C, SIGTERM, --duration, --max-size).
pub const KIND_END: u8 = 3;
/// Spike events since the previous spike frame, and the reader's sleep count (version 2 on).
pub const KIND_SPIKES: u8 = 4;
pub const FLAG_ZSTD: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("empty file, not a latprof recording")]
    Empty,
    #[error("not a latprof recording (no latprof magic at the start)")]
    NotARecording,
    #[error(
        "recording format version {0} is newer than this latprof reads (up to {VERSION}); use a newer latprof"
    )]
    FutureVersion(u16),
    #[error("recording format version 0 does not exist: the header is damaged")]
    ZeroVersion,
    #[error("damaged frame: {0}")]
    Malformed(&'static str),
    #[error("the recording holds no complete snapshot{0}")]
    NoSnapshot(String),
}

/// Facts about the machine and the run, in every key frame.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecordingInfo {
    pub latprof_version: String,
    pub hostname: String,
    /// `uname -r`.
    pub kernel_release: String,
    /// `uname -v`.
    pub kernel_version: String,
    pub cpus: u32,
    #[serde(serialize_with = "ser_mode")]
    pub mode: Mode,
    pub interval_ns: u64,
    pub stack_depth: u16,
    /// Run-queue latency and histograms were collected.
    pub details: bool,
    /// The kernel's tick and time-accounting facts (version 2 on).
    pub kernel: crate::probe::KernelFacts,
    /// The spike threshold of the recording (version 2 on; `u64::MAX`: none).
    pub spike_ns: u64,
    #[serde(skip)]
    pub sched_text: Range<u64>,
    #[serde(skip)]
    pub lock_text: Range<u64>,
}

fn ser_mode<S: serde::Serializer>(mode: &Mode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(mode.as_str())
}

fn encode_opt_bool(e: &mut Enc, v: Option<bool>) {
    e.u64(v.map_or(0, |b| 1 + u64::from(b)));
}

fn decode_opt_bool(d: &mut Dec<'_>) -> Result<Option<bool>, FormatError> {
    match d.u64()? {
        0 => Ok(None),
        1 => Ok(Some(false)),
        2 => Ok(Some(true)),
        _ => Err(FormatError::Malformed("optional boolean")),
    }
}

impl crate::probe::KernelFacts {
    fn encode(&self, e: &mut Enc) {
        e.str(self.config_source.as_deref().unwrap_or(""));
        e.u64(self.hz.map_or(0, |hz| u64::from(hz) + 1));
        for v in [
            self.no_hz_idle,
            self.no_hz_full,
            self.virt_cpu_accounting_gen,
            self.context_tracking_user,
        ] {
            encode_opt_bool(e, v);
        }
        e.usize(self.nohz_full_cpus.len());
        for cpu in &self.nohz_full_cpus {
            e.u32(*cpu);
        }
        e.usize(self.tick_sources.len());
        for (name, ok) in &self.tick_sources {
            e.str(name);
            e.bool(*ok);
        }
    }

    fn decode(d: &mut Dec<'_>) -> Result<Self, FormatError> {
        let source = d.str()?;
        let hz = match d.u64()? {
            0 => None,
            v => Some(u32::try_from(v - 1).map_err(|_| FormatError::Malformed("HZ"))?),
        };
        let mut f = Self {
            config_source: (!source.is_empty()).then_some(source),
            hz,
            no_hz_idle: decode_opt_bool(d)?,
            no_hz_full: decode_opt_bool(d)?,
            virt_cpu_accounting_gen: decode_opt_bool(d)?,
            context_tracking_user: decode_opt_bool(d)?,
            ..Self::default()
        };
        for _ in 0..d.len(1)? {
            f.nohz_full_cpus.push(d.u32()?);
        }
        for _ in 0..d.len(2)? {
            f.tick_sources.push((d.str()?, d.bool()?));
        }
        Ok(f)
    }

    /// The programs that ran (format 3 on).
    fn encode_programs(&self, e: &mut Enc) {
        e.str(self.programs.as_deref().unwrap_or(""));
        e.str(self.programs_cost.as_deref().unwrap_or(""));
        e.usize(self.fallbacks.len());
        for why in &self.fallbacks {
            e.str(why);
        }
    }

    fn decode_programs(&mut self, d: &mut Dec<'_>) -> Result<(), FormatError> {
        let programs = d.str()?;
        let cost = d.str()?;
        self.programs = (!programs.is_empty()).then_some(programs);
        self.programs_cost = (!cost.is_empty()).then_some(cost);
        for _ in 0..d.len(1)? {
            self.fallbacks.push(d.str()?);
        }
        Ok(())
    }
}

impl RecordingInfo {
    fn encode(&self, e: &mut Enc, version: u16) {
        e.str(&self.latprof_version);
        e.str(&self.hostname);
        e.str(&self.kernel_release);
        e.str(&self.kernel_version);
        e.u32(self.cpus);
        encode_mode(e, self.mode);
        e.u64(self.interval_ns);
        e.u32(u32::from(self.stack_depth));
        e.bool(self.details);
        for r in [&self.sched_text, &self.lock_text] {
            e.u64(r.start);
            e.u64(r.end);
        }
        if version >= 2 {
            self.kernel.encode(e);
            e.u64(self.spike_ns);
        }
        if version >= 3 {
            self.kernel.encode_programs(e);
        }
    }

    fn decode(d: &mut Dec<'_>, version: u16) -> Result<Self, FormatError> {
        let mut info = Self {
            latprof_version: d.str()?,
            hostname: d.str()?,
            kernel_release: d.str()?,
            kernel_version: d.str()?,
            cpus: d.u32()?,
            mode: decode_mode(d)?,
            interval_ns: d.u64()?,
            stack_depth: u16::try_from(d.u32()?)
                .map_err(|_| FormatError::Malformed("stack depth"))?,
            details: d.bool()?,
            sched_text: d.u64()?..d.u64()?,
            lock_text: d.u64()?..d.u64()?,
            kernel: crate::probe::KernelFacts::default(),
            spike_ns: u64::MAX,
        };
        if version >= 2 {
            info.kernel = crate::probe::KernelFacts::decode(d)?;
            info.spike_ns = d.u64()?;
        }
        if version >= 3 {
            info.kernel.decode_programs(d)?;
        }
        Ok(info)
    }
}

fn encode_mode(e: &mut Enc, mode: Mode) {
    e.u64(match mode {
        Mode::Lazy => 0,
        Mode::Normal => 1,
    });
}

fn decode_mode(d: &mut Dec<'_>) -> Result<Mode, FormatError> {
    match d.u64()? {
        0 => Ok(Mode::Lazy),
        1 => Ok(Mode::Normal),
        _ => Err(FormatError::Malformed("unknown mode")),
    }
}

/// A snapshot as the recording holds it: the whole of it (key frame) or what changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Body {
    pub taken_ns: u64,
    pub wall_ns: u64,
    /// Backtraces first seen here (key frames: every one the snapshot names).
    pub stacks: Vec<(u64, Vec<u64>)>,
    /// Symbols first needed here: (start address, name).
    pub syms: Vec<(u64, String)>,
    pub mode: Mode,
    pub skip_kthreads: bool,
    pub retries: u32,
    pub counters: Vec<u64>,
    pub programs: Vec<(String, u64, u64)>,
    pub tasks_gone: Vec<u32>,
    pub tasks: Vec<TaskSnapshot>,
    pub global_gone: Vec<u64>,
    pub global: Vec<(u64, GlobalRecord)>,
    pub hist_gone: Vec<u64>,
    pub histograms: Vec<(u64, Histogram)>,
    /// Per-CPU tick counters (version 2 on), whole in every frame: a few numbers per CPU.
    pub ticks: Vec<TickCounts>,
}

impl Body {
    pub fn encode(&self, e: &mut Enc, version: u16) {
        e.u64(self.taken_ns);
        e.u64(self.wall_ns);
        e.usize(self.stacks.len());
        for (id, frames) in &self.stacks {
            e.u64(*id);
            e.usize(frames.len());
            for ip in frames {
                e.u64(*ip);
            }
        }
        e.usize(self.syms.len());
        for (addr, name) in &self.syms {
            e.u64(*addr);
            e.str(name);
        }
        encode_mode(e, self.mode);
        e.bool(self.skip_kthreads);
        e.u32(self.retries);
        e.usize(self.counters.len());
        for c in &self.counters {
            e.u64(*c);
        }
        e.usize(self.programs.len());
        for (name, ns, runs) in &self.programs {
            e.str(name);
            e.u64(*ns);
            e.u64(*runs);
        }
        e.usize(self.tasks_gone.len());
        for tid in &self.tasks_gone {
            e.u32(*tid);
        }
        e.usize(self.tasks.len());
        for t in &self.tasks {
            e.u32(t.tid);
            e.u32(t.tgid);
            e.str(&t.comm);
            e.bool(t.kthread);
            e.usize(t.records.len());
            for r in &t.records {
                e.u64(r.stack_id);
                e.u64(r.count);
                e.u64(r.total_ns);
                e.u64(r.max_ns);
            }
        }
        e.usize(self.global_gone.len());
        for id in &self.global_gone {
            e.u64(*id);
        }
        e.usize(self.global.len());
        for (id, r) in &self.global {
            e.u64(*id);
            e.u64(r.count);
            e.u64(r.total_ns);
            e.u64(r.max_ns);
        }
        e.usize(self.hist_gone.len());
        for id in &self.hist_gone {
            e.u64(*id);
        }
        e.usize(self.histograms.len());
        for (id, h) in &self.histograms {
            e.u64(*id);
            for n in h {
                e.u32(*n);
            }
        }
        if version >= 2 {
            e.usize(self.ticks.len());
            for cpu in &self.ticks {
                // The count first, so that a later version can add counters.
                e.usize(cpu.len());
                for v in cpu {
                    e.u64(*v);
                }
            }
        }
    }

    /// Only the fields before the snapshot proper: times, new backtraces and symbols.
    pub fn decode_head(d: &mut Dec<'_>) -> Result<Self, FormatError> {
        let mut b = Self {
            taken_ns: d.u64()?,
            wall_ns: d.u64()?,
            ..Self::default()
        };
        for _ in 0..d.len(2)? {
            let id = d.u64()?;
            let n = d.len(1)?;
            let mut frames = Vec::with_capacity(n);
            for _ in 0..n {
                frames.push(d.u64()?);
            }
            b.stacks.push((id, frames));
        }
        for _ in 0..d.len(2)? {
            b.syms.push((d.u64()?, d.str()?));
        }
        Ok(b)
    }

    pub fn decode(d: &mut Dec<'_>, version: u16) -> Result<Self, FormatError> {
        let mut b = Self::decode_head(d)?;
        b.mode = decode_mode(d)?;
        b.skip_kthreads = d.bool()?;
        b.retries = d.u32()?;
        for _ in 0..d.len(1)? {
            b.counters.push(d.u64()?);
        }
        for _ in 0..d.len(3)? {
            b.programs.push((d.str()?, d.u64()?, d.u64()?));
        }
        for _ in 0..d.len(1)? {
            b.tasks_gone.push(d.u32()?);
        }
        for _ in 0..d.len(5)? {
            let mut t = TaskSnapshot {
                tid: d.u32()?,
                tgid: d.u32()?,
                comm: d.str()?,
                kthread: d.bool()?,
                records: Vec::new(),
            };
            for _ in 0..d.len(4)? {
                t.records.push(LatencyRecord {
                    stack_id: d.u64()?,
                    count: d.u64()?,
                    total_ns: d.u64()?,
                    max_ns: d.u64()?,
                });
            }
            b.tasks.push(t);
        }
        for _ in 0..d.len(1)? {
            b.global_gone.push(d.u64()?);
        }
        for _ in 0..d.len(4)? {
            let id = d.u64()?;
            b.global.push((
                id,
                GlobalRecord {
                    count: d.u64()?,
                    total_ns: d.u64()?,
                    max_ns: d.u64()?,
                },
            ));
        }
        for _ in 0..d.len(1)? {
            b.hist_gone.push(d.u64()?);
        }
        for _ in 0..d.len(1 + HIST_BUCKETS)? {
            let id = d.u64()?;
            let mut h = [0u32; HIST_BUCKETS];
            for n in &mut h {
                *n = d.u32()?;
            }
            b.histograms.push((id, h));
        }
        if version >= 2 {
            for _ in 0..d.len(1)? {
                let mut cpu: TickCounts = [0; TICK_COUNTER_COUNT as usize];
                for i in 0..d.len(1)? {
                    let v = d.u64()?;
                    if let Some(slot) = cpu.get_mut(i) {
                        *slot = v;
                    }
                }
                b.ticks.push(cpu);
            }
        }
        Ok(b)
    }
}

/// The snapshot being rebuilt from a key frame and the deltas after it.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub snap: Snapshot,
    tasks: BTreeMap<u32, TaskSnapshot>,
    global: BTreeMap<u64, GlobalRecord>,
    histograms: BTreeMap<u64, Histogram>,
    stacks: HashMap<u64, Vec<u64>>,
}

impl State {
    /// Applies a key frame (`key`: everything starts over) or a delta.
    pub fn apply(&mut self, body: Body, key: bool) {
        if key {
            *self = Self::default();
        }
        self.stacks.extend(body.stacks);
        for tid in body.tasks_gone {
            self.tasks.remove(&tid);
        }
        for t in body.tasks {
            self.tasks.insert(t.tid, t);
        }
        for id in body.global_gone {
            self.global.remove(&id);
        }
        self.global.extend(body.global);
        for id in body.hist_gone {
            self.histograms.remove(&id);
        }
        self.histograms.extend(body.histograms);
        let mut counters = Counters::default();
        for (slot, v) in counters.0.iter_mut().zip(body.counters) {
            *slot = v;
        }
        let tasks: Vec<TaskSnapshot> = self.tasks.values().cloned().collect();
        let global: Vec<(u64, GlobalRecord)> = self.global.iter().map(|(k, v)| (*k, *v)).collect();
        // The backtraces this snapshot names, as the collector hands them over.
        let mut stacks = BTreeMap::new();
        for id in crate::collect::stack_ids(&global, &tasks) {
            if let Some(frames) = self.stacks.get(&id) {
                stacks.entry(id).or_insert_with(|| frames.clone());
            }
        }
        self.snap = Snapshot {
            mode: body.mode,
            skip_kthreads: body.skip_kthreads,
            tasks,
            global,
            counters,
            stacks,
            retries: body.retries,
            histograms: self.histograms.clone(),
            programs: body.programs,
            taken_ns: body.taken_ns,
            wall_ns: body.wall_ns,
            ticks: body.ticks,
        };
    }
}

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
    }
}

/// (spikes, reader sleeps, spikes left out so far).
pub fn decode_spikes(
    d: &mut Dec<'_>,
) -> Result<(Vec<crate::collect::Spike>, u64, u64), FormatError> {
    let sleeps = d.u64()?;
    let not_recorded = d.u64()?;
    let mut out = Vec::new();
    let mut end_ns: u64 = 0;
    for _ in 0..d.len(8)? {
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
        });
    }
    Ok((out, sleeps, not_recorded))
}

/// Counters the recording knows; a later latprof with more counters still reads the first ones.
#[must_use]
pub fn counter_values(c: &Counters) -> Vec<u64> {
    c.0[..COUNTER_COUNT as usize].to_vec()
}

#[cfg(test)]
pub(crate) mod tests {
    use latprof_common::{Counter, RUNQ_STACK};

    use super::{
        reader::Recording,
        writer::{Options, Writer},
        *,
    };
    use crate::symbols::Kallsyms;

    pub const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81200000 T hrtimer_nanosleep
ffffffff81300000 T anon_pipe_read
ffffffff81400000 T __sched_text_start
ffffffff81400010 T schedule
ffffffff81401000 T __sched_text_end
ffffffffc0000000 t ext4_sync_file\t[ext4]
";

    pub fn info() -> RecordingInfo {
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let (sched_text, lock_text) = syms.ranges();
        RecordingInfo {
            latprof_version: "0.1.0".into(),
            hostname: "test".into(),
            kernel_release: "6.18.0".into(),
            kernel_version: "#1 SMP".into(),
            cpus: 2,
            mode: Mode::Lazy,
            interval_ns: 1_000_000_000,
            stack_depth: 12,
            details: true,
            spike_ns: 10_000_000,
            kernel: crate::probe::KernelFacts {
                config_source: Some("/boot/config-6.18.0".into()),
                hz: Some(250),
                no_hz_full: Some(false),
                nohz_full_cpus: vec![1],
                tick_sources: vec![("tick_stop".into(), true), ("user_enter".into(), false)],
                programs: Some("walk at wakeup, no CAS".into()),
                programs_cost: Some("backtraces walked at wakeup".into()),
                fallbacks: vec!["no bpf_loop".into(), "no BPF compare-and-swap".into()],
                ..Default::default()
            },
            sched_text,
            lock_text,
        }
    }

    fn rec(stack_id: u64, count: u64) -> LatencyRecord {
        LatencyRecord {
            stack_id,
            count,
            total_ns: count * 2_000_000,
            max_ns: 2_100_000 + count,
        }
    }

    /// A run that changes: tasks come and go, records grow, backtraces appear.
    pub fn snapshots(n: u64) -> Vec<Snapshot> {
        (0..n)
            .map(|i| {
                let mut s = Snapshot {
                    mode: Mode::Lazy,
                    skip_kthreads: true,
                    taken_ns: 1_000_000_000 * (i + 1),
                    wall_ns: 1_790_000_000_000_000_000 + 1_000_000_000 * i,
                    ..Snapshot::default()
                };
                s.counters.0[Counter::Counted as usize] = 100 * i;
                s.stacks
                    .insert(1, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8120_0010]);
                s.tasks.push(TaskSnapshot {
                    tid: 100,
                    tgid: 100,
                    comm: "sleeper".into(),
                    kthread: false,
                    records: vec![rec(1, 10 * i + 1), rec(RUNQ_STACK, i + 1)],
                });
                // A short-lived process every third snapshot, merged into the global table after.
                if i % 3 == 1 {
                    s.stacks
                        .insert(2, vec![0xffff_ffff_8140_0020, 0xffff_ffff_c000_0042]);
                    s.tasks.push(TaskSnapshot {
                        tid: 1000 + u32::try_from(i).unwrap(),
                        tgid: 1000 + u32::try_from(i).unwrap(),
                        comm: "fsyncer".into(),
                        kthread: false,
                        records: vec![rec(2, 3)],
                    });
                }
                if i >= 2 {
                    s.stacks
                        .insert(2, vec![0xffff_ffff_8140_0020, 0xffff_ffff_c000_0042]);
                    s.global.push((
                        2,
                        GlobalRecord {
                            count: 3 * ((i + 1) / 3),
                            total_ns: 6_000_000 * ((i + 1) / 3),
                            max_ns: 2_100_003,
                        },
                    ));
                }
                let mut h = [0u32; HIST_BUCKETS];
                h[11] = u32::try_from(10 * i + 1).unwrap();
                s.histograms.insert(1, h);
                s.programs = vec![("sched_switch".into(), 1000 * i, 10 * i)];
                s.ticks = vec![
                    [250 * i; TICK_COUNTER_COUNT as usize],
                    [3 * i; TICK_COUNTER_COUNT as usize],
                ];
                s
            })
            .collect()
    }

    pub fn record(snaps: &[Snapshot], options: Options) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!(
            "latprof-store-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.lpr");
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut w = Writer::create(&path, info(), options).unwrap();
        for s in snaps {
            w.append(s, &syms).unwrap();
        }
        w.finish("test").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        bytes
    }

    #[test]
    fn every_snapshot_comes_back_as_it_was_written() {
        let snaps = snapshots(150);
        for compress in [true, false] {
            let bytes = record(
                &snaps,
                Options {
                    compress,
                    ..Options::default()
                },
            );
            let r = Recording::from_bytes(bytes).unwrap();
            assert!(r.problems.is_empty(), "{:?}", r.problems);
            assert_eq!(r.end.as_deref(), Some("test"));
            assert_eq!(r.info, info());
            assert_eq!(r.len(), snaps.len());
            // Forward, backward and jumping across key frames.
            for i in (0..snaps.len())
                .chain((0..snaps.len()).rev())
                .chain([3, 140, 61, 59, 0])
            {
                assert_eq!(r.snapshot(i), snaps[i], "snapshot {i}, compress {compress}");
            }
            let syms = Kallsyms::parse(KALLSYMS).unwrap();
            for ip in [
                0xffff_ffff_8120_0010,
                0xffff_ffff_c000_0042,
                0xffff_ffff_8140_0020,
            ] {
                assert_eq!(r.syms.name(ip), syms.name(ip));
            }
        }
    }

    #[test]
    fn deltas_and_compression_keep_the_file_small() {
        let snaps = snapshots(120);
        let packed = record(&snaps, Options::default()).len();
        let plain = record(
            &snaps,
            Options {
                compress: false,
                ..Options::default()
            },
        )
        .len();
        assert!(packed < plain, "{packed} >= {plain}");
        // Two key frames; the deltas carry only the changed task, histogram and counters
        // (about 140 bytes each with the frame header), not the whole snapshot again.
        assert!(packed < 120 * 200, "{packed} bytes for 120 snapshots");
    }

    #[test]
    fn a_cut_file_replays_up_to_its_last_whole_frame() {
        let snaps = snapshots(70);
        let bytes = record(&snaps, Options::default());
        // Every cut point: never a panic; the count of snapshots only grows with the length.
        let mut prev = 0;
        for cut in (FILE_HEADER_LEN..bytes.len())
            .step_by(3)
            .chain([bytes.len() - 1])
        {
            match Recording::from_bytes(bytes[..cut].to_vec()) {
                Ok(r) => {
                    assert!(r.len() >= prev, "cut at {cut}");
                    prev = r.len();
                    assert!(r.end.is_none() || cut + 1 >= bytes.len() - 20);
                    let i = r.len() - 1;
                    assert_eq!(r.snapshot(i), snaps[i]);
                }
                Err(e) => assert!(matches!(e, FormatError::NoSnapshot(_)), "cut at {cut}: {e}"),
            }
        }
        // Only the end frame is missing at the last cut.
        assert_eq!(prev, 70);
    }

    #[test]
    fn a_flipped_byte_costs_the_frames_up_to_the_next_key_frame() {
        let snaps = snapshots(130);
        let bytes = record(&snaps, Options::default());
        let r = Recording::from_bytes(bytes.clone()).unwrap();
        assert_eq!(r.len(), 130);
        // Damage the third delta frame (inside its payload).
        let mut frames = Vec::new();
        let mut pos = FILE_HEADER_LEN;
        while pos + FRAME_HEADER_LEN <= bytes.len() {
            frames.push(pos);
            let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
            pos += FRAME_HEADER_LEN + len;
        }
        let mut bad = bytes.clone();
        bad[frames[3] + FRAME_HEADER_LEN + 2] ^= 0x10;
        let r = Recording::from_bytes(bad).unwrap();
        // Snapshots 0..3 stay, 3..60 are lost, 60.. come back from the next key frame.
        assert_eq!(r.len(), 3 + 70);
        assert_eq!(r.snapshot(3), snaps[60]);
        assert_eq!(r.snapshot(r.len() - 1), snaps[129]);
        assert!(
            r.problems.iter().any(|p| p.contains("checksum")),
            "{:?}",
            r.problems
        );
        // A damaged length field: the reader finds the next frame mark.
        let mut bad = bytes.clone();
        bad[frames[5] + 5] ^= 0x40;
        let r = Recording::from_bytes(bad).unwrap();
        assert_eq!(r.len(), 5 + 70);
        assert_eq!(r.snapshot(5), snaps[60]);
    }

    #[test]
    fn spike_frames_come_back_in_time_order() {
        let dir = std::env::temp_dir().join(format!("latprof-spikes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.lpr");
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let mut w = Writer::create(&path, info(), Options::default()).unwrap();
        let snaps = snapshots(5);
        let spike = |end_ns: u64| crate::collect::Spike {
            end_ns,
            duration_ns: 12_000_000,
            stack_id: 1,
            tid: 100,
            tgid: 100,
            cpu: 1,
            kind: latprof_common::SPIKE_SLEEP_INTERRUPTIBLE,
            comm: "sleeper".into(),
        };
        for (i, s) in snaps.iter().enumerate() {
            let t = s.taken_ns;
            w.append_spikes(&[spike(t - 100), spike(t - 500)], 10 * i as u64, 0)
                .unwrap();
            w.append(s, &syms).unwrap();
        }
        w.finish("test").unwrap();
        let r = Recording::open(&path).unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(r.spikes.len(), 10);
        let (upto, sleeps) = r.spikes_until(snaps[2].taken_ns, 200);
        assert_eq!(upto.len(), 6);
        assert_eq!(sleeps, 20);
        let (last, _) = r.spikes_until(snaps[4].taken_ns, 3);
        assert_eq!(last.len(), 3);
        assert_eq!(last[2], spike(snaps[4].taken_ns - 100));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Version 1 recordings (no tick counters) are still read.
    #[test]
    fn version_1_is_still_read() {
        let snaps = snapshots(3);
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&[0, 0]);
        // Key frames only: each holds its whole snapshot.
        for snap in &snaps {
            let mut e = Enc::default();
            info().encode(&mut e, 1);
            writer_body(snap).encode(&mut e, 1);
            bytes.extend_from_slice(&writer::frame(KIND_KEY, &e.buf, true));
        }
        let r = Recording::from_bytes(bytes).unwrap();
        assert_eq!(r.version, 1);
        assert_eq!(r.len(), 3);
        assert_eq!(r.info.kernel, crate::probe::KernelFacts::default());
        assert_eq!(r.info.hostname, info().hostname);
        let mut expect = snaps[2].clone();
        expect.ticks.clear();
        assert_eq!(r.snapshot(2), expect);
    }

    /// A whole snapshot as a frame body (a key frame's).
    fn writer_body(snap: &Snapshot) -> Body {
        Body {
            taken_ns: snap.taken_ns,
            wall_ns: snap.wall_ns,
            stacks: snap.stacks.iter().map(|(k, v)| (*k, v.clone())).collect(),
            syms: Vec::new(),
            mode: snap.mode,
            skip_kthreads: snap.skip_kthreads,
            retries: snap.retries,
            counters: counter_values(&snap.counters),
            programs: snap.programs.clone(),
            tasks_gone: Vec::new(),
            tasks: snap.tasks.clone(),
            global_gone: Vec::new(),
            global: snap.global.clone(),
            hist_gone: Vec::new(),
            histograms: snap.histograms.iter().map(|(k, v)| (*k, *v)).collect(),
            ticks: snap.ticks.clone(),
        }
    }

    #[test]
    fn bad_files_are_refused_with_one_line() {
        let msg = |bytes: Vec<u8>| Recording::from_bytes(bytes).err().unwrap().to_string();
        assert_eq!(msg(Vec::new()), "empty file, not a latprof recording");
        assert!(
            msg(b"Latency Top version : v0.1\n".to_vec()).starts_with("not a latprof recording")
        );
        let mut future = record(&snapshots(2), Options::default());
        future[8] = 9;
        assert_eq!(
            msg(future),
            "recording format version 9 is newer than this latprof reads (up to 3); use a newer latprof"
        );
        let mut only_header = MAGIC.to_vec();
        only_header.extend_from_slice(&[2, 0, 0, 0]);
        assert!(msg(only_header).starts_with("the recording holds no complete snapshot"));
        assert!(!msg(MAGIC[..4].to_vec()).is_empty());
    }

    #[test]
    fn rotation_keeps_a_bounded_set_of_complete_files() {
        let dir = std::env::temp_dir().join(format!("latprof-rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.lpr");
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let options = Options {
            rotate: Some(2000),
            keep: 2,
            ..Options::default()
        };
        let mut w = Writer::create(&path, info(), options).unwrap();
        let snaps = snapshots(300);
        for s in &snaps {
            assert_eq!(w.append(s, &syms).unwrap(), writer::Appended::Written);
        }
        let stats = w.finish("test").unwrap();
        assert!(stats.rotations >= 3, "{stats:?}");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["run.lpr", "run.lpr.1", "run.lpr.2"]);
        // Each file opens on its own and ends where the next begins.
        let newest = Recording::open(&path).unwrap();
        let older = Recording::open(&dir.join("run.lpr.1")).unwrap();
        assert_eq!(older.end.as_deref(), Some("rotated"));
        assert_eq!(newest.snapshot(newest.len() - 1), snaps[299]);
        assert_eq!(older.snapshot(older.len() - 1), snaps[299 - newest.len()]);
        for name in &names {
            assert!(std::fs::metadata(dir.join(name)).unwrap().len() < 4000);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn max_size_stops_before_the_limit() {
        let dir = std::env::temp_dir().join(format!("latprof-maxsize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.lpr");
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let options = Options {
            max_size: Some(3000),
            ..Options::default()
        };
        let mut w = Writer::create(&path, info(), options).unwrap();
        let mut written = 0;
        for s in &snapshots(300) {
            if w.append(s, &syms).unwrap() == writer::Appended::Full {
                break;
            }
            written += 1;
        }
        w.finish("size limit").unwrap();
        assert!(written > 10 && written < 300, "{written}");
        assert!(std::fs::metadata(&path).unwrap().len() <= 3000);
        let r = Recording::open(&path).unwrap();
        assert_eq!(r.len(), written);
        assert_eq!(r.end.as_deref(), Some("size limit"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The reader against arbitrary bytes and against real recordings with bytes flipped, cut,
/// inserted or removed: it returns an error or what is intact, never panics, and every
/// snapshot it offers can be rebuilt.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::{MAGIC, VERSION, reader::Recording, tests, writer::Options};

    fn exercise(bytes: Vec<u8>) {
        if let Ok(r) = Recording::from_bytes(bytes) {
            assert!(!r.is_empty());
            for i in 0..r.len() {
                let _ = r.snapshot(i);
            }
            let _ = r.find("+1s");
            let _ = r.find("12:00");
        }
    }

    fn recording() -> &'static [u8] {
        static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        BYTES.get_or_init(|| tests::record(&tests::snapshots(70), Options::default()))
    }

    fn plain_recording() -> &'static [u8] {
        static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        BYTES.get_or_init(|| {
            tests::record(
                &tests::snapshots(20),
                Options {
                    compress: false,
                    ..Options::default()
                },
            )
        })
    }

    #[derive(Clone, Debug)]
    enum Edit {
        Flip(usize, u8),
        Cut(usize),
        Insert(usize, Vec<u8>),
        Remove(usize, usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), 1..=255u8).prop_map(|(at, bits)| Edit::Flip(at, bits)),
            any::<usize>().prop_map(Edit::Cut),
            (
                any::<usize>(),
                proptest::collection::vec(any::<u8>(), 1..64)
            )
                .prop_map(|(at, b)| Edit::Insert(at, b)),
            (any::<usize>(), 1..200usize).prop_map(|(at, n)| Edit::Remove(at, n)),
        ]
    }

    fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
        for e in edits {
            let len = bytes.len().max(1);
            match e {
                Edit::Flip(at, bits) => {
                    if let Some(b) = bytes.get_mut(at % len) {
                        *b ^= bits;
                    }
                }
                Edit::Cut(at) => bytes.truncate(at % len),
                Edit::Insert(at, b) => {
                    let at = at % len.min(bytes.len() + 1);
                    bytes.splice(at..at, b.iter().copied());
                }
                Edit::Remove(at, n) => {
                    let at = (at % len).min(bytes.len());
                    let end = (at + n).min(bytes.len());
                    bytes.drain(at..end);
                }
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes(tail in proptest::collection::vec(any::<u8>(), 0..4096), header in any::<bool>()) {
            let mut bytes = Vec::new();
            if header {
                bytes.extend_from_slice(&MAGIC);
                bytes.extend_from_slice(&VERSION.to_le_bytes());
                bytes.extend_from_slice(&[0, 0]);
            }
            bytes.extend_from_slice(&tail);
            exercise(bytes);
        }

        #[test]
        fn mutated_recordings(edits in proptest::collection::vec(edit(), 1..6)) {
            exercise(apply(recording().to_vec(), &edits));
        }

        #[test]
        fn checksummed_garbage_frames(
            frames in proptest::collection::vec(
                (1..=4u8, proptest::collection::vec(any::<u8>(), 0..512), any::<bool>()),
                1..8,
            ),
        ) {
            // Frames with valid checksums but arbitrary contents, after a real recording.
            let mut bytes = plain_recording().to_vec();
            for (kind, payload, compress) in &frames {
                bytes.extend_from_slice(&super::writer::frame(*kind, payload, *compress));
            }
            exercise(bytes);
        }

        #[test]
        fn mutated_uncompressed_recordings(edits in proptest::collection::vec(edit(), 1..6)) {
            // Without compression a flipped byte lands in the encoded snapshot itself.
            exercise(apply(plain_recording().to_vec(), &edits));
        }
    }
}

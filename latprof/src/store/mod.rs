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
    COUNTER_COUNT, CgroupCause, GlobalRecord, HIST_BUCKETS, Histogram, LatencyRecord, STACK_FRAMES,
    TICK_COUNTER_COUNT, USER_FRAMES, USER_WINDOW, WakerKey,
};

use crate::{
    cgroups::CgroupPath,
    collect::{Counters, Snapshot, TaskSnapshot, TickCounts, Waker},
    probe::Mode,
    ustacks::UserFrame,
};
use codec::{Dec, Enc};

pub const MAGIC: [u8; 8] = *b"\x7fLATPROF";
/// The version this latprof writes; it reads every version from 1 to this one.
/// Version 2 added the per-CPU tick counters and the kernel's tick facts; 3 the programs'
/// variant; 4 which task records stay out of the global table (`TaskSnapshot::task_only`); 5
/// cgroups: each task record's cgroup id, the per-cgroup table and the cgroups' paths; 6 the
/// wakers (the waker table, and each spike's waker); 7 user backtraces (`--user-stacks`): each
/// record id's user backtrace and each user backtrace's frames as named at record time.
pub const VERSION: u16 = 7;
pub const FILE_HEADER_LEN: usize = 12;
pub const SYNC: [u8; 4] = *b"LPF\x1e";
/// Sync mark, length, kind, flags, decoded length, CRC.
pub const FRAME_HEADER_LEN: usize = 4 + 4 + 1 + 1 + 4 + 4;
/// No frame decodes to more than this; larger lengths are damage, not data.
pub const MAX_FRAME: usize = 256 << 20;
/// Frames of a user backtrace as latprof names them: the walk's, the callers of a frameless
/// leaf found in the stack words kept, and `[truncated]`. A longer one is damage (or made by
/// hand), and every view would name each of its frames for every cause that shares it.
pub const MAX_USER_FRAMES: usize = USER_FRAMES + USER_WINDOW + 1;
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
    #[error("decodes to more than latprof writes or than this file's size allows")]
    TooBig,
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
    /// Sleeps were attributed to their wakers, and with their backtraces (version 6 on).
    pub wakers: bool,
    pub waker_stacks: bool,
    /// Causes were keyed by kernel and user backtrace (`--user-stacks`; version 7 on).
    pub user_stacks: bool,
    #[serde(skip)]
    pub sched_text: Range<u64>,
    #[serde(skip)]
    pub lock_text: Range<u64>,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's serialize_with passes a reference"
)]
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
        for _ in 0..d.len(1, size_of::<u32>())? {
            f.nohz_full_cpus.push(d.u32()?);
        }
        for _ in 0..d.len(2, size_of::<(String, bool)>())? {
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
        for _ in 0..d.len(1, size_of::<String>())? {
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
        if version >= 6 {
            e.bool(self.wakers);
            e.bool(self.waker_stacks);
        }
        if version >= 7 {
            e.bool(self.user_stacks);
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
            // latprof takes at most the kernel's 127 frames: a deeper one is no recording of
            // latprof's, and each view would name that many frames of every cause.
            stack_depth: u16::try_from(d.u32()?)
                .ok()
                .filter(|&depth| usize::from(depth) <= STACK_FRAMES)
                .ok_or(FormatError::Malformed("stack depth over 127 frames"))?,
            details: d.bool()?,
            sched_text: d.u64()?..d.u64()?,
            lock_text: d.u64()?..d.u64()?,
            kernel: crate::probe::KernelFacts::default(),
            spike_ns: u64::MAX,
            wakers: false,
            waker_stacks: false,
            user_stacks: false,
        };
        if version >= 2 {
            info.kernel = crate::probe::KernelFacts::decode(d)?;
            info.spike_ns = d.u64()?;
        }
        if version >= 3 {
            info.kernel.decode_programs(d)?;
        }
        if version >= 6 {
            info.wakers = d.bool()?;
            info.waker_stacks = d.bool()?;
        }
        if version >= 7 {
            info.user_stacks = d.bool()?;
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
    /// The per-cgroup table, as the global one (version 5 on).
    pub cgroup_gone: Vec<CgroupCause>,
    pub cgroups: Vec<(CgroupCause, GlobalRecord)>,
    /// The cgroups' paths and whether each was removed (version 5 on).
    pub paths_gone: Vec<u64>,
    pub paths: Vec<(u64, CgroupPath)>,
    /// The waker table, as the global one (version 6 on).
    pub wakers_gone: Vec<WakerKey>,
    pub wakers: Vec<Waker>,
    /// Record ids' user backtraces first seen here, as the kernel ones: (record id, user
    /// backtrace id) (version 7 on). A record id's user backtrace never changes.
    pub user_parts: Vec<(u64, u64)>,
    /// User backtraces first seen here, named at record time, innermost first (version 7 on):
    /// a replay opens no binary, so it needs neither root, the process nor its files.
    pub user_stacks: Vec<(u64, Vec<UserFrame>)>,
}

fn encode_waker_key(e: &mut Enc, k: &WakerKey) {
    e.u64(k.cause);
    e.u64(k.waker_stack);
    e.u32(k.sleeper_tgid);
    e.u32(k.kind);
    e.u32(k.waker_tgid);
    e.u32(k.waker_tid);
}

fn decode_waker_key(d: &mut Dec<'_>) -> Result<WakerKey, FormatError> {
    Ok(WakerKey {
        cause: d.u64()?,
        waker_stack: d.u64()?,
        sleeper_tgid: d.u32()?,
        kind: d.u32()?,
        waker_tgid: d.u32()?,
        waker_tid: d.u32()?,
    })
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
            if version >= 4 {
                e.u32(t.task_only);
            }
            e.usize(t.records.len());
            for r in &t.records {
                e.u64(r.stack_id);
                e.u64(r.count);
                e.u64(r.total_ns);
                e.u64(r.max_ns);
                if version >= 5 {
                    e.u64(r.cgroup);
                }
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
        if version >= 5 {
            e.usize(self.cgroup_gone.len());
            for k in &self.cgroup_gone {
                e.u64(k.cgroup);
                e.u64(k.stack_id);
            }
            e.usize(self.cgroups.len());
            for (k, r) in &self.cgroups {
                e.u64(k.cgroup);
                e.u64(k.stack_id);
                e.u64(r.count);
                e.u64(r.total_ns);
                e.u64(r.max_ns);
            }
            e.usize(self.paths_gone.len());
            for id in &self.paths_gone {
                e.u64(*id);
            }
            e.usize(self.paths.len());
            for (id, p) in &self.paths {
                e.u64(*id);
                e.bool(p.path.is_some());
                e.str(p.path.as_deref().unwrap_or_default());
                e.bool(p.removed);
            }
        }
        if version >= 6 {
            e.usize(self.wakers_gone.len());
            for k in &self.wakers_gone {
                encode_waker_key(e, k);
            }
            e.usize(self.wakers.len());
            for w in &self.wakers {
                encode_waker_key(e, &w.key);
                e.u64(w.count);
                e.u64(w.total_ns);
                e.u64(w.max_ns);
                e.str(&w.comm);
            }
        }
        if version >= 7 {
            self.encode_user(e);
        }
    }

    /// The user backtraces: the files they name once each (path and build id, which every
    /// frame in a file shares), then each frame as its name, file, offset and whether the
    /// name is a symbol's.
    fn encode_user(&self, e: &mut Enc) {
        let mut modules: Vec<(&str, &str)> = Vec::new();
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        for (_, frames) in &self.user_stacks {
            for f in frames {
                let key = (f.module.as_str(), f.build_id.as_str());
                index.entry(key).or_insert_with(|| {
                    modules.push(key);
                    modules.len() - 1
                });
            }
        }
        e.usize(modules.len());
        for (path, build_id) in &modules {
            e.str(path);
            e.str(build_id);
        }
        e.usize(self.user_parts.len());
        for (id, user) in &self.user_parts {
            e.u64(*id);
            e.u64(*user);
        }
        e.usize(self.user_stacks.len());
        for (id, frames) in &self.user_stacks {
            e.u64(*id);
            e.usize(frames.len());
            for f in frames {
                e.str(&f.name);
                e.usize(index[&(f.module.as_str(), f.build_id.as_str())]);
                e.u64(f.offset);
                e.bool(f.named);
            }
        }
    }

    fn decode_user(&mut self, d: &mut Dec<'_>) -> Result<(), FormatError> {
        let mut modules = Vec::new();
        for _ in 0..d.len(2, size_of::<(String, String)>())? {
            modules.push((d.str()?, d.str()?));
        }
        for _ in 0..d.len(2, size_of::<(u64, u64)>())? {
            self.user_parts.push((d.u64()?, d.u64()?));
        }
        for _ in 0..d.len(2, size_of::<(u64, Vec<UserFrame>)>())? {
            let id = d.u64()?;
            let n = d.len(4, size_of::<UserFrame>())?;
            if n > MAX_USER_FRAMES {
                return Err(FormatError::Malformed(
                    "a user backtrace longer than latprof takes",
                ));
            }
            let mut frames = Vec::with_capacity(n);
            for _ in 0..n {
                let name = d.str()?;
                let (module, build_id): &(String, String) = usize::try_from(d.u64()?)
                    .ok()
                    .and_then(|i| modules.get(i))
                    .ok_or(FormatError::Malformed("user frame names no file"))?;
                // Each frame holds its own copy of the file's strings: charged, so that one
                // long path named by many frames cannot take more memory than the budget.
                d.charge((module.len() + build_id.len()) as u64)?;
                frames.push(UserFrame {
                    name,
                    module: module.clone(),
                    build_id: build_id.clone(),
                    offset: d.u64()?,
                    named: d.bool()?,
                });
            }
            self.user_stacks.push((id, frames));
        }
        Ok(())
    }

    /// Only the fields before the snapshot proper: times, new backtraces and symbols.
    pub fn decode_head(d: &mut Dec<'_>) -> Result<Self, FormatError> {
        let mut b = Self {
            taken_ns: d.u64()?,
            wall_ns: d.u64()?,
            ..Self::default()
        };
        for _ in 0..d.len(2, size_of::<(u64, Vec<u64>)>())? {
            let id = d.u64()?;
            let n = d.len(1, size_of::<u64>())?;
            if n > STACK_FRAMES {
                return Err(FormatError::Malformed(
                    "a backtrace longer than the kernel's 127 frames",
                ));
            }
            let mut frames = Vec::with_capacity(n);
            for _ in 0..n {
                frames.push(d.u64()?);
            }
            b.stacks.push((id, frames));
        }
        for _ in 0..d.len(2, size_of::<(u64, String)>())? {
            b.syms.push((d.u64()?, d.str()?));
        }
        Ok(b)
    }

    pub fn decode(d: &mut Dec<'_>, version: u16) -> Result<Self, FormatError> {
        let mut b = Self::decode_head(d)?;
        b.mode = decode_mode(d)?;
        b.skip_kthreads = d.bool()?;
        b.retries = d.u32()?;
        for _ in 0..d.len(1, size_of::<u64>())? {
            b.counters.push(d.u64()?);
        }
        for _ in 0..d.len(3, size_of::<(String, u64, u64)>())? {
            b.programs.push((d.str()?, d.u64()?, d.u64()?));
        }
        for _ in 0..d.len(1, size_of::<u32>())? {
            b.tasks_gone.push(d.u32()?);
        }
        for _ in 0..d.len(5, size_of::<TaskSnapshot>())? {
            let mut t = TaskSnapshot {
                tid: d.u32()?,
                tgid: d.u32()?,
                comm: d.str()?,
                kthread: d.bool()?,
                records: Vec::new(),
                task_only: if version >= 4 { d.u32()? } else { 0 },
            };
            for _ in 0..d.len(4, size_of::<LatencyRecord>())? {
                t.records.push(LatencyRecord {
                    stack_id: d.u64()?,
                    count: d.u64()?,
                    total_ns: d.u64()?,
                    max_ns: d.u64()?,
                    cgroup: if version >= 5 { d.u64()? } else { 0 },
                });
            }
            b.tasks.push(t);
        }
        for _ in 0..d.len(1, size_of::<u64>())? {
            b.global_gone.push(d.u64()?);
        }
        for _ in 0..d.len(4, size_of::<(u64, GlobalRecord)>())? {
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
        for _ in 0..d.len(1, size_of::<u64>())? {
            b.hist_gone.push(d.u64()?);
        }
        for _ in 0..d.len(1 + HIST_BUCKETS, size_of::<(u64, Histogram)>())? {
            let id = d.u64()?;
            let mut h = [0u32; HIST_BUCKETS];
            for n in &mut h {
                *n = d.u32()?;
            }
            b.histograms.push((id, h));
        }
        if version >= 2 {
            for _ in 0..d.len(1, size_of::<TickCounts>())? {
                let mut cpu: TickCounts = [0; TICK_COUNTER_COUNT as usize];
                // Counters past the ones this latprof knows are read and dropped.
                for i in 0..d.len(1, 0)? {
                    let v = d.u64()?;
                    if let Some(slot) = cpu.get_mut(i) {
                        *slot = v;
                    }
                }
                b.ticks.push(cpu);
            }
        }
        if version >= 5 {
            for _ in 0..d.len(2, size_of::<CgroupCause>())? {
                b.cgroup_gone.push(CgroupCause {
                    cgroup: d.u64()?,
                    stack_id: d.u64()?,
                });
            }
            for _ in 0..d.len(5, size_of::<(CgroupCause, GlobalRecord)>())? {
                let key = CgroupCause {
                    cgroup: d.u64()?,
                    stack_id: d.u64()?,
                };
                b.cgroups.push((
                    key,
                    GlobalRecord {
                        count: d.u64()?,
                        total_ns: d.u64()?,
                        max_ns: d.u64()?,
                    },
                ));
            }
            for _ in 0..d.len(1, size_of::<u64>())? {
                b.paths_gone.push(d.u64()?);
            }
            for _ in 0..d.len(4, size_of::<(u64, CgroupPath)>())? {
                let id = d.u64()?;
                let known = d.bool()?;
                let path = d.str()?;
                b.paths.push((
                    id,
                    CgroupPath {
                        path: known.then_some(path),
                        removed: d.bool()?,
                    },
                ));
            }
        }
        if version >= 6 {
            for _ in 0..d.len(6, size_of::<WakerKey>())? {
                b.wakers_gone.push(decode_waker_key(d)?);
            }
            for _ in 0..d.len(10, size_of::<Waker>())? {
                b.wakers.push(Waker {
                    key: decode_waker_key(d)?,
                    count: d.u64()?,
                    total_ns: d.u64()?,
                    max_ns: d.u64()?,
                    comm: d.str()?,
                });
            }
        }
        if version >= 7 {
            b.decode_user(d)?;
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
    cgroups: BTreeMap<CgroupCause, GlobalRecord>,
    paths: BTreeMap<u64, CgroupPath>,
    wakers: BTreeMap<WakerKey, Waker>,
    user_parts: HashMap<u64, u64>,
    user_stacks: HashMap<u64, Vec<UserFrame>>,
}

impl State {
    /// Applies a key frame (`key`: everything starts over) or a delta.
    pub fn apply(&mut self, body: Body, key: bool) {
        if key {
            *self = Self::default();
        }
        self.stacks.extend(body.stacks);
        self.user_parts.extend(body.user_parts);
        self.user_stacks.extend(body.user_stacks);
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
        for k in body.cgroup_gone {
            self.cgroups.remove(&k);
        }
        self.cgroups.extend(body.cgroups);
        for id in body.paths_gone {
            self.paths.remove(&id);
        }
        self.paths.extend(body.paths);
        for k in body.wakers_gone {
            self.wakers.remove(&k);
        }
        self.wakers
            .extend(body.wakers.into_iter().map(|w| (w.key, w)));
        let mut counters = Counters::default();
        for (slot, v) in counters.0.iter_mut().zip(body.counters) {
            *slot = v;
        }
        let tasks: Vec<TaskSnapshot> = self.tasks.values().cloned().collect();
        let global: Vec<(u64, GlobalRecord)> = self.global.iter().map(|(k, v)| (*k, *v)).collect();
        // The backtraces this snapshot names, as the collector hands them over.
        let mut stacks = BTreeMap::new();
        for id in crate::collect::stack_ids(&global, &tasks)
            .chain(self.cgroups.keys().map(|k| k.stack_id))
            .chain(self.wakers.keys().map(|k| k.cause))
            .chain(
                self.wakers
                    .keys()
                    .map(|k| k.waker_stack)
                    .filter(|&s| s != 0),
            )
        {
            if let Some(frames) = self.stacks.get(&id) {
                stacks.entry(id).or_insert_with(|| frames.clone());
            }
        }
        // Their user backtraces, as the collector hands them over.
        let user_parts: BTreeMap<u64, u64> = stacks
            .keys()
            .filter_map(|id| Some((*id, *self.user_parts.get(id)?)))
            .collect();
        // Each once: many records share one user backtrace (a copy per record took 1.3 GB
        // for a 5 KB file whose 10,000 causes share one long backtrace).
        let users: std::collections::BTreeSet<u64> = user_parts.values().copied().collect();
        let user_stacks = users
            .into_iter()
            .filter_map(|user| Some((user, self.user_stacks.get(&user)?.clone())))
            .collect();
        self.snap = Snapshot {
            mode: body.mode,
            skip_kthreads: body.skip_kthreads,
            tasks,
            global,
            cgroups: self.cgroups.iter().map(|(k, v)| (*k, *v)).collect(),
            cgroup_paths: self.paths.clone(),
            counters,
            stacks,
            retries: body.retries,
            histograms: self.histograms.clone(),
            // Recordings keep the histograms summed over cgroups.
            cgroup_histograms: BTreeMap::new(),
            // Live only (serve's state label).
            uninterruptible: std::collections::BTreeSet::new(),
            programs: body.programs,
            taken_ns: body.taken_ns,
            wall_ns: body.wall_ns,
            ticks: body.ticks,
            // Live only: which task hid switches names it for the live warning.
            hidden_tids: Vec::new(),
            // Live only: checked while recording, said in its warnings.
            hidden: crate::collect::HiddenSleeps::default(),
            user_parts,
            user_stacks,
            wakers: self.wakers.values().cloned().collect(),
            unsettled: false,
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

/// Every varint and every little-endian u64 at every offset of every frame of a recording,
/// decoded: what a test checks for kernel addresses a shared file must not give away.
#[must_use]
pub fn numbers_in(bytes: &[u8]) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    while pos + FRAME_HEADER_LEN <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().ok()?) as usize;
        let raw_len = u32::from_le_bytes(bytes[pos + 10..pos + 14].try_into().ok()?) as usize;
        let stored = bytes.get(pos + FRAME_HEADER_LEN..pos + FRAME_HEADER_LEN + len)?;
        let payload = if bytes[pos + 9] & FLAG_ZSTD != 0 {
            zstd::bulk::decompress(stored, raw_len).ok()?
        } else {
            stored.to_vec()
        };
        for at in 0..payload.len() {
            if let Ok(v) = Dec::new(&payload[at..]).u64() {
                out.push(v);
            }
            if let Some(b) = payload.get(at..at + 8) {
                out.push(u64::from_le_bytes(b.try_into().ok()?));
            }
        }
        pos += FRAME_HEADER_LEN + len;
    }
    Some(out)
}

/// Counters the recording knows; a later latprof with more counters still reads the first ones.
#[must_use]
pub fn counter_values(c: &Counters) -> Vec<u64> {
    c.0[..COUNTER_COUNT as usize].to_vec()
}

#[cfg(test)]
pub(crate) mod tests;

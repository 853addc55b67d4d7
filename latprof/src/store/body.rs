//! A frame's body: one snapshot (a key frame's whole, a delta's changes) as bytes, apart from
//! the framing around it (`writer.rs`, `reader.rs`).

use std::collections::HashMap;

use latprof_common::{
    CgroupCause, GlobalRecord, HIST_BUCKETS, Histogram, LatencyRecord, STACK_FRAMES,
    TICK_COUNTER_COUNT, WakerKey,
};

use super::{
    FormatError, MAX_USER_FRAMES,
    codec::{Dec, Enc},
    info::{decode_mode, encode_mode},
};
use crate::{
    cgroups::CgroupPath,
    collect::{ExitKey, TaskSnapshot, TickCounts, Waker},
    probe::Mode,
    ustacks::UserFrame,
};

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
    /// The exited tasks' sums by process, thread name, cgroup and cause, as the global table
    /// (version 9 on).
    pub exited_gone: Vec<ExitKey>,
    pub exited: Vec<(ExitKey, GlobalRecord)>,
    /// The chain table, as the waker table (version 10 on; `chains.rs`).
    pub chains_gone: Vec<latprof_common::ChainKey>,
    pub chains: Vec<crate::collect::Chain>,
}

/// A thread's name as the kernel holds it (at most 16 bytes, zeros after its end).
fn comm_bytes(name: &str) -> [u8; 16] {
    let mut comm = [0u8; 16];
    let n = name.len().min(16);
    comm[..n].copy_from_slice(&name.as_bytes()[..n]);
    comm
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
            self.encode_cgroups(e);
        }
        if version >= 6 {
            self.encode_wakers(e);
        }
        if version >= 7 {
            self.encode_user(e, version);
        }
        if version >= 9 {
            self.encode_exited(e);
        }
        if version >= 10 {
            self.encode_chains(e);
        }
    }

    /// The exited tasks' sums (version 9 on).
    fn encode_exited(&self, e: &mut Enc) {
        let key = |e: &mut Enc, k: &ExitKey| {
            e.u32(k.tgid);
            e.str(&k.thread_name());
            e.u64(k.cgroup);
            e.u64(k.stack_id);
        };
        e.usize(self.exited_gone.len());
        for k in &self.exited_gone {
            key(e, k);
        }
        e.usize(self.exited.len());
        for (k, r) in &self.exited {
            key(e, k);
            e.u64(r.count);
            e.u64(r.total_ns);
            e.u64(r.max_ns);
        }
    }

    /// `encode_exited`'s.
    fn decode_exited(&mut self, d: &mut Dec<'_>) -> Result<(), FormatError> {
        let key = |d: &mut Dec<'_>| -> Result<ExitKey, FormatError> {
            Ok(ExitKey {
                tgid: d.u32()?,
                comm: comm_bytes(&d.str()?),
                cgroup: d.u64()?,
                stack_id: d.u64()?,
            })
        };
        for _ in 0..d.len(4, size_of::<ExitKey>())? {
            self.exited_gone.push(key(d)?);
        }
        for _ in 0..d.len(7, size_of::<(ExitKey, GlobalRecord)>())? {
            let k = key(d)?;
            self.exited.push((
                k,
                GlobalRecord {
                    count: d.u64()?,
                    total_ns: d.u64()?,
                    max_ns: d.u64()?,
                },
            ));
        }
        Ok(())
    }

    /// The user backtraces: the files they name once each (path and build id, which every
    /// frame in a file shares), then each frame as its name, file, offset and whether the
    /// name is a symbol's.
    fn encode_user(&self, e: &mut Enc, version: u16) {
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
                if version >= 9 {
                    e.u32(f.start_line);
                }
            }
        }
    }

    fn decode_user(&mut self, d: &mut Dec<'_>, version: u16) -> Result<(), FormatError> {
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
                    start_line: if version >= 9 { d.u32()? } else { 0 },
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
            b.decode_cgroups(d)?;
        }
        if version >= 6 {
            b.decode_wakers(d)?;
        }
        if version >= 7 {
            b.decode_user(d, version)?;
        }
        if version >= 9 {
            b.decode_exited(d)?;
        }
        if version >= 10 {
            b.decode_chains(d)?;
        }
        Ok(b)
    }

    /// The per-cgroup table and the cgroups' paths (version 5 on).
    fn encode_cgroups(&self, e: &mut Enc) {
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

    /// The waker table (version 6 on).
    fn encode_wakers(&self, e: &mut Enc) {
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

    /// `encode_cgroups`'s.
    fn decode_cgroups(&mut self, d: &mut Dec<'_>) -> Result<(), FormatError> {
        for _ in 0..d.len(2, size_of::<CgroupCause>())? {
            self.cgroup_gone.push(CgroupCause {
                cgroup: d.u64()?,
                stack_id: d.u64()?,
            });
        }
        for _ in 0..d.len(5, size_of::<(CgroupCause, GlobalRecord)>())? {
            let key = CgroupCause {
                cgroup: d.u64()?,
                stack_id: d.u64()?,
            };
            self.cgroups.push((
                key,
                GlobalRecord {
                    count: d.u64()?,
                    total_ns: d.u64()?,
                    max_ns: d.u64()?,
                },
            ));
        }
        for _ in 0..d.len(1, size_of::<u64>())? {
            self.paths_gone.push(d.u64()?);
        }
        for _ in 0..d.len(4, size_of::<(u64, CgroupPath)>())? {
            let id = d.u64()?;
            let known = d.bool()?;
            let path = d.str()?;
            self.paths.push((
                id,
                CgroupPath {
                    path: known.then_some(path),
                    removed: d.bool()?,
                },
            ));
        }
        Ok(())
    }

    /// `encode_wakers`'s.
    fn decode_wakers(&mut self, d: &mut Dec<'_>) -> Result<(), FormatError> {
        for _ in 0..d.len(6, size_of::<WakerKey>())? {
            self.wakers_gone.push(decode_waker_key(d)?);
        }
        for _ in 0..d.len(10, size_of::<Waker>())? {
            self.wakers.push(Waker {
                key: decode_waker_key(d)?,
                count: d.u64()?,
                total_ns: d.u64()?,
                max_ns: d.u64()?,
                comm: d.str()?,
            });
        }
        Ok(())
    }
}

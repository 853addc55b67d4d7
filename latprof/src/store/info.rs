//! A recording's facts (`RecordingInfo`): the machine, the run and the kernel's tick facts, in
//! every key frame.

use std::ops::Range;

use latprof_common::STACK_FRAMES;

use super::{
    FormatError,
    codec::{Dec, Enc},
};
use crate::probe::Mode;

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
    /// Wait chains were kept (`--chains`; version 10 on).
    pub chains: bool,
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
    pub(super) fn encode(&self, e: &mut Enc, version: u16) {
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
        if version >= 8 {
            e.str(self.kernel.build_id.as_deref().unwrap_or(""));
        }
        if version >= 10 {
            e.bool(self.chains);
        }
    }

    pub(super) fn decode(d: &mut Dec<'_>, version: u16) -> Result<Self, FormatError> {
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
            chains: false,
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
        if version >= 8 {
            let id = d.str()?;
            info.kernel.build_id = (!id.is_empty()).then_some(id);
        }
        if version >= 10 {
            info.chains = d.bool()?;
        }
        Ok(info)
    }
}

pub(super) fn encode_mode(e: &mut Enc, mode: Mode) {
    e.u64(match mode {
        Mode::Lazy => 0,
        Mode::Normal => 1,
    });
}

pub(super) fn decode_mode(d: &mut Dec<'_>) -> Result<Mode, FormatError> {
    match d.u64()? {
        0 => Ok(Mode::Lazy),
        1 => Ok(Mode::Normal),
        _ => Err(FormatError::Malformed("unknown mode")),
    }
}

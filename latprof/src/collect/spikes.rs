//! Spikes: single sleeps and run-queue waits over `--spike`, streamed from the kernel through a
//! ring buffer; the value type and the reader. The reader tells the kernel when it is about to
//! sleep (the `READER` flag); with the adaptive policy the kernel wakes it only then, or when
//! the buffer fills, which is the kernel tracing fix's `waitqueue_active()` check applied to
//! latprof's own pipeline. A bounded poll timeout is the safety net for an event that raced
//! with the flag.
use std::{os::fd::AsRawFd as _, time::Duration};

use anyhow::{Context as _, Result};
use aya::maps::{Array, MapData, RingBuf};
use latprof_common::{
    SPIKE_RUNQ, SPIKE_SLEEP_INTERRUPTIBLE, SPIKE_SLEEP_UNINTERRUPTIBLE, SpikeEvent,
};

use crate::probe::{Probe, Wakeup, names};

/// One spike as user space keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spike {
    /// CLOCK_MONOTONIC when it ended (the clock of snapshots' `taken_ns`).
    pub end_ns: u64,
    pub duration_ns: u64,
    pub stack_id: u64,
    pub tid: u32,
    pub tgid: u32,
    pub cpu: u32,
    /// `SPIKE_*`.
    pub kind: u32,
    pub comm: String,
    /// Who ended it: `WAKER_*` (`WAKER_UNSEEN` for a run-queue wait, or a recording from
    /// before wakers), and the waking task for `WAKER_TASK`.
    pub waker_kind: u32,
    pub waker_tgid: u32,
    pub waker_tid: u32,
    pub waker_comm: String,
}

impl Spike {
    #[must_use]
    pub fn from_event(e: &SpikeEvent) -> Self {
        Self {
            end_ns: e.end_ns,
            duration_ns: e.duration_ns,
            stack_id: e.stack_id,
            tid: e.tid,
            tgid: e.tgid,
            cpu: e.cpu,
            kind: e.kind,
            comm: super::comm_str(&e.comm),
            waker_kind: e.waker_kind,
            waker_tgid: e.waker_tgid,
            waker_tid: e.waker_tid,
            waker_comm: super::comm_str(&e.waker_comm),
        }
    }

    /// Who ended it, as one word: `comm[pid]` for a task (spaces in the name as `_`), the
    /// interrupt's kind (`timer`, `hardirq`, `softirq`, `nmi`), `-` where none was seen (and
    /// for run-queue waits, which no one wakes).
    #[must_use]
    pub fn waker_word(&self) -> String {
        match self.waker_kind {
            latprof_common::WAKER_TASK => {
                format!("{}[{}]", self.waker_comm.replace(' ', "_"), self.waker_tgid)
            }
            latprof_common::WAKER_UNSEEN => "-".to_owned(),
            kind => latprof_common::waker_kind_name(kind).to_owned(),
        }
    }

    /// `S` (interruptible sleep), `D` (uninterruptible), `R` (waiting for a CPU).
    #[must_use]
    pub fn kind_letter(&self) -> &'static str {
        match self.kind {
            SPIKE_SLEEP_INTERRUPTIBLE => "S",
            SPIKE_SLEEP_UNINTERRUPTIBLE => "D",
            SPIKE_RUNQ => "R",
            _ => "?",
        }
    }
}

/// The user side of the spike ring buffer.
pub struct SpikeReader {
    ring: RingBuf<MapData>,
    reader: Array<MapData, u64>,
    adaptive: bool,
    /// Times the reader went to sleep in poll.
    pub sleeps: u64,
}

impl SpikeReader {
    /// Takes the ring buffer and the reader flag out of the probe.
    pub fn take(probe: &mut Probe) -> Result<Self> {
        let adaptive = probe.config().wakeup == Wakeup::Adaptive;
        let ebpf = probe.ebpf_mut();
        let ring = RingBuf::try_from(ebpf.take_map(names::MAP_SPIKES).context("no SPIKES map")?)
            .context("SPIKES is not a ring buffer")?;
        let reader = Array::try_from(ebpf.take_map(names::MAP_READER).context("no READER map")?)
            .context("READER is not an array")?;
        Ok(Self {
            ring,
            reader,
            adaptive,
            sleeps: 0,
        })
    }

    fn drain(&mut self, out: &mut Vec<Spike>) {
        while let Some(item) = self.ring.next() {
            if item.len() >= size_of::<SpikeEvent>() {
                // SAFETY: the kernel wrote a SpikeEvent (repr(C), plain integers) here.
                let e: SpikeEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                out.push(Spike::from_event(&e));
            }
        }
    }

    fn set_waiting(&mut self, waiting: bool) -> Result<()> {
        if self.adaptive {
            self.reader
                .set(0, &u64::from(waiting), 0)
                .context("writing the READER flag")?;
        }
        Ok(())
    }

    /// Appends the spikes that are there; when there are none, says it is about to sleep and
    /// sleeps in poll until a wakeup or `timeout`. An event that came between the last look
    /// and the flag needs no second look: the ring buffer's poll returns at once while data
    /// is pending. So every raised flag is one poll (`sleeps`), and the kernel, which takes
    /// the flag with a compare-and-swap, sends at most one wakeup for it.
    pub fn read(&mut self, timeout: Duration, out: &mut Vec<Spike>) -> Result<()> {
        let before = out.len();
        self.drain(out);
        if out.len() > before {
            return Ok(());
        }
        self.set_waiting(true)?;
        let mut fd = libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        self.sleeps += 1;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&raw mut fd, 1, ms) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                self.set_waiting(false)?;
                return Err(err).context("poll on the spike ring buffer");
            }
        }
        self.set_waiting(false)?;
        self.drain(out);
        Ok(())
    }
}

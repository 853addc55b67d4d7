//! Spikes: single sleeps and run-queue waits over `--spike`, streamed from the kernel through a
//! ring buffer. The reader tells the kernel when it is about to sleep (the `READER` flag);
//! with the adaptive policy the kernel wakes it only then, or when the buffer fills, which is
//! the kernel tracing fix's `waitqueue_active()` check applied to latprof's own pipeline. A
//! bounded poll timeout is the safety net for an event that raced with the flag.
use std::{
    io::Write as _,
    os::fd::AsRawFd as _,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{Array, MapData, RingBuf};
use latprof_common::{
    NO_STACK, RUNQ_STACK, SPIKE_RUNQ, SPIKE_SLEEP_INTERRUPTIBLE, SPIKE_SLEEP_UNINTERRUPTIBLE,
    SpikeEvent,
};

use crate::{
    cli::{Cli, SpikesArgs},
    collect::{Collector, Snapshot, monotonic_ns},
    debuglog::DebugLog,
    duration,
    probe::{self, Probe, Wakeup, names},
    reasons::Reasons,
    symbols::Kallsyms,
};

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
            comm: crate::collect::comm_str(&e.comm),
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

    /// The spike's reason, from the backtraces a snapshot (or a recording) holds.
    #[must_use]
    pub fn reason(
        &self,
        stacks: &Snapshot,
        syms: &Kallsyms,
        reasons: &Reasons,
        depth: usize,
    ) -> String {
        reason_of(
            self.stack_id,
            stacks.stacks.get(&self.stack_id).map(Vec::as_slice),
            syms,
            reasons,
            depth,
        )
    }
}

/// The reason of a stack id given its raw frames (if known).
#[must_use]
pub fn reason_of(
    stack_id: u64,
    raw: Option<&[u64]>,
    syms: &Kallsyms,
    reasons: &Reasons,
    depth: usize,
) -> String {
    if stack_id == RUNQ_STACK {
        return "Waiting for CPU".to_owned();
    }
    let frames = raw
        .filter(|_| stack_id != NO_STACK)
        .map(|raw| syms.cause_frames(raw, depth))
        .unwrap_or_default();
    if frames.is_empty() {
        crate::model::UNAVAILABLE.to_owned()
    } else {
        reasons.reason(&frames)
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

/// The wall-clock time (ns since the epoch) of a CLOCK_MONOTONIC time, given a (wall,
/// monotonic) pair read together (live, or a snapshot's `wall_ns` and `taken_ns`).
#[must_use]
pub fn wall_ns(mono_ns: u64, clock: (u64, u64)) -> u64 {
    let (wall_now, mono_now) = clock;
    u64::try_from(i128::from(wall_now) + i128::from(mono_ns) - i128::from(mono_now)).unwrap_or(0)
}

/// `12:03:10.123456` local time of a monotonic time, given (wall, monotonic) read together.
#[must_use]
pub fn wall_time(end_ns: u64, clock: (u64, u64)) -> String {
    let wall = wall_ns(end_ns, clock);
    format!(
        "{}.{:06}",
        crate::clock::local_hms(wall),
        (wall / 1000) % 1_000_000
    )
}

/// One line: time, pid, tid, comm, kind, duration, cpu, reason.
#[must_use]
pub fn line(s: &Spike, time: &str, reason: &str) -> String {
    format!(
        "{time} {:>7} {:>7} {:<16} {} {:>10} cpu{:<3} {reason}",
        s.tgid,
        s.tid,
        s.comm,
        s.kind_letter(),
        crate::tui::ui::fmt_ns(s.duration_ns),
        s.cpu
    )
}

pub const HEADER: &str =
    "TIME                PID     TID COMM             K   DURATION CPU    REASON";

pub fn run(cli: &Cli, args: &SpikesArgs) -> Result<()> {
    probe::check_privileges()?;
    if let Some(pid) = args.pid
        && std::fs::metadata(format!("/proc/{pid}")).is_err()
    {
        bail!("no process with pid {pid}");
    }
    let stop = crate::stats::stop_flag()?;
    let syms = Kallsyms::load()?;
    let reasons = Reasons::builtin();
    let mut probe = Probe::attach(cli.probe_config(args.pid, false, true))?;
    let mut reader = SpikeReader::take(&mut probe)?;
    let mut log = DebugLog::start(&mut probe, cli, false)?;
    let mut collector = Collector::new();
    let mut reason_cache: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    eprintln!(
        "latprof: attached ({} mode); printing sleeps and run-queue waits of {} or more ({} wakeups), Ctrl-C to stop",
        cli.mode.as_str(),
        duration::format(cli.spike),
        match cli.wakeup {
            Wakeup::Adaptive => "adaptive",
            Wakeup::Always => "always",
        }
    );
    probe.announce();
    let clock = (crate::collect::wall_ns(), monotonic_ns());
    let depth = usize::from(cli.depth());
    let end = args.duration.map(|d| Instant::now() + d);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{HEADER}").context("writing to stdout")?;
    let mut total = 0u64;
    let mut spikes = Vec::new();
    let mut last_round = false;
    loop {
        let stopping = stop.load(Ordering::Relaxed) || end.is_some_and(|e| Instant::now() >= e);
        spikes.clear();
        // When stopping, one more look without sleeping: what came after the last read.
        let timeout = if stopping {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        reader.read(timeout, &mut spikes)?;
        log.flush();
        for s in &spikes {
            if !reason_cache.contains_key(&s.stack_id) {
                let raw = collector.stack(&probe, s.stack_id)?;
                let reason = reason_of(s.stack_id, raw.as_deref(), &syms, &reasons, depth);
                reason_cache.insert(s.stack_id, reason);
            }
            let reason = &reason_cache[&s.stack_id];
            writeln!(out, "{}", line(s, &wall_time(s.end_ns, clock), reason))
                .context("writing to stdout")?;
        }
        out.flush().context("writing to stdout")?;
        total += spikes.len() as u64;
        if last_round {
            break;
        }
        last_round = stopping;
    }
    let last = collector.snapshot(&probe)?;
    log.flush();
    let c = &last.counters;
    let (submitted, woken, suppressed, dropped) = c.spike_pipeline();
    eprintln!(
        "latprof: {total} spikes; submitted {submitted}, reader wakeups sent {woken}, suppressed {suppressed}, dropped {dropped}, reader sleeps {}",
        reader.sleeps
    );
    for loss in c.losses() {
        eprintln!("latprof: warning: {loss}");
    }
    Ok(())
}

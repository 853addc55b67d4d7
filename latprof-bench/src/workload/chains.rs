//! Workloads whose waits wait on each other (`--chains`' tests): each process measures its
//! own waits with CLOCK_MONOTONIC (the clock latprof's programs read) into memory the
//! processes share, and the first one reports the overlaps the chain views must show.
//! Between rounds the processes wait for each other by yielding, not sleeping, so that the
//! only sleeps are the measured ones (and the first process's reaping of the others).

use std::{
    io::{Read as _, Write as _},
    path::Path,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use latprof_common::RECENT_SLEEPS;

use super::{nanosleep, pipe, reap, set_name, spawn_child, voluntary_switches};

/// Rounds a chain workload runs at most (its shared memory holds each one's times).
pub const MAX_ROUNDS: u32 = 256;
const ROUNDS: usize = MAX_ROUNDS as usize;

/// One wait of a process in one round, `[start, end]` in CLOCK_MONOTONIC ns (0: it did not
/// sleep).
#[derive(Default)]
#[repr(C)]
struct Span([AtomicU64; 2]);

impl Span {
    fn set(&self, start: u64, end: u64) {
        self.0[0].store(start, Ordering::Relaxed);
        self.0[1].store(end, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }

    fn ns(&self) -> u64 {
        let (s, e) = self.get();
        e.saturating_sub(s)
    }
}

/// What the processes share (a `MAP_SHARED` mapping made before they fork).
#[repr(C)]
struct Shared {
    /// The futex word of the three-level workload's lock: 0 free, 1 held.
    lock: AtomicU32,
    /// The round the lock's holder has begun (the others go on it).
    round: AtomicU32,
    /// The last round the first process is done with.
    done: AtomicU32,
    /// Waits that slept, per process.
    slept: [AtomicU32; 3],
    /// Each process's measured wait per round.
    spans: [[Span; ROUNDS]; 3],
    /// Within its measured spans, per process: its time on a CPU and waiting for one (its
    /// schedstat), and its voluntary switches (each a sleep).
    ran_ns: [AtomicU64; 3],
    queued_ns: [AtomicU64; 3],
    sleeps: [AtomicU64; 3],
    /// `chain2`: the reader's voluntary switches before its read of the round it began.
    reader_switches: AtomicU64,
    /// `chain2`: the syncer's sleeps outside its measured spans, and their time (its
    /// schedstat).
    outside: [AtomicU64; 2],
    /// `chain2`: the rounds in which the syncer slept more often than the kernel keeps a
    /// waker's recent sleeps (`RECENT_SLEEPS`: the earlier ones count as it running), and
    /// their sleeps' time (its schedstat).
    crowded: [AtomicU64; 2],
}

/// This thread's time on a CPU and waiting for one so far, in ns. Its time on a CPU is its
/// CPU-time clock, which counts up to now: schedstat's first field leaves out the time since
/// the scheduler last updated it (a tick or a switch), so that a running thread reading it
/// looked asleep for up to a tick. Its wait for a CPU (schedstat's second field) is whole
/// while it runs: the scheduler adds each wait as the thread gets its CPU.
fn schedstat() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let queued = text
        .split_whitespace()
        .nth(1)
        .and_then(|w| w.parse::<u64>().ok())
        .unwrap_or(0);
    (clock_ns(libc::CLOCK_THREAD_CPUTIME_ID), queued)
}

/// The shared mapping, unmapped on drop (in each process that has it).
struct Mapping(*mut Shared);

impl Mapping {
    fn new() -> Result<Self> {
        // SAFETY: a fresh anonymous shared mapping, zero-filled: a valid `Shared` (atomics of
        // zero).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Shared>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap");
        }
        Ok(Self(p.cast()))
    }

    fn get(&self) -> &Shared {
        // SAFETY: mapped for our lifetime, only atomics in it.
        unsafe { &*self.0 }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our mapping, of this size.
        unsafe { libc::munmap(self.0.cast(), std::mem::size_of::<Shared>()) };
    }
}

/// A thread's clocks at a moment, or their growth over a span: CLOCK_MONOTONIC, its time on
/// a CPU and waiting for one (its schedstat), its voluntary switches (each a sleep).
#[derive(Default)]
struct Clocks {
    at: u64,
    ran: u64,
    queued: u64,
    sleeps: u64,
}

impl Clocks {
    fn now() -> Self {
        let (ran, queued) = schedstat();
        Self {
            at: now_ns(),
            ran,
            queued,
            sleeps: u64::try_from(voluntary_switches()).unwrap_or(0),
        }
    }

    /// The growth since `earlier`.
    fn since(&self, earlier: &Self) -> Self {
        Self {
            at: self.at.saturating_sub(earlier.at),
            ran: self.ran.saturating_sub(earlier.ran),
            queued: self.queued.saturating_sub(earlier.queued),
            sleeps: self.sleeps.saturating_sub(earlier.sleeps),
        }
    }

    fn add(&mut self, span: &Self) {
        self.at += span.at;
        self.ran += span.ran;
        self.queued += span.queued;
        self.sleeps += span.sleeps;
    }

    /// A span's time off a CPU and not waiting for one: asleep.
    fn slept(&self) -> u64 {
        self.at.saturating_sub(self.ran + self.queued)
    }
}

/// CLOCK_MONOTONIC now, in ns: the clock of `bpf_ktime_get_ns`.
fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Clock `clock` now, in ns.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: fills a valid timespec.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Waits without sleeping until `cond` holds.
fn spin_until(cond: impl Fn() -> bool) {
    while !cond() {
        // SAFETY: no arguments.
        unsafe { libc::sched_yield() };
    }
}

/// How long the spans overlap (all of them).
fn overlap(spans: &[(u64, u64)]) -> u64 {
    let start = spans.iter().map(|s| s.0).max().unwrap_or(0);
    let end = spans.iter().map(|s| s.1).min().unwrap_or(0);
    if spans.iter().any(|s| s.1 == 0) {
        return 0;
    }
    end.saturating_sub(start)
}

/// Process `pid`'s main thread's voluntary switches (its status): the kernel counts one as
/// the thread switches out to sleep, just before the switch.
fn switches_of(pid: libc::pid_t) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Whether process `pid`'s main thread sleeps (state S in its stat).
fn asleep(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.get(s.rfind(')')? + 2..)?.starts_with('S')))
        .unwrap_or(false)
}

fn check_rounds(count: u32) -> Result<usize> {
    if count == 0 || count > MAX_ROUNDS {
        bail!("--count must be 1 to {MAX_ROUNDS}");
    }
    Ok(count as usize)
}

/// `chain2`: this process (`chain-reader`) reads a pipe that a child (`chain-syncer`) writes
/// after writing 4 KiB to a file in `dir` and fsyncing it, `count` times. Reports the reads
/// that slept (`waited`), their time by the reader's clock (`wait_ns`), the fsyncs' time
/// (`fsync_ns`), how much of the reads' time the fsyncs overlapped (`overlap_ns`), how much
/// of the fsyncs' time the syncer slept (`fsync_slept_ns`: by its schedstat, less its time on
/// a CPU and waiting for one, `fsync_ran_ns` the first), its sleeps in them (`fsync_sleeps`),
/// its sleeps outside them and their time (`outside_sleeps`, `outside_slept_ns`), the rounds
/// in which it slept more than `RECENT_SLEEPS` times and their sleeps' time (`crowded_rounds`,
/// `crowded_slept_ns`) and the child's pid (`syncer`). Each fsync starts once the reader sleeps in its read. The
/// syncer lives until this process is done (with `--hold`, until its stdin closes).
pub(super) fn two_levels(count: u32, dir: &Path, finish: impl FnOnce(&str)) -> Result<()> {
    let rounds = check_rounds(count)?;
    let map = Mapping::new()?;
    let shared = map.get();
    let (mut data_r, mut data_w) = pipe()?;
    // The syncer stays until this end closes: alive when the work is done, its sleeps are its
    // process's own in a snapshot then (not merged into the global table at its exit).
    let (mut hold_r, mut hold_w) = pipe()?;
    let path = dir.join(format!("latprof-chain-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    let syncer = spawn_child(|| {
        set_name(c"chain-syncer");
        drop_quietly(&mut hold_w);
        let block = [0x5a_u8; 4096];
        // SAFETY: no arguments.
        let reader = unsafe { libc::getppid() };
        // Its whole life up to its last write, and the part of it in its spans: their
        // difference is its sleeps outside the spans (which may lie outside the reader's waits).
        let life = Clocks::now();
        let mut spans = Clocks::default();
        for r in 0..rounds {
            // Not before the reader has switched out to sleep in its read (its state says S
            // already before the switch, and a busy CPU may delay that): its wait then holds
            // the whole fsync.
            let round = u32::try_from(r + 1).unwrap_or(u32::MAX);
            spin_until(|| {
                shared.round.load(Ordering::Acquire) >= round
                    && switches_of(reader) > shared.reader_switches.load(Ordering::Relaxed)
                    && asleep(reader)
            });
            let before = Clocks::now();
            if file
                .write_all(&block)
                .and_then(|()| file.sync_all())
                .is_err()
            {
                return;
            }
            let span = Clocks::now().since(&before);
            shared.ran_ns[1].fetch_add(span.ran, Ordering::Relaxed);
            shared.queued_ns[1].fetch_add(span.queued, Ordering::Relaxed);
            shared.sleeps[1].fetch_add(span.sleeps, Ordering::Relaxed);
            if span.sleeps > RECENT_SLEEPS as u64 {
                shared.crowded[0].fetch_add(1, Ordering::Relaxed);
                shared.crowded[1].fetch_add(span.slept(), Ordering::Relaxed);
            }
            spans.add(&span);
            shared.spans[1][r].set(before.at, before.at + span.at);
            if data_w.write_all(&[1]).is_err() {
                return;
            }
        }
        let life = Clocks::now().since(&life);
        shared.outside[0].store(life.sleeps.saturating_sub(spans.sleeps), Ordering::Relaxed);
        let outside = life.slept().saturating_sub(spans.slept());
        shared.outside[1].store(outside, Ordering::Relaxed);
        let _ = hold_r.read(&mut [0u8; 1]);
    })?;
    drop(data_w);
    drop(hold_r);
    drop(file);
    set_name(c"chain-reader");
    let mut byte = [0u8; 1];
    let mut result = Ok(());
    for r in 0..rounds {
        let switches = voluntary_switches();
        shared
            .reader_switches
            .store(u64::try_from(switches).unwrap_or(0), Ordering::Relaxed);
        let t0 = now_ns();
        shared
            .round
            .store(u32::try_from(r + 1).unwrap_or(u32::MAX), Ordering::Release);
        if let Err(e) = data_r.read_exact(&mut byte) {
            result = Err(e).context("reading the syncer's pipe");
            break;
        }
        let t1 = now_ns();
        if voluntary_switches() > switches {
            shared.slept[0].fetch_add(1, Ordering::Relaxed);
            shared.spans[0][r].set(t0, t1);
        }
    }
    let release = |hold_w| {
        drop(hold_w);
        reap(syncer);
        let _ = std::fs::remove_file(&path);
    };
    if let Err(e) = result {
        release(hold_w);
        return Err(e);
    }
    let (mut wait, mut fsync, mut both) = (0, 0, 0);
    for r in 0..rounds {
        let (a, b) = (shared.spans[0][r].get(), shared.spans[1][r].get());
        wait += shared.spans[0][r].ns();
        fsync += shared.spans[1][r].ns();
        // A read waits for this round's fsync, which may have begun before it.
        both += overlap(&[a, b]);
    }
    // The syncer's sleeps within its fsyncs: their time less its time on a CPU and waiting
    // for one (its schedstat).
    let ran =
        shared.ran_ns[1].load(Ordering::Relaxed) + shared.queued_ns[1].load(Ordering::Relaxed);
    finish(&format!(
        " waited={} wait_ns={wait} fsync_ns={fsync} overlap_ns={both} syncer={syncer} fsync_slept_ns={} fsync_ran_ns={} fsync_sleeps={} outside_sleeps={} outside_slept_ns={} crowded_rounds={} crowded_slept_ns={}",
        shared.slept[0].load(Ordering::Relaxed),
        fsync.saturating_sub(ran),
        shared.ran_ns[1].load(Ordering::Relaxed),
        shared.sleeps[1].load(Ordering::Relaxed),
        shared.outside[0].load(Ordering::Relaxed),
        shared.outside[1].load(Ordering::Relaxed),
        shared.crowded[0].load(Ordering::Relaxed),
        shared.crowded[1].load(Ordering::Relaxed),
    ));
    release(hold_w);
    Ok(())
}

/// `chain3`, `count` rounds: a child `chain-b` takes a lock (a futex word the processes
/// share) and reads a pipe; this process (`chain-a`) then waits on the lock; a child `chain-c`
/// sleeps `interval` (nanosleep) and writes the pipe; `chain-b` releases the lock, which
/// wakes `chain-a`. Reports per process the waits that slept (`a_waited`: futex, `b_waited`:
/// pipe, `c_waited`: nanosleep) and their time by its clock (`a_ns`, `b_ns`, `c_ns`), how much
/// `chain-a`'s waits overlapped `chain-b`'s (`ab_ns`) and both `chain-c`'s (`abc_ns`), how
/// much `chain-b`'s overlapped `chain-c`'s (`bc_ns`), and the children's pids (`b`, `c`).
pub(super) fn three_levels(
    count: u32,
    interval: Duration,
    finish: impl FnOnce(&str),
) -> Result<()> {
    let rounds = check_rounds(count)?;
    let map = Mapping::new()?;
    let shared = map.get();
    let (mut pipe_r, mut pipe_w) = pipe()?;
    let b = spawn_child(|| {
        set_name(c"chain-b");
        drop_quietly(&mut pipe_w);
        let mut byte = [0u8; 1];
        for r in 0..rounds {
            let round = u32::try_from(r + 1).unwrap_or(u32::MAX);
            shared.lock.store(1, Ordering::Release);
            shared.round.store(round, Ordering::Release);
            let switches = voluntary_switches();
            let t0 = now_ns();
            if pipe_r.read_exact(&mut byte).is_err() {
                return;
            }
            let t1 = now_ns();
            if voluntary_switches() > switches {
                shared.slept[1].fetch_add(1, Ordering::Relaxed);
                shared.spans[1][r].set(t0, t1);
            }
            shared.lock.store(0, Ordering::Release);
            futex(&shared.lock, libc::FUTEX_WAKE, 1);
            spin_until(|| shared.done.load(Ordering::Acquire) >= round);
        }
    })?;
    let c = spawn_child(|| {
        set_name(c"chain-c");
        for r in 0..rounds {
            let round = u32::try_from(r + 1).unwrap_or(u32::MAX);
            spin_until(|| shared.round.load(Ordering::Acquire) >= round);
            let switches = voluntary_switches();
            let t0 = now_ns();
            nanosleep(interval);
            let t1 = now_ns();
            if voluntary_switches() > switches {
                shared.slept[2].fetch_add(1, Ordering::Relaxed);
                shared.spans[2][r].set(t0, t1);
            }
            if (&pipe_w).write_all(&[1]).is_err() {
                return;
            }
            spin_until(|| shared.done.load(Ordering::Acquire) >= round);
        }
    })?;
    drop(pipe_w);
    drop(pipe_r);
    set_name(c"chain-a");
    for r in 0..rounds {
        let round = u32::try_from(r + 1).unwrap_or(u32::MAX);
        spin_until(|| shared.round.load(Ordering::Acquire) >= round);
        let mut start = 0;
        while shared
            .lock
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            let switches = voluntary_switches();
            let t0 = now_ns();
            futex(&shared.lock, libc::FUTEX_WAIT, 1);
            let t1 = now_ns();
            if voluntary_switches() > switches {
                shared.slept[0].fetch_add(1, Ordering::Relaxed);
                if start == 0 {
                    start = t0;
                }
                shared.spans[0][r].set(start, t1);
            }
        }
        shared.lock.store(0, Ordering::Release);
        shared.done.store(round, Ordering::Release);
    }
    reap(b);
    reap(c);
    let mut sums = [0u64; 6];
    for r in 0..rounds {
        let [a, bb, cc] = [0, 1, 2].map(|p| shared.spans[p][r].get());
        sums[0] += shared.spans[0][r].ns();
        sums[1] += shared.spans[1][r].ns();
        sums[2] += shared.spans[2][r].ns();
        sums[3] += overlap(&[a, bb]);
        sums[4] += overlap(&[a, bb, cc]);
        sums[5] += overlap(&[bb, cc]);
    }
    let slept = |p: usize| shared.slept[p].load(Ordering::Relaxed);
    finish(&format!(
        " a_waited={} b_waited={} c_waited={} a_ns={} b_ns={} c_ns={} ab_ns={} abc_ns={} bc_ns={} b={b} c={c}",
        slept(0),
        slept(1),
        slept(2),
        sums[0],
        sums[1],
        sums[2],
        sums[3],
        sums[4],
        sums[5],
    ));
    Ok(())
}

/// Closes a child's copy of a pipe end it does not use (so that the reader sees the end of
/// the file once the writers are gone).
fn drop_quietly(file: &mut std::fs::File) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: the fd is ours; the child exits without dropping `file` again (`_exit`).
    unsafe { libc::close(file.as_raw_fd()) };
}

/// A futex operation on a word the processes share (not private: the mapping is shared).
fn futex(word: &AtomicU32, op: libc::c_int, val: u32) {
    // SAFETY: a live, aligned u32; a wait sleeps only while the word still holds `val`, and
    // its callers loop over any early return.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

//! The threads that name user frames. The capture thread reads each process's memory map
//! and opens its files when the kernel announces a user backtrace of it (`USER_SEEN`), while
//! the process still lives; the naming thread names backtraces when the collector asks, with
//! what the capture thread read (`capture::Processes`, shared under a lock). It owns the
//! symbolizer (not `Send`). Apart, a long naming (DWARF of a large binary) does not keep a
//! short-lived process from being read before it exits.

use std::{
    collections::HashMap,
    os::fd::AsRawFd as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use latprof_common::UserSeen;

use super::{Resolver, UserFrame, capture::Processes, tables::Tables};

/// A user backtrace to name, as the kernel kept it.
#[derive(Clone, Debug)]
pub struct Unnamed {
    pub id: u64,
    pub tgid: u32,
    /// The address space's layout (`layout_key`).
    pub layout: u64,
    pub frames: Vec<u64>,
    /// The stack pointer of frame `stepped - 1` and the stack words from it up (see `leaf`).
    pub sp: u64,
    pub window: Vec<u64>,
    /// The frames the kernel's unwind tables stepped through (1: none).
    pub stepped: usize,
}

impl Unnamed {
    /// User backtrace `id` as the kernel's table keeps it.
    #[must_use]
    pub fn of(id: u64, raw: &latprof_common::UserStack) -> Self {
        let nr = (raw.nr as usize).min(raw.frames.len());
        Self {
            id,
            tgid: raw.tgid,
            layout: raw.layout,
            frames: raw.frames[..nr].to_vec(),
            sp: raw.sp,
            window: raw.window.to_vec(),
            stepped: (raw.stepped as usize).clamp(1, nr.max(1)),
        }
    }
}

enum Request {
    /// Name these, answering by the deadline with those named by then.
    Name(Vec<Unnamed>, Instant, Sender<Vec<(u64, Vec<UserFrame>)>>),
    Stop,
}

/// The collector's side of the watcher.
#[derive(Debug)]
pub struct Watcher {
    requests: Sender<Request>,
    /// The naming thread and the capture thread.
    threads: Vec<JoinHandle<()>>,
    /// Tells the capture thread to end.
    stop: Arc<AtomicBool>,
    /// Disconnected when both threads ended.
    ended: Receiver<()>,
    /// Backtraces named that were cut short (`[truncated]`).
    truncated: Arc<AtomicU64>,
    /// What the capture side left out (binaries unparsed, perf maps stopped).
    tally: Arc<super::capture::Tally>,
}

/// How long reading the processes there are at the start may take, at most: the rest are read
/// when their first backtrace is announced.
const READ_AT_START_WITHIN: Duration = Duration::from_secs(3);

/// The processes there are (`/proc`'s numeric entries), but latprof itself; kernel threads
/// are left out by `process_layout` (no code).
#[must_use]
pub fn running_processes() -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tgid| tgid != me)
        .collect()
}

/// How often the capture thread looks whether it is to stop while no process is announced.
const TICK: Duration = Duration::from_millis(50);
/// How long a stop waits for the threads to end: they read files any user controls, and
/// whatever one of them does to a read (a blocking open, a huge file) must not keep latprof
/// from stopping. A thread that does not end by then is left behind, and ends with latprof.
const STOP_WITHIN: Duration = Duration::from_secs(1);

impl Watcher {
    /// Starts the threads on the `USER_SEEN` ring buffer.
    pub fn start(ring: RingBuf<MapData>, mut tables: Tables, traced: Vec<u32>) -> Result<Self> {
        let (requests, rx) = mpsc::channel();
        let (alive, ended) = mpsc::channel::<()>();
        let truncated = Arc::new(AtomicU64::new(0));
        let mut known = Processes::new();
        // The processes there are that are traced (`traced`: the one of `--pid`, those in the
        // cgroups of `--cgroup`, else all) are read now, before latprof says it is attached:
        // their sleeps step through their libc by the tables from then on. A process started
        // later is read when its first backtrace is announced (its sleeps before that are
        // walked by frame pointers only).
        let deadline = Instant::now() + READ_AT_START_WITHIN;
        let running = traced;
        for tgid in running {
            if Instant::now() >= deadline {
                break;
            }
            if let Some(layout) = super::capture::process_layout(tgid)
                && known.capture(tgid, layout)
                && let Some(view) = known.view((tgid, layout))
            {
                tables.install(layout, &view, &known.python_trampolines((tgid, layout)));
            }
        }
        let tally = known.tally();
        let processes = Arc::new(Mutex::new(known));
        tables.count_into(Arc::clone(&tally), Arc::clone(&processes));
        let stop = Arc::new(AtomicBool::new(false));
        let capture = {
            let (alive, processes, stop) =
                (alive.clone(), Arc::clone(&processes), Arc::clone(&stop));
            thread::Builder::new()
                .name("latprof-umaps".to_owned())
                .spawn(move || {
                    let _alive = alive;
                    capture(ring, &processes, &mut tables, &stop);
                })
                .context("starting the user stack capture thread")?
        };
        let count = Arc::clone(&truncated);
        let naming = thread::Builder::new()
            .name("latprof-ustacks".to_owned())
            .spawn(move || {
                let _alive = alive;
                name(Resolver::sharing(processes), &rx, &count);
            });
        let naming = match naming {
            Ok(thread) => thread,
            Err(err) => {
                stop.store(true, Ordering::Relaxed);
                return Err(err).context("starting the user stack thread");
            }
        };
        Ok(Self {
            requests,
            threads: vec![naming, capture],
            stop,
            ended,
            truncated,
            tally,
        })
    }

    /// Backtraces named so far that were cut short.
    #[must_use]
    pub fn truncated(&self) -> u64 {
        self.truncated.load(Ordering::Relaxed)
    }

    /// What the capture side left out so far: users' binaries unparsed, perf maps whose
    /// reading stopped short, files that got no unwind rows.
    #[must_use]
    pub fn left_out(&self) -> (u64, u64, u64) {
        (
            self.tally.unparsed.load(Ordering::Relaxed),
            self.tally.perf_stopped.load(Ordering::Relaxed),
            self.tally.unwind_full.load(Ordering::Relaxed),
        )
    }

    /// Names `stacks`, waiting at most `within`: those not named by then are left out (the
    /// thread goes on naming them, and answers at once when asked again).
    #[must_use]
    pub fn name(&self, stacks: Vec<Unnamed>, within: Duration) -> Vec<(u64, Vec<UserFrame>)> {
        if stacks.is_empty() {
            return Vec::new();
        }
        let (reply, answer) = mpsc::channel();
        let deadline = Instant::now() + within;
        if self
            .requests
            .send(Request::Name(stacks, deadline, reply))
            .is_err()
        {
            return Vec::new();
        }
        // A little after the deadline: the thread answers at it.
        answer
            .recv_timeout(within + Duration::from_millis(500))
            .unwrap_or_default()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.requests.send(Request::Stop);
        self.stop.store(true, Ordering::Relaxed);
        // Joined only once both ended (within `STOP_WITHIN`); otherwise left behind.
        if let Err(RecvTimeoutError::Disconnected) = self.ended.recv_timeout(STOP_WITHIN) {
            for thread in self.threads.drain(..) {
                let _ = thread.join();
            }
        }
    }
}

/// The capture thread: reads each announced process (`Processes::announced`) until `stop`.
fn capture(
    mut ring: RingBuf<MapData>,
    processes: &Mutex<Processes>,
    tables: &mut Tables,
    stop: &AtomicBool,
) {
    // The processes read whose tables are still to be given: after the ring is drained, so
    // that loading a new file's table never keeps a short-lived process from being read.
    let mut pending = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<UserSeen>() {
                // SAFETY: the kernel wrote a UserSeen (repr(C), plain integers) here.
                let e: UserSeen = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                drop(item);
                let view = {
                    let mut processes = processes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let key = (e.tgid, e.layout);
                    processes
                        .announced(e.tgid, e.layout)
                        .then(|| processes.view(key))
                        .flatten()
                        .map(|view| (view, processes.python_trampolines(key)))
                };
                if let Some((view, trampolines)) = view {
                    pending.push((e.layout, view, trampolines));
                }
            }
        }
        // Their next sleeps step through their libc by the tables.
        for (layout, view, trampolines) in pending.drain(..) {
            tables.install(layout, &view, &trampolines);
        }
        let mut fd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(TICK.as_millis()).unwrap_or(50);
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&raw mut fd, 1, ms) };
    }
}

/// The naming thread: answers the collector's requests until it stops.
fn name(mut resolver: Resolver, requests: &Receiver<Request>, truncated: &AtomicU64) {
    // Named after their request's deadline, kept for the next request.
    let mut late: HashMap<u64, Vec<UserFrame>> = HashMap::new();
    while let Ok(Request::Name(stacks, deadline, reply)) = requests.recv() {
        let mut named = Vec::with_capacity(stacks.len());
        let mut answer = Some(reply);
        for u in stacks {
            if let Some(frames) = late.remove(&u.id) {
                named.push((u.id, frames));
                continue;
            }
            // One announced while the ring was full, or not read yet: its map now, if it
            // lives.
            resolver.capture(u.tgid, u.layout);
            let frames = resolver.frames(u.tgid, u.layout, &u.frames, u.sp, &u.window, u.stepped);
            truncated.store(resolver.truncated(), Ordering::Relaxed);
            if answer.is_some() {
                named.push((u.id, frames));
            } else {
                late.insert(u.id, frames);
            }
            if Instant::now() >= deadline
                && let Some(reply) = answer.take()
            {
                let _ = reply.send(std::mem::take(&mut named));
            }
        }
        if let Some(reply) = answer {
            let _ = reply.send(named);
        }
    }
}

//! Deterministic workloads that latprof's tests and benchmarks spawn (`latprof-workload ...`).
use std::{
    fs::OpenOptions,
    io::{Read as _, Write as _},
    os::{
        fd::{FromRawFd as _, OwnedFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::PathBuf,
    sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use latprof::time;

mod chains;

#[derive(Debug, Parser)]
#[command(
    name = "latprof-workload",
    version,
    about = "Deterministic workloads for latprof's tests and benchmarks"
)]
pub struct WorkloadArgs {
    /// Wait for a line (or end of file) on stdin before starting.
    #[arg(long)]
    pub wait: bool,
    /// After the work, stay alive until end of file on stdin.
    #[arg(long)]
    pub hold: bool,
    #[command(subcommand)]
    pub kind: Workload,
}

#[derive(Debug, Subcommand)]
pub enum Workload {
    /// `count` nanosleeps of `interval`. Reports the longest and total call (`max_ns`,
    /// `total_ns`), the calls' sleeps (`slept`; `split`: those of calls that slept more than
    /// once) and every sleep from the first call to the last (`switched`).
    Sleep {
        #[arg(long, default_value_t = 200)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "2ms")]
        interval: Duration,
        /// Print the kernel's /proc/self/latency at the end (kernels with CONFIG_LATENCYTOP).
        #[arg(long)]
        print_proc_latency: bool,
    },
    /// Runs a command as a child and writes its resource use to `report`: its peak resident
    /// memory and CPU time, its exit code or signal. The child is forked from this small
    /// process, so its peak is its own (a child spawned by a test process inherits the test's
    /// peak through exec).
    Measure {
        #[arg(long)]
        report: PathBuf,
        #[arg(required = true, trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// `count` times: write 4 KiB to a file in `dir` and fsync it. Reports `slept=N`, every
    /// sleep from its start to `done` (its voluntary switches: the fsyncs' waits, and any of
    /// the file's creation, a write's or the file's removal).
    Fsync {
        #[arg(long, default_value_t = 50)]
        count: u32,
        #[arg(long)]
        dir: PathBuf,
    },
    /// `count` threads, each sleeping `interval` in a loop for `seconds`.
    Threads {
        #[arg(long, default_value_t = 1000)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "10ms")]
        interval: Duration,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Two threads (or processes) passing a byte over pipes `count` times.
    Pingpong {
        #[arg(long, default_value_t = 1000)]
        count: u32,
        #[arg(long)]
        processes: bool,
        /// Pin both sides to this CPU (every round trip is then two switches on it).
        #[arg(long)]
        cpu: Option<usize>,
        /// With --processes: the parent on CPU 0, the child on CPU 1, so that each side's
        /// read waits for the other CPU's answer (on one CPU, a side the other preempts can
        /// find its answer already there and never wait).
        #[arg(long, requires = "processes", conflicts_with = "cpu")]
        apart: bool,
        /// With --processes: name the parent `ping` and the child `pong` (their comm), so
        /// that each side's waker is told apart by name.
        #[arg(long, requires = "processes")]
        named: bool,
        /// Print the parent's own call chain where it reads (std's backtrace, taken in the
        /// function that reads, one function a line after `stack:`), before `done`: what a
        /// profiler must show above the read.
        #[arg(long)]
        print_stack: bool,
    },
    /// `count` children that each start a direct read of a file in `dir` with Linux AIO and
    /// exit at once: the kernel waits for the read in exit_aio, after the child gave up its
    /// memory map (a sleep latencytop counts for the task but not in the global table).
    ExitAio {
        #[arg(long, default_value_t = 20)]
        count: u32,
        #[arg(long)]
        dir: PathBuf,
        /// The children do not sleep before they exit: latprof first sees each of them
        /// already exiting, in exit_aio.
        #[arg(long)]
        no_first_sleep: bool,
    },
    /// `count` short-lived children, each sleeping `sleep` once before it exits.
    Forks {
        #[arg(long, default_value_t = 1000)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "50us")]
        sleep: Duration,
    },
    /// Two threads: one waits on a futex word, the other sleeps `interval` and wakes it, `count`
    /// times. Reports `waited=N`, the waits that slept (each ended by the other thread).
    Futex {
        #[arg(long, default_value_t = 100)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "1ms")]
        interval: Duration,
        /// Pin both threads to this CPU (each wakeup then stays on it).
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// `threads` threads taking one std Mutex `count` times each: each holds it asleep for
    /// `hold`, then sleeps half as long without it, so the others find it taken and wait on its
    /// futex for about half of `hold`.
    Mutex {
        #[arg(long, default_value_t = 2)]
        threads: u32,
        #[arg(long, default_value_t = 50)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "2ms")]
        hold: Duration,
        /// Pin every thread to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// `count` ppoll and `count` select calls on no descriptor, each waiting for its `timeout`.
    Poll {
        #[arg(long, default_value_t = 50)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "1ms")]
        timeout: Duration,
    },
    /// A Unix stream and a Unix datagram socket pair, each with a thread that reads a byte and
    /// one that sleeps `interval` and sends it, `count` times.
    Socket {
        #[arg(long, default_value_t = 50)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "1ms")]
        interval: Duration,
    },
    /// A UDP socket on loopback read by a thread named `udp-rx`, and one named `udp-tx` that
    /// sleeps `interval` and sends it a datagram, `count` times: each receive is ended by
    /// the network stack's softirq, not by the sending task. Reports `waited=N` (receives that
    /// slept) and `naps=N` (the sender's nanosleeps that slept).
    Udp {
        #[arg(long, default_value_t = 100)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "2ms")]
        interval: Duration,
    },
    /// In a new folder in `dir`, `count` times: mkdir, create a file, unlink it, rmdir; beside
    /// it a thread that fsyncs the folder every `sync_interval`, so the storm's operations meet
    /// journal commits in progress. How often they meet one is the machine's to decide: with
    /// `min_sleeps`, the storm goes on past `count` (up to 20 times as long) until its thread
    /// has slept that often.
    Dirs {
        #[arg(long, default_value_t = 500)]
        count: u32,
        #[arg(long, default_value_t = 0)]
        min_sleeps: u32,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, value_parser = time::parse_duration, default_value = "2ms")]
        sync_interval: Duration,
        /// Pin both threads to this CPU (the fsync thread's CPU then never idles while the
        /// storm runs on another).
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// `count` times: this process (`chain-reader`) reads a pipe that a child
    /// (`chain-syncer`) writes after writing 4 KiB to a file in `dir` and fsyncing it: each
    /// read waits behind an fsync. Reports the reads that slept and the overlaps by the
    /// processes' own clocks (`--chains`' two-level case).
    Chain2 {
        #[arg(long, default_value_t = 40)]
        count: u32,
        #[arg(long)]
        dir: PathBuf,
    },
    /// `count` times: this process (`chain-a`) waits on a lock a child (`chain-b`) holds while
    /// it reads a pipe that another child (`chain-c`) writes after a nanosleep of `interval`:
    /// a futex wait behind a pipe wait behind a nanosleep (`--chains`' three-level case).
    Chain3 {
        #[arg(long, default_value_t = 20)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "20ms")]
        interval: Duration,
    },
    /// `count` times: a child that shares this process's memory (vfork) sleeps `sleep` and
    /// exits, while the parent waits for it uninterruptibly (killable): a sleep as long as the
    /// child's that latencytop counts whatever its length.
    Vfork {
        #[arg(long, default_value_t = 20)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "20ms")]
        sleep: Duration,
    },
    /// Keeps a CPU busy in user space for `time`, with a system call every `syscall_every`
    /// iterations (0: none), so that context tracking sees user entries and exits.
    Spin {
        #[arg(long, value_parser = time::parse_duration, default_value = "2s")]
        time: Duration,
        #[arg(long)]
        cpu: Option<usize>,
        #[arg(long, default_value_t = 100_000)]
        syscall_every: u64,
    },
    /// Prints the name of every BPF program loaded in the kernel, one a line (tests check that
    /// none of latprof's is left after it exits).
    LoadedPrograms,
    /// `procs` processes sleeping `interval` in a loop, at the same kernel backtrace.
    Sleepers {
        #[arg(long, default_value_t = 2)]
        procs: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "100us")]
        interval: Duration,
        #[arg(long, value_parser = time::parse_duration, default_value = "2s")]
        time: Duration,
    },
    /// `count` short-lived threads named `storm`, `batch` alive at a time, each sleeping `sleep`
    /// once before it exits: a storm of exits in one process (a `--pid` filter sees them all, unlike the
    /// children of `forks`). Reports `slept=N`, the threads' sleeps that really slept.
    ExitStorm {
        #[arg(long, default_value_t = 2000)]
        count: u32,
        #[arg(long, default_value_t = 8)]
        batch: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "200us")]
        sleep: Duration,
    },
    /// One thread sleeping at many distinct kernel places (about 40: timed waits of every kind,
    /// socket reads by each system call on each socket type), `rounds` times each; more causes
    /// than a task's table holds (`TASK_RECORDS`). Reports `sites=N` (the places where it
    /// slept) and `slept=N` (its sleeps there).
    Causes {
        #[arg(long, default_value_t = 2)]
        rounds: u32,
    },
}

#[expect(
    clippy::too_many_lines,
    reason = "one arm per workload: the dispatch reads as the list of workloads"
)]
pub fn run(args: &WorkloadArgs) -> Result<()> {
    if args.wait {
        // Block until the caller is ready (a line or end of file).
        let mut byte = [0u8; 1];
        let _ = std::io::stdin().read(&mut byte);
    }
    let finish_with = |facts: &str| {
        if args.hold {
            // Tells the caller every sleep of the work has ended (and so has been accounted),
            // then stays alive, threads included, until stdin closes.
            println!("done{facts}");
            let _ = std::io::stdout().flush();
            let mut rest = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut rest);
        }
    };
    let finish = || finish_with("");
    match &args.kind {
        Workload::Sleep {
            count,
            interval,
            print_proc_latency,
        } => {
            // The workload's own clock, so that a test can tell latprof's numbers from a stall
            // of this (virtual) machine.
            // And whether each nanosleep really slept: on a slow (emulated) CPU the timer can
            // expire before the task leaves the CPU, and then there is no sleep to count.
            let (mut max_ns, mut total_ns, mut slept, mut split) = (0u128, 0u128, 0u32, 0u32);
            // `switched`: every sleep from the first call to the last, the nanosleeps' and any
            // other (a page fault's, a lock's), so a test can tell an extra sleep from a miscount.
            let mut first = 0;
            let (real, invalid) = (timespec(*interval), INVALID_TIMESPEC);
            // Round 0 is the loop itself, uncounted and sleeping not at all (the kernel refuses
            // its timespec): every code page a counted call runs is faulted in before the
            // first. A first use inside a call, where another process reads the same binary,
            // sleeps in a page fault and counts as one of the call's sleeps (seen in CI: one
            // "Page fault (reading from disk)", `slept` one more than latprof's nanosleeps, and
            // again after a warm-up of its own that ran only some of the loop's code).
            for round in 0..=*count {
                // Opaque to the optimizer: a round 0 peeled off into a copy of its own would
                // warm that copy's pages, not the loop's.
                let warming = std::hint::black_box(round) == 0;
                let ts = if warming { &invalid } else { &real };
                let switches = voluntary_switches();
                let t = std::time::Instant::now();
                nanosleep_at(ts);
                let ns = t.elapsed().as_nanos();
                max_ns = max_ns.max(ns);
                total_ns += ns;
                // Every sleep of the call: a nanosleep woken early by anything but its
                // timer sleeps again for the rest, and latprof counts both. `split`: the
                // sleeps of calls that slept more than once, each possibly short.
                let n = u32::try_from(voluntary_switches() - switches).unwrap_or(0);
                slept += n;
                if n > 1 {
                    split += n;
                }
                if warming {
                    std::hint::black_box((max_ns, total_ns, slept, split));
                    (max_ns, total_ns, slept, split) = (0, 0, 0, 0);
                    first = voluntary_switches();
                }
            }
            let switched = voluntary_switches() - first;
            if *print_proc_latency {
                let text = std::fs::read_to_string("/proc/self/latency")
                    .context("reading /proc/self/latency (kernel without CONFIG_LATENCYTOP?)")?;
                print!("{text}");
            }
            finish_with(&format!(
                " max_ns={max_ns} total_ns={total_ns} slept={slept} split={split} switched={switched}"
            ));
            Ok(())
        }
        Workload::Fsync { count, dir } => {
            // Every sleep from here to `done`: the file's creation and removal too.
            let before = voluntary_switches();
            let path = dir.join(format!("latprof-fsync-{}", std::process::id()));
            let mut file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&path)
                .with_context(|| format!("create {}", path.display()))?;
            let block = [0x5a_u8; 4096];
            let result = (|| -> Result<()> {
                for _ in 0..*count {
                    file.write_all(&block)?;
                    file.sync_all()?;
                }
                Ok(())
            })();
            drop(file);
            let _ = std::fs::remove_file(&path);
            let slept = voluntary_switches() - before;
            finish_with(&format!(" slept={slept}"));
            result
        }
        Workload::Pingpong {
            count,
            processes,
            cpu,
            apart,
            named,
            print_stack,
        } => {
            if let Some(cpu) = cpu {
                pin(*cpu)?;
            }
            let sides = Sides {
                processes: *processes,
                apart: *apart,
                named: *named,
                print_stack: *print_stack,
            };
            pingpong(*count, &sides, finish_with)
        }
        Workload::ExitAio {
            count,
            dir,
            no_first_sleep,
        } => {
            let path = dir.join(format!("latprof-aio-{}", std::process::id()));
            let result = exit_aio(*count, &path, !*no_first_sleep);
            let _ = std::fs::remove_file(&path);
            finish();
            result
        }
        Workload::Forks { count, sleep } => {
            for _ in 0..*count {
                reap(spawn_child(|| nanosleep(*sleep))?);
            }
            finish();
            Ok(())
        }
        Workload::Sleepers {
            procs,
            interval,
            time,
        } => {
            let until = std::time::Instant::now() + *time;
            let children = (0..*procs)
                .map(|_| {
                    spawn_child(|| {
                        while std::time::Instant::now() < until {
                            nanosleep(*interval);
                        }
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            children.into_iter().for_each(reap);
            finish();
            Ok(())
        }
        Workload::Threads {
            count,
            interval,
            seconds,
        } => {
            let until = std::time::Instant::now() + Duration::from_secs(*seconds);
            let interval = *interval;
            let threads: Vec<_> = (0..*count)
                .map(|_| {
                    std::thread::Builder::new()
                        .stack_size(64 * 1024)
                        .spawn(move || {
                            while std::time::Instant::now() < until {
                                nanosleep(interval);
                            }
                        })
                })
                .collect::<Result<_, _>>()
                .context("spawning threads")?;
            for t in threads {
                let _ = t.join();
            }
            finish();
            Ok(())
        }
        Workload::Measure { report, command } => measure(report, command),
        Workload::Futex {
            count,
            interval,
            cpu,
        } => {
            if let Some(cpu) = cpu {
                // Before the threads start: they inherit the mask.
                pin(*cpu)?;
            }
            futex(*count, *interval, finish_with)
        }
        Workload::Mutex {
            threads,
            count,
            hold,
            cpu,
        } => {
            if let Some(cpu) = cpu {
                pin(*cpu)?;
            }
            let lock = std::sync::Mutex::new(());
            on_threads(
                *threads,
                |_| {
                    for _ in 0..*count {
                        let guard = lock
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        nanosleep(*hold);
                        drop(guard);
                        nanosleep(*hold / 2);
                    }
                    Ok(())
                },
                || finish_with(""),
            )
        }
        Workload::Poll { count, timeout } => {
            let ts = timespec(*timeout);
            for _ in 0..*count {
                // SAFETY: timeval is plain data; all zeros is a valid value.
                let mut tv: libc::timeval = unsafe { std::mem::zeroed() };
                tv.tv_sec = ts.tv_sec;
                tv.tv_usec = timeout.subsec_micros().into();
                // SAFETY: no descriptors to watch: both only wait for their timeout.
                unsafe {
                    libc::ppoll(std::ptr::null_mut(), 0, &raw const ts, std::ptr::null());
                    libc::select(
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        &raw mut tv,
                    );
                }
            }
            finish();
            Ok(())
        }
        Workload::Socket { count, interval } => socket(*count, *interval, finish_with),
        Workload::Udp { count, interval } => udp(*count, *interval, finish_with),
        Workload::Dirs {
            count,
            min_sleeps,
            dir,
            sync_interval,
            cpu,
        } => {
            if let Some(cpu) = cpu {
                // Before the fsync thread starts: it inherits the mask.
                pin(*cpu)?;
            }
            let base = dir.join(format!("latprof-dirs-{}", std::process::id()));
            std::fs::create_dir(&base).with_context(|| format!("create {}", base.display()))?;
            let result = dirs(*count, *min_sleeps, &base, *sync_interval);
            let _ = std::fs::remove_dir_all(&base);
            finish();
            result
        }
        Workload::Chain2 { count, dir } => chains::two_levels(*count, dir, finish_with),
        Workload::Chain3 { count, interval } => {
            chains::three_levels(*count, *interval, finish_with)
        }
        Workload::Vfork { count, sleep } => {
            for _ in 0..*count {
                reap(vfork_sleep(*sleep)?);
            }
            finish();
            Ok(())
        }
        Workload::LoadedPrograms => {
            for program in aya::programs::loaded_programs() {
                let info = program.context("listing the kernel's BPF programs")?;
                println!("{}", info.name_as_str().unwrap_or("?"));
            }
            Ok(())
        }
        Workload::ExitStorm {
            count,
            batch,
            sleep,
        } => {
            let slept = exit_storm(*count, *batch, *sleep)?;
            finish_with(&format!(" slept={slept}"));
            Ok(())
        }
        Workload::Causes { rounds } => {
            let (sites, slept) = causes::run(*rounds)?;
            finish_with(&format!(" sites={sites} slept={slept}"));
            Ok(())
        }
        Workload::Spin {
            time,
            cpu,
            syscall_every,
        } => {
            if let Some(cpu) = cpu {
                pin(*cpu)?;
            }
            let until = std::time::Instant::now() + *time;
            let mut n: u64 = 0;
            let mut syscalls: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
                if *syscall_every > 0 && n.is_multiple_of(*syscall_every) {
                    // SAFETY: getppid has no effects.
                    std::hint::black_box(unsafe { libc::getppid() });
                    syscalls += 1;
                    // The clock is read in user space (vDSO): no system call.
                    if std::time::Instant::now() >= until {
                        break;
                    }
                } else if *syscall_every == 0
                    && n.is_multiple_of(1_000_000)
                    && std::time::Instant::now() >= until
                {
                    break;
                }
            }
            finish_with(&format!(" syscalls={syscalls}"));
            Ok(())
        }
    }
}

/// `measure`: runs `command`, waits for it with its rusage, writes
/// `code=C signal=S maxrss_kib=M cpu_s=T` to `report`.
fn measure(report: &std::path::Path, command: &[String]) -> Result<()> {
    use std::os::unix::process::ExitStatusExt as _;
    let child = std::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn()
        .with_context(|| format!("starting {}", command[0]))?;
    let pid = libc::pid_t::try_from(child.id()).context("pid")?;
    let mut status = 0;
    // SAFETY: all-zero is a valid rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet reaped; the pointers are to live locals.
    if unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) } != pid {
        return Err(std::io::Error::last_os_error()).context("wait4");
    }
    // Reaped above: the Child handle has nothing left to wait for.
    std::mem::forget(child);
    let status = std::process::ExitStatus::from_raw(status);
    #[expect(clippy::cast_precision_loss, reason = "seconds for a report")]
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    std::fs::write(
        report,
        format!(
            "code={} signal={} maxrss_kib={} cpu_s={:.3}\n",
            status.code().unwrap_or(-1),
            status.signal().unwrap_or(0),
            usage.ru_maxrss,
            secs(usage.ru_utime) + secs(usage.ru_stime)
        ),
    )
    .with_context(|| format!("writing {}", report.display()))
}

/// Runs `work(i)` on threads 0..`n`; when every one has finished, calls `finish` while they are
/// all still alive (with --hold a test then reads each thread's records), then lets them exit.
/// The calling thread waits for them on a pipe (each writes a byte when its work is done), so
/// its waits are pipe reads, apart from the futex waits of a workload's own.
fn on_threads(
    n: u32,
    work: impl Fn(u32) -> Result<()> + Sync,
    finish: impl FnOnce(),
) -> Result<()> {
    let release = Gate::default();
    let (mut results, done) = pipe()?;
    std::thread::scope(|s| {
        for i in 0..n {
            let (work, release, done) = (&work, &release, &done);
            s.spawn(move || {
                let ok = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(i))) {
                    Ok(Ok(())) => b'0',
                    Ok(Err(e)) => {
                        eprintln!("thread {i}: {e:#}");
                        b'1'
                    }
                    Err(_) => b'1',
                };
                let _ = (&*done).write_all(&[ok]);
                release.wait();
            });
        }
        let mut oks = vec![0u8; usize::try_from(n).unwrap_or(0)];
        let read = results.read_exact(&mut oks);
        finish();
        release.open();
        read.context("reading the threads' results")?;
        if oks.iter().any(|&b| b != b'0') {
            bail!("a thread failed (said above)");
        }
        Ok(())
    })
}

/// Holds threads until it opens: one futex wait each, which ends only at the release. Not std's
/// Barrier: its threads take a mutex on the way in, and the one that finds it held sleeps
/// (briefly) there, a sleep that may end after `finish` has told a test that every sleep of the
/// work has ended and been accounted.
#[derive(Default)]
struct Gate(AtomicU32);

impl Gate {
    fn wait(&self) {
        while self.0.load(Ordering::Acquire) == 0 {
            // SAFETY: a live, aligned u32; the kernel sleeps only while it still holds 0, and
            // any early return is looped over.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.0.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    0,
                    std::ptr::null::<libc::timespec>(),
                );
            }
        }
    }

    fn open(&self) {
        self.0.store(1, Ordering::Release);
        // SAFETY: wakes every waiter on a live, aligned u32.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            );
        }
    }
}

/// Names the calling thread (its comm, at most 15 bytes).
fn set_name(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of the calling thread.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// See `Workload::Futex`: the waiting thread is named `futex-waiter`, the waking one
/// `futex-waker`.
fn futex(count: u32, interval: Duration, finish: impl FnOnce(&str)) -> Result<()> {
    let word = AtomicU32::new(0);
    // The waiter's futex waits that slept: each one ended by the waker's FUTEX_WAKE.
    let waited = AtomicU64::new(0);
    on_threads(
        2,
        |i| {
            set_name(if i == 0 {
                c"futex-waiter"
            } else {
                c"futex-waker"
            });
            for round in 1..=count {
                if i == 0 {
                    loop {
                        let seen = word.load(Ordering::Acquire);
                        if seen >= round {
                            break;
                        }
                        let switches = voluntary_switches();
                        // SAFETY: a live, aligned u32; the kernel sleeps only while it still
                        // holds `seen`, and any early return is looped over.
                        unsafe {
                            libc::syscall(
                                libc::SYS_futex,
                                word.as_ptr(),
                                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                                seen,
                                std::ptr::null::<libc::timespec>(),
                            );
                        }
                        if voluntary_switches() > switches {
                            waited.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                } else {
                    nanosleep(interval);
                    word.store(round, Ordering::Release);
                    // SAFETY: wakes at most one waiter on a live, aligned u32.
                    unsafe {
                        libc::syscall(
                            libc::SYS_futex,
                            word.as_ptr(),
                            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                            1,
                        );
                    }
                }
            }
            Ok(())
        },
        || finish(&format!(" waited={}", waited.load(Ordering::Relaxed))),
    )
}

/// See `Workload::Udp`.
fn udp(count: u32, interval: Duration, finish: impl FnOnce(&str)) -> Result<()> {
    // The receives that slept (a datagram already queued is taken without a wait), and the
    // sender's nanosleeps that slept (a timer can expire before its task leaves the CPU).
    let waited = AtomicU64::new(0);
    let naps = AtomicU64::new(0);
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").context("bind a loopback UDP socket")?;
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").context("bind a loopback UDP socket")?;
    tx.connect(rx.local_addr()?)
        .context("connect the UDP sender")?;
    // A receive that waits this long lost its datagram (or loopback is down): an error, not
    // a hang.
    rx.set_read_timeout(Some(Duration::from_secs(10)))
        .context("UDP receive timeout")?;
    on_threads(
        2,
        |i| {
            let mut byte = [0u8; 1];
            if i == 0 {
                set_name(c"udp-rx");
                for _ in 0..count {
                    let switches = voluntary_switches();
                    rx.recv(&mut byte)
                        .context("UDP receive (is loopback up?)")?;
                    if voluntary_switches() > switches {
                        waited.fetch_add(1, Ordering::Relaxed);
                    }
                }
            } else {
                set_name(c"udp-tx");
                for _ in 0..count {
                    let switches = voluntary_switches();
                    nanosleep(interval);
                    if voluntary_switches() > switches {
                        naps.fetch_add(1, Ordering::Relaxed);
                    }
                    tx.send(&byte)?;
                }
            }
            Ok(())
        },
        || {
            finish(&format!(
                " waited={} naps={}",
                waited.load(Ordering::Relaxed),
                naps.load(Ordering::Relaxed)
            ));
        },
    )
}

/// See `Workload::Socket`.
fn socket(count: u32, interval: Duration, finish: impl FnOnce(&str)) -> Result<()> {
    use std::os::unix::net::{UnixDatagram, UnixStream};
    let stream = UnixStream::pair().context("Unix stream socket pair")?;
    let datagram = UnixDatagram::pair().context("Unix datagram socket pair")?;
    on_threads(
        4,
        |i| {
            let mut byte = [0u8; 1];
            for _ in 0..count {
                match i {
                    0 => (&stream.0).read_exact(&mut byte)?,
                    1 => {
                        nanosleep(interval);
                        (&stream.1).write_all(&byte)?;
                    }
                    2 => drop(datagram.0.recv(&mut byte)?),
                    _ => {
                        nanosleep(interval);
                        datagram.1.send(&byte)?;
                    }
                }
            }
            Ok(())
        },
        || finish(""),
    )
}

/// See `Workload::Dirs`.
fn dirs(
    count: u32,
    min_sleeps: u32,
    base: &std::path::Path,
    sync_interval: Duration,
) -> Result<()> {
    let folder = std::fs::File::open(base).with_context(|| format!("open {}", base.display()))?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let syncer = s.spawn(|| -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                folder.sync_all().context("fsync the folder")?;
                nanosleep(sync_interval);
            }
            Ok(())
        });
        let storm = (|| -> Result<()> {
            // The sleeps of this thread since the storm began: its own waits.
            let before = voluntary_switches();
            let slept = || u32::try_from(voluntary_switches() - before).unwrap_or(u32::MAX);
            for i in
                (0..count.saturating_mul(20)).take_while(|&i| i < count || slept() < min_sleeps)
            {
                let sub = base.join(format!("d{i}"));
                std::fs::create_dir(&sub).with_context(|| format!("mkdir {}", sub.display()))?;
                let file = sub.join("f");
                drop(std::fs::File::create(&file)?);
                std::fs::remove_file(&file)?;
                std::fs::remove_dir(&sub)?;
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let synced = syncer
            .join()
            .map_err(|_| anyhow::anyhow!("fsync thread panicked"))?;
        storm.and(synced)
    })
}

/// Forks a child process that runs `work` and exits without running the parent's destructors.
fn spawn_child(work: impl FnOnce()) -> Result<libc::pid_t> {
    // SAFETY: the child only runs `work` (sleeps) and _exits.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()).context("fork"),
        0 => {
            work();
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        child => Ok(child),
    }
}

/// Starts a child that shares this process's memory and sleeps `sleep` (clone with CLONE_VM and
/// CLONE_VFORK: the kernel holds this thread until the child exits). Returns the child.
fn vfork_sleep(sleep: Duration) -> Result<libc::pid_t> {
    extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the parent's timespec, alive while the parent is held. Raw system
        // calls only: this task runs on the parent's memory, without its own thread state.
        unsafe {
            libc::syscall(
                libc::SYS_nanosleep,
                arg.cast::<libc::timespec>(),
                std::ptr::null_mut::<libc::timespec>(),
            );
            libc::syscall(libc::SYS_exit, 0);
        }
        0
    }
    let mut ts = timespec(sleep);
    let mut stack = vec![0u8; 64 * 1024];
    // The stack grows down from its 16-byte aligned top.
    let top = stack.as_mut_ptr().wrapping_add(stack.len());
    let top = top.wrapping_sub(top as usize % 16);
    // SAFETY: the child runs `child` on its own stack, which outlives it: the parent returns
    // from clone only when the child has exited.
    let pid = unsafe {
        libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw mut ts).cast(),
        )
    };
    if pid == -1 {
        return Err(std::io::Error::last_os_error()).context("clone (vfork)");
    }
    Ok(pid)
}

/// Waits for a child of ours.
fn reap(child: libc::pid_t) {
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(child, &raw mut status, 0) };
}

/// This thread's voluntary context switches so far (each one a sleep).
fn voluntary_switches() -> i64 {
    // SAFETY: getrusage fills the zeroed struct.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage);
        usage.ru_nvcsw
    }
}

fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays in bounds for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("pin to CPU {cpu}"));
        }
    }
    Ok(())
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        // time_t is i64 on x86-64, glibc and musl alike (musl's alias is deprecated).
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: libc::c_long::from(d.subsec_nanos()),
    }
}

/// A timespec the kernel refuses (EINVAL) before any sleep.
const INVALID_TIMESPEC: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: -1,
};

fn nanosleep(d: Duration) {
    nanosleep_at(&timespec(d));
}

fn nanosleep_at(ts: &libc::timespec) {
    // SAFETY: a valid pointer to a timespec; an interrupted sleep simply ends early, and a
    // refused one does not sleep.
    unsafe { libc::nanosleep(ts, std::ptr::null_mut()) };
}

fn pipe() -> Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: both fds were just created and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((r.into(), w.into()))
}

/// One side: `first` writes then reads; the other reads then writes, and afterwards waits for
/// the first side to close its end (so both stay alive until the caller lets go).
#[inline(never)]
fn bounce(
    count: u32,
    rx: &mut std::fs::File,
    tx: &mut std::fs::File,
    first: bool,
    stack: Option<&mut String>,
) -> Result<()> {
    if let Some(stack) = stack {
        *stack = std::backtrace::Backtrace::force_capture().to_string();
    }
    let mut byte = [0u8; 1];
    for _ in 0..count {
        if first {
            tx.write_all(&byte)?;
            rx.read_exact(&mut byte)?;
        } else {
            rx.read_exact(&mut byte)?;
            tx.write_all(&byte)?;
        }
    }
    Ok(())
}

/// With threads, `finish` gets ` slept=N`: the two threads' voluntary context switches during
/// the ping-pong, each one a sleep (their pipe reads, the other's wait for the end of file and
/// this one's for its report), every sleep of the process until `finish`.
/// With processes, ` ping_slept=N pong_slept=M`: each side's reads that slept, exactly (a side
/// sleeps nowhere else while it bounces: a one-byte pipe write never waits). The child then
/// waits for the parent's end of file, which comes after `finish` (both stay alive for a
/// test to read, and that last wait ends after it).
/// How the ping-pong's two sides run (see `Workload::Pingpong`).
struct Sides {
    processes: bool,
    apart: bool,
    named: bool,
    print_stack: bool,
}

fn pingpong(count: u32, sides: &Sides, finish: impl FnOnce(&str)) -> Result<()> {
    let Sides {
        processes,
        apart,
        named,
        print_stack,
    } = *sides;
    let (mut a_rx, mut b_tx) = pipe()?;
    let (mut b_rx, mut a_tx) = pipe()?;
    let mut stack = String::new();
    if processes {
        if named {
            set_name(c"ping");
        }
        // The child's count, in memory both processes share.
        let shared = SharedCount::new()?;
        // SAFETY: single-threaded here; the child only does pipe I/O and _exit.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("fork"),
            0 => {
                if named {
                    set_name(c"pong");
                }
                drop((a_rx, a_tx));
                let pinned = !apart || pin(1).is_ok();
                let before = voluntary_switches();
                let ok = pinned && bounce(count, &mut b_rx, &mut b_tx, false, None).is_ok();
                shared.set(voluntary_switches() - before);
                let mut rest = Vec::new();
                let ok = ok && b_rx.read_to_end(&mut rest).is_ok();
                // SAFETY: leave the child without running the parent's destructors.
                unsafe { libc::_exit(i32::from(!ok)) };
            }
            child => {
                drop((b_rx, b_tx));
                if apart {
                    pin(0)?;
                }
                let before = voluntary_switches();
                let result = bounce(
                    count,
                    &mut a_rx,
                    &mut a_tx,
                    true,
                    print_stack.then_some(&mut stack),
                );
                let slept = voluntary_switches() - before;
                print_stack_lines(&stack);
                // The child sets its count just after its last write, which ended this side's
                // last read: a short wait, and no sleep.
                let pong = shared.wait(&result);
                finish(&format!(" ping_slept={slept} pong_slept={pong}"));
                drop(a_tx);
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(child, &raw mut status, 0) };
                result?;
                if status != 0 {
                    bail!("ping-pong child failed: status {status}");
                }
                Ok(())
            }
        }
    } else {
        // The other thread reports its sleeps, then stays alive until the work is reported
        // done (a test reads both threads' records then).
        let (report, reported) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        // Every voluntary switch from here, the thread's start included (a new thread's count
        // begins at zero): on PREEMPT_RT the start may wait for a sleeping spinlock.
        let before = voluntary_switches();
        let handle = std::thread::spawn(move || {
            let result = bounce(count, &mut b_rx, &mut b_tx, false, None).and_then(|()| {
                // Its last read ends at the other side's end of file.
                let mut rest = Vec::new();
                b_rx.read_to_end(&mut rest)?;
                Ok(())
            });
            let _ = report.send((result, voluntary_switches()));
            let _ = released.recv();
        });
        let result = bounce(
            count,
            &mut a_rx,
            &mut a_tx,
            true,
            print_stack.then_some(&mut stack),
        );
        print_stack_lines(&stack);
        // The other side's last read ends at end of file.
        drop(a_tx);
        let (other, other_slept) = reported
            .recv()
            .map_err(|_| anyhow::anyhow!("ping-pong thread panicked"))?;
        // This thread's wait for the report is one of its sleeps too.
        let slept = voluntary_switches() - before;
        finish(&format!(" slept={}", slept + other_slept));
        drop(release);
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("ping-pong thread panicked"))?;
        result.and(other)
    }
}

/// Prints a captured backtrace's functions, innermost first, each after `stack: ` (nothing for
/// an empty one).
fn print_stack_lines(stack: &str) {
    for line in stack.lines() {
        // "  3: name" lines name a frame; "at file:line" lines follow them.
        if let Some((n, name)) = line.trim().split_once(": ")
            && n.parse::<u32>().is_ok()
        {
            println!("stack: {name}");
        }
    }
}

/// A count one process writes and a process it forked reads: a shared anonymous page, -1 until
/// it is set.
struct SharedCount(*const AtomicI64);

impl SharedCount {
    fn new() -> Result<Self> {
        // SAFETY: a new anonymous mapping; nothing else refers to it yet.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap a shared page");
        }
        let count = Self(page.cast());
        count.get().store(-1, Ordering::Release);
        Ok(count)
    }

    fn get(&self) -> &AtomicI64 {
        // SAFETY: the page is mapped and aligned for as long as `self` lives.
        unsafe { &*self.0 }
    }

    fn set(&self, n: i64) {
        self.get().store(n, Ordering::Release);
    }

    /// The count, once set; -1 at once if the ping-pong failed (the child may never set it).
    fn wait(&self, ok: &Result<()>) -> i64 {
        loop {
            let n = self.get().load(Ordering::Acquire);
            if n >= 0 || ok.is_err() {
                return n;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for SharedCount {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once.
        unsafe { libc::munmap(self.0.cast_mut().cast(), 4096) };
    }
}

/// Linux AIO's control block (`struct iocb`, x86-64 and other little-endian 64-bit layouts).
#[repr(C)]
#[derive(Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: u32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}
const _: () = assert!(size_of::<Iocb>() == 64);

/// See `Workload::ExitAio`.
fn exit_aio(count: u32, path: &std::path::Path, first_sleep: bool) -> Result<()> {
    const LEN: usize = 8 << 20;
    {
        // Real blocks on disk: a direct read of a hole would finish at once.
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .with_context(|| format!("create {}", path.display()))?;
        file.write_all(&vec![0x5a_u8; LEN])?;
        file.sync_all()?;
    }
    let layout = std::alloc::Layout::from_size_align(LEN, 4096).context("buffer layout")?;
    for _ in 0..count {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .with_context(|| format!("open {} with O_DIRECT", path.display()))?;
        let child = spawn_child(|| {
            // One sleep first, unless asked not to: latprof then knows the task before it
            // exits (a task first seen exiting is tracked too, but differently).
            if first_sleep {
                nanosleep(Duration::from_millis(1));
            }
            // SAFETY: a fresh aligned buffer, a zeroed context, one valid control block; the
            // child exits with the read in flight, which is the point.
            unsafe {
                let buf = std::alloc::alloc(layout);
                let mut ctx: u64 = 0;
                if buf.is_null() || libc::syscall(libc::SYS_io_setup, 1, &raw mut ctx) != 0 {
                    libc::_exit(2);
                }
                let mut cb = Iocb {
                    fildes: u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&file)).unwrap_or(0),
                    buf: buf as u64,
                    nbytes: LEN as u64,
                    ..Iocb::default()
                };
                let mut list = [&raw mut cb];
                if libc::syscall(libc::SYS_io_submit, ctx, 1, list.as_mut_ptr()) != 1 {
                    libc::_exit(3);
                }
            }
        })?;
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(child, &raw mut status, 0) };
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            bail!(
                "the AIO child failed (exit {}): direct I/O or AIO unavailable in {}",
                libc::WEXITSTATUS(status),
                path.display()
            );
        }
    }
    Ok(())
}

/// See `Workload::ExitStorm`.
fn exit_storm(count: u32, batch: u32, sleep: Duration) -> Result<i64> {
    let mut slept = 0;
    let mut left = count;
    while left > 0 {
        let n = left.min(batch.max(1));
        left -= n;
        let threads: Vec<_> = (0..n)
            .map(|_| {
                std::thread::Builder::new()
                    .name("storm".to_owned())
                    .stack_size(64 * 1024)
                    .spawn(move || {
                        let before = voluntary_switches();
                        nanosleep(sleep);
                        i64::from(voluntary_switches() > before)
                    })
            })
            .collect::<Result<_, _>>()
            .context("spawning threads")?;
        for t in threads {
            slept += t
                .join()
                .map_err(|_| anyhow::anyhow!("a storm thread panicked"))?;
        }
    }
    Ok(slept)
}

/// `Workload::Causes`: timed waits at distinct kernel places, each ending by its own timeout.
mod causes {
    use std::{
        net::{TcpListener, TcpStream, UdpSocket},
        os::{
            fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
            unix::net::{UnixDatagram, UnixListener, UnixStream},
        },
        ptr::{null, null_mut},
    };

    use anyhow::{Context as _, Result};

    use super::voluntary_switches;

    /// A short relative timeout (a static: the system calls take its address).
    static TS: libc::timespec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000,
    };

    fn check(rc: libc::c_int, what: &str) -> Result<libc::c_int> {
        if rc < 0 {
            return Err(std::io::Error::last_os_error()).context(what.to_owned());
        }
        Ok(rc)
    }

    fn owned(fd: libc::c_int, what: &str) -> Result<OwnedFd> {
        // SAFETY: a descriptor just created and owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(check(fd, what)?) })
    }

    /// SO_RCVTIMEO of 1 ms (the kernel rounds it up to a tick): reads and accepts end there.
    fn rcvtimeo(fd: RawFd) -> Result<()> {
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 1000,
        };
        // SAFETY: a valid socket and option value.
        check(
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&raw const tv).cast(),
                    libc::socklen_t::try_from(size_of::<libc::timeval>()).unwrap_or(0),
                )
            },
            "SO_RCVTIMEO",
        )
        .map(drop)
    }

    /// Everything the waits need, kept open for every round.
    struct Objects {
        pipe_r: std::fs::File,
        _pipe_w: std::fs::File,
        epoll: OwnedFd,
        timerfd: OwnedFd,
        sem: libc::c_int,
        mq: libc::mqd_t,
        mq_name: std::ffi::CString,
        aio: libc::c_ulong,
        /// Sockets to read from (nothing is ever sent): each by four system calls.
        readers: Vec<RawFd>,
        /// Listening sockets no one connects to: each by accept and accept4.
        listeners: Vec<RawFd>,
        _keep: Vec<Box<dyn std::any::Any>>,
        unix_path: std::path::PathBuf,
    }

    impl Drop for Objects {
        fn drop(&mut self) {
            // SAFETY: our own semaphore set, queue and AIO context.
            unsafe {
                libc::semctl(self.sem, 0, libc::IPC_RMID);
                libc::mq_close(self.mq);
                libc::mq_unlink(self.mq_name.as_ptr());
                libc::syscall(libc::SYS_io_destroy, self.aio);
            }
            let _ = std::fs::remove_file(&self.unix_path);
        }
    }

    fn objects() -> Result<Objects> {
        let (pipe_r, pipe_w) = super::pipe()?;
        // SAFETY: plain constructors of kernel objects.
        let epoll = owned(unsafe { libc::epoll_create1(0) }, "epoll_create1")?;
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: valid descriptors and event.
        check(
            unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    pipe_r.as_raw_fd(),
                    &raw mut ev,
                )
            },
            "epoll_ctl",
        )?;
        // SAFETY: as above.
        let timerfd = owned(
            unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, 0) },
            "timerfd_create",
        )?;
        // SAFETY: a private semaphore set of one, at zero.
        let sem = check(
            unsafe { libc::semget(libc::IPC_PRIVATE, 1, 0o600) },
            "semget",
        )?;
        let mq_name = std::ffi::CString::new(format!("/latprof-causes-{}", std::process::id()))
            .context("queue name")?;
        // SAFETY: a valid attribute block and name; the queue is unlinked at drop.
        let mq = unsafe {
            let mut attr: libc::mq_attr = std::mem::zeroed();
            attr.mq_maxmsg = 1;
            attr.mq_msgsize = 8;
            libc::mq_open(
                mq_name.as_ptr(),
                libc::O_CREAT | libc::O_RDWR,
                0o600,
                &raw mut attr,
            )
        };
        check(mq, "mq_open")?;
        let mut aio: libc::c_ulong = 0;
        // SAFETY: a zeroed context to fill.
        if unsafe { libc::syscall(libc::SYS_io_setup, 1, &raw mut aio) } != 0 {
            return Err(std::io::Error::last_os_error()).context("io_setup");
        }
        let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
        let mut readers = Vec::new();
        let (a, b) = UnixStream::pair().context("unix stream pair")?;
        readers.push(a.as_raw_fd());
        keep.extend([Box::new(a) as Box<dyn std::any::Any>, Box::new(b)]);
        let (a, b) = UnixDatagram::pair().context("unix datagram pair")?;
        readers.push(a.as_raw_fd());
        keep.extend([Box::new(a) as Box<dyn std::any::Any>, Box::new(b)]);
        let mut fds = [0; 2];
        // SAFETY: a valid array of two.
        check(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) },
            "seqpacket pair",
        )?;
        readers.push(fds[0]);
        // SAFETY: both just created.
        keep.extend(unsafe {
            [
                Box::new(OwnedFd::from_raw_fd(fds[0])) as Box<dyn std::any::Any>,
                Box::new(OwnedFd::from_raw_fd(fds[1])),
            ]
        });
        let udp = UdpSocket::bind("127.0.0.1:0").context("udp socket")?;
        readers.push(udp.as_raw_fd());
        keep.push(Box::new(udp));
        let tcp_listener = TcpListener::bind("127.0.0.1:0").context("tcp listener")?;
        let client = TcpStream::connect(tcp_listener.local_addr()?).context("tcp connect")?;
        let (server, _) = tcp_listener.accept().context("tcp accept")?;
        readers.push(client.as_raw_fd());
        let mut listeners = vec![tcp_listener.as_raw_fd()];
        keep.extend([
            Box::new(client) as Box<dyn std::any::Any>,
            Box::new(server),
            Box::new(tcp_listener),
        ]);
        let unix_path =
            std::env::temp_dir().join(format!("latprof-causes-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&unix_path);
        let unix_listener = UnixListener::bind(&unix_path).context("unix listener")?;
        listeners.push(unix_listener.as_raw_fd());
        keep.push(Box::new(unix_listener));
        for &fd in readers.iter().chain(&listeners) {
            rcvtimeo(fd)?;
        }
        Ok(Objects {
            pipe_r,
            _pipe_w: pipe_w,
            epoll,
            timerfd,
            sem,
            mq,
            mq_name,
            aio,
            readers,
            listeners,
            _keep: keep,
            unix_path,
        })
    }

    /// The waits, each a different kernel backtrace; each returns when its timeout passes.
    #[expect(
        clippy::too_many_lines,
        reason = "the table of every wait the causes workload makes, one entry each"
    )]
    fn waits(o: &Objects) -> Vec<Box<dyn Fn() + '_>> {
        let pipe = o.pipe_r.as_raw_fd();
        let mut w: Vec<Box<dyn Fn() + '_>> = vec![
            // SAFETY (all below): system calls on our own objects with valid arguments; each
            // fails with a timeout, which is the point.
            Box::new(|| unsafe {
                libc::syscall(
                    libc::SYS_nanosleep,
                    &raw const TS,
                    null_mut::<libc::timespec>(),
                );
            }),
            Box::new(|| unsafe {
                libc::syscall(
                    libc::SYS_clock_nanosleep,
                    libc::CLOCK_MONOTONIC,
                    0,
                    &raw const TS,
                    null_mut::<libc::timespec>(),
                );
            }),
            Box::new(move || unsafe {
                let mut p = libc::pollfd {
                    fd: pipe,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::poll(&raw mut p, 1, 1);
            }),
            Box::new(move || unsafe {
                let mut p = libc::pollfd {
                    fd: pipe,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::syscall(
                    libc::SYS_ppoll,
                    &raw mut p,
                    1,
                    &raw const TS,
                    null::<u8>(),
                    8,
                );
            }),
            Box::new(move || unsafe {
                let mut set: libc::fd_set = std::mem::zeroed();
                libc::FD_SET(pipe, &raw mut set);
                let mut tv = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 200,
                };
                libc::select(pipe + 1, &raw mut set, null_mut(), null_mut(), &raw mut tv);
            }),
            Box::new(move || unsafe {
                let mut set: libc::fd_set = std::mem::zeroed();
                libc::FD_SET(pipe, &raw mut set);
                let mut ts = TS;
                libc::syscall(
                    libc::SYS_pselect6,
                    pipe + 1,
                    &raw mut set,
                    null_mut::<libc::fd_set>(),
                    null_mut::<libc::fd_set>(),
                    &raw mut ts,
                    null::<u8>(),
                );
            }),
            Box::new(|| unsafe {
                let mut ev: libc::epoll_event = std::mem::zeroed();
                libc::epoll_wait(o.epoll.as_raw_fd(), &raw mut ev, 1, 1);
            }),
            Box::new(|| unsafe {
                let mut ev: libc::epoll_event = std::mem::zeroed();
                libc::epoll_pwait(o.epoll.as_raw_fd(), &raw mut ev, 1, 1, null());
            }),
            Box::new(|| unsafe {
                let mut ev: libc::epoll_event = std::mem::zeroed();
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    o.epoll.as_raw_fd(),
                    &raw mut ev,
                    1,
                    &raw const TS,
                    null::<u8>(),
                    0,
                );
            }),
            Box::new(|| unsafe {
                let word: u32 = 0;
                libc::syscall(
                    libc::SYS_futex,
                    &raw const word,
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    0,
                    &raw const TS,
                );
            }),
            Box::new(|| unsafe {
                // SIGUSR2 is blocked (see `run`), never sent: the wait times out.
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&raw mut set);
                libc::sigaddset(&raw mut set, libc::SIGUSR2);
                libc::syscall(
                    libc::SYS_rt_sigtimedwait,
                    &raw const set,
                    null_mut::<libc::siginfo_t>(),
                    &raw const TS,
                    8,
                );
            }),
            Box::new(|| unsafe {
                let mut op = libc::sembuf {
                    sem_num: 0,
                    sem_op: -1,
                    sem_flg: 0,
                };
                libc::syscall(libc::SYS_semtimedop, o.sem, &raw mut op, 1, &raw const TS);
            }),
            Box::new(|| unsafe {
                let mut now: libc::timespec = std::mem::zeroed();
                libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut now);
                now.tv_nsec += TS.tv_nsec;
                if now.tv_nsec >= 1_000_000_000 {
                    now.tv_nsec -= 1_000_000_000;
                    now.tv_sec += 1;
                }
                let mut buf = [0u8; 8];
                libc::mq_timedreceive(
                    o.mq,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    null_mut(),
                    &raw const now,
                );
            }),
            Box::new(|| unsafe {
                let spec = libc::itimerspec {
                    it_interval: std::mem::zeroed(),
                    it_value: TS,
                };
                libc::timerfd_settime(o.timerfd.as_raw_fd(), 0, &raw const spec, null_mut());
                let mut n = 0u64;
                libc::read(o.timerfd.as_raw_fd(), (&raw mut n).cast(), 8);
            }),
            Box::new(|| unsafe {
                let mut events = [0u64; 4];
                libc::syscall(
                    libc::SYS_io_getevents,
                    o.aio,
                    1,
                    1,
                    events.as_mut_ptr(),
                    &raw const TS,
                );
            }),
        ];
        for &fd in &o.readers {
            w.push(Box::new(move || unsafe {
                let mut buf = [0u8; 64];
                libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            }));
            w.push(Box::new(move || unsafe {
                let mut buf = [0u8; 64];
                let iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                libc::readv(fd, &raw const iov, 1);
            }));
            w.push(Box::new(move || unsafe {
                let mut buf = [0u8; 64];
                libc::recvfrom(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    null_mut(),
                    null_mut(),
                );
            }));
            w.push(Box::new(move || unsafe {
                let mut buf = [0u8; 64];
                let mut iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = &raw mut iov;
                msg.msg_iovlen = 1;
                libc::recvmsg(fd, &raw mut msg, 0);
            }));
        }
        for &fd in &o.listeners {
            w.push(Box::new(move || unsafe {
                libc::accept(fd, null_mut(), null_mut());
            }));
            w.push(Box::new(move || unsafe {
                libc::accept4(fd, null_mut(), null_mut(), libc::SOCK_CLOEXEC);
            }));
        }
        w
    }

    /// Runs every wait `rounds` times; returns the waits that slept (each round) and the
    /// sleeps.
    pub(super) fn run(rounds: u32) -> Result<(u32, i64)> {
        // SAFETY: blocks SIGUSR2 for this (only) thread, so that rt_sigtimedwait waits.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            libc::sigaddset(&raw mut set, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, null_mut());
        }
        let o = objects()?;
        let waits = waits(&o);
        let mut sites = vec![true; waits.len()];
        let mut slept = 0;
        for _ in 0..rounds {
            for (wait, site) in waits.iter().zip(&mut sites) {
                let before = voluntary_switches();
                wait();
                let n = voluntary_switches() - before;
                *site &= n > 0;
                slept += n;
            }
        }
        drop(waits);
        drop(o);
        Ok((u32::try_from(sites.iter().filter(|s| **s).count())?, slept))
    }
}

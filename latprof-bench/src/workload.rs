//! Deterministic workloads that latprof's tests and benchmarks spawn (`latprof-workload ...`).
use std::{
    fs::OpenOptions,
    io::{Read as _, Write as _},
    os::{
        fd::{FromRawFd as _, OwnedFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use latprof::time;

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
    /// `count` nanosleeps of `interval`.
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
    /// `count` times: write 4 KiB to a file in `dir` and fsync it.
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
    },
    /// `count` children that each start a direct read of a file in `dir` with Linux AIO and
    /// exit at once: the kernel waits for the read in exit_aio, after the child gave up its
    /// memory map (a sleep latencytop counts for the task but not in the global table).
    ExitAio {
        #[arg(long, default_value_t = 20)]
        count: u32,
        #[arg(long)]
        dir: PathBuf,
    },
    /// `count` short-lived children, each sleeping `sleep` once before it exits.
    Forks {
        #[arg(long, default_value_t = 1000)]
        count: u32,
        #[arg(long, value_parser = time::parse_duration, default_value = "50us")]
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
}

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
            let (mut max_ns, mut total_ns, mut slept) = (0u128, 0u128, 0u32);
            for _ in 0..*count {
                let switches = voluntary_switches();
                let t = std::time::Instant::now();
                nanosleep(*interval);
                let ns = t.elapsed().as_nanos();
                max_ns = max_ns.max(ns);
                total_ns += ns;
                slept += u32::from(voluntary_switches() > switches);
            }
            if *print_proc_latency {
                let text = std::fs::read_to_string("/proc/self/latency")
                    .context("reading /proc/self/latency (kernel without CONFIG_LATENCYTOP?)")?;
                print!("{text}");
            }
            finish_with(&format!(
                " max_ns={max_ns} total_ns={total_ns} slept={slept}"
            ));
            Ok(())
        }
        Workload::Fsync { count, dir } => {
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
            let _ = std::fs::remove_file(&path);
            finish();
            result
        }
        Workload::Pingpong {
            count,
            processes,
            cpu,
            apart,
        } => {
            if let Some(cpu) = cpu {
                pin(*cpu)?;
            }
            pingpong(*count, *processes, *apart, finish_with)
        }
        Workload::ExitAio { count, dir } => {
            let path = dir.join(format!("latprof-aio-{}", std::process::id()));
            let result = exit_aio(*count, &path);
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
        Workload::LoadedPrograms => {
            for program in aya::programs::loaded_programs() {
                let info = program.context("listing the kernel's BPF programs")?;
                println!("{}", info.name_as_str().unwrap_or("?"));
            }
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

fn nanosleep(d: Duration) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(d.subsec_nanos()),
    };
    // SAFETY: valid timespec; an interrupted sleep simply ends early.
    unsafe { libc::nanosleep(&raw const ts, std::ptr::null_mut()) };
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
fn bounce(count: u32, rx: &mut std::fs::File, tx: &mut std::fs::File, first: bool) -> Result<()> {
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
    if !first {
        let mut rest = Vec::new();
        rx.read_to_end(&mut rest)?;
    }
    Ok(())
}

/// With threads, `finish` gets ` slept=N`: the two threads' voluntary context switches during
/// the ping-pong (each one a sleep, nearly all in pipe_read), a lower bound for the tests.
fn pingpong(count: u32, processes: bool, apart: bool, finish: impl FnOnce(&str)) -> Result<()> {
    let (mut a_rx, mut b_tx) = pipe()?;
    let (mut b_rx, mut a_tx) = pipe()?;
    if processes {
        // SAFETY: single-threaded here; the child only does pipe I/O and _exit.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("fork"),
            0 => {
                drop((a_rx, a_tx));
                let pinned = !apart || pin(1).is_ok();
                let code =
                    i32::from(!pinned || bounce(count, &mut b_rx, &mut b_tx, false).is_err());
                // SAFETY: leave the child without running the parent's destructors.
                unsafe { libc::_exit(code) };
            }
            child => {
                drop((b_rx, b_tx));
                if apart {
                    pin(0)?;
                }
                let result = bounce(count, &mut a_rx, &mut a_tx, true);
                finish("");
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
        let handle = std::thread::spawn(move || {
            let before = voluntary_switches();
            let result = bounce(count, &mut b_rx, &mut b_tx, false);
            let _ = report.send((result, voluntary_switches() - before));
            let _ = released.recv();
        });
        let before = voluntary_switches();
        let result = bounce(count, &mut a_rx, &mut a_tx, true);
        let slept = voluntary_switches() - before;
        // The other side's last read ends at end of file.
        drop(a_tx);
        let (other, other_slept) = reported
            .recv()
            .map_err(|_| anyhow::anyhow!("ping-pong thread panicked"))?;
        finish(&format!(" slept={}", slept + other_slept));
        drop(release);
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("ping-pong thread panicked"))?;
        result.and(other)
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
fn exit_aio(count: u32, path: &std::path::Path) -> Result<()> {
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
            // One sleep first: latprof tracks a task from its first sleep, and a task first
            // seen already exiting is not tracked.
            nanosleep(Duration::from_millis(1));
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

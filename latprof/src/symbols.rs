//! Kernel symbolization from /proc/kallsyms, and latencytop's rule for which frames name a
//! cause.
use std::ops::Range;

use anyhow::{Context as _, Result, bail};

/// Kernel symbols sorted by address.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    /// (address, name as the kernel's `%ps` prints it: `sym` or `sym [module]`).
    syms: Vec<(u64, String)>,
    /// Scheduler text (`__sched` functions: schedule, io_schedule, do_nanosleep, ...).
    sched_text: Range<u64>,
    /// Lock text (spin_lock and friends), which the kernel's stack saving skips as well.
    lock_text: Range<u64>,
    /// The per-CPU symbols the waker programs place (`--wakers`), read in the same pass.
    percpu: PercpuSymbols,
}

/// Addresses of per-CPU variables in /proc/kallsyms (with CONFIG_KALLSYMS_ALL, as on Debian's
/// kernels); 0: absent, or hidden from this process (kptr_restrict).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PercpuSymbols {
    pub runqueues: u64,
    /// Linux 6.14 on, and before 6.2.
    pub preempt_count: u64,
    /// Linux 6.2 to 6.14: the preempt count is a member of it.
    pub pcpu_hot: u64,
}

impl Kallsyms {
    pub fn load() -> Result<Self> {
        let text = std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
        let syms = Self::parse(&text)?;
        if syms.syms.iter().all(|(addr, _)| *addr == 0) {
            bail!(
                "/proc/kallsyms shows no addresses: latprof needs root (or CAP_SYSLOG) to name kernel frames"
            );
        }
        Ok(syms)
    }

    pub fn parse(text: &str) -> Result<Self> {
        let mut syms = Vec::new();
        let mut marks = [0u64; 4];
        let mut percpu = PercpuSymbols::default();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            let names = [
                "__sched_text_start",
                "__sched_text_end",
                "__lock_text_start",
                "__lock_text_end",
            ];
            if let Some(i) = names.iter().position(|n| *n == name) {
                marks[i] = addr;
            }
            match name {
                "runqueues" => percpu.runqueues = addr,
                "__preempt_count" => percpu.preempt_count = addr,
                "pcpu_hot" => percpu.pcpu_hot = addr,
                _ => {}
            }
            // Data symbols never appear in backtraces.
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let name = match parts.next() {
                Some(module) => format!("{name} {module}"),
                None => name.to_owned(),
            };
            syms.push((addr, name));
        }
        if syms.is_empty() {
            bail!("/proc/kallsyms has no text symbols");
        }
        // Several names at one address (`__do_sys_vfork`, `__ia32_sys_vfork`,
        // `__x64_sys_vfork`): the kernel prints the first in kallsyms order, so that one stays
        // (the sort is stable, dedup keeps the first).
        syms.sort_by_key(|(addr, _)| *addr);
        syms.dedup_by_key(|(addr, _)| *addr);
        Ok(Self {
            syms,
            sched_text: marks[0]..marks[1],
            lock_text: marks[2]..marks[3],
            percpu,
        })
    }

    /// A table made of some symbols (as a recording stores them) and the two text ranges.
    #[must_use]
    pub fn from_parts(
        mut syms: Vec<(u64, String)>,
        sched_text: Range<u64>,
        lock_text: Range<u64>,
    ) -> Self {
        syms.sort_by_key(|(addr, _)| *addr);
        syms.dedup_by_key(|(addr, _)| *addr);
        Self {
            syms,
            sched_text,
            lock_text,
            percpu: PercpuSymbols::default(),
        }
    }

    /// The per-CPU symbols read with the table (all 0 in a recording's table).
    #[must_use]
    pub fn percpu(&self) -> PercpuSymbols {
        self.percpu
    }

    /// Scheduler text and lock text, the frames a cause skips.
    #[must_use]
    pub fn ranges(&self) -> (Range<u64>, Range<u64>) {
        (self.sched_text.clone(), self.lock_text.clone())
    }

    /// The symbol (start address and name) containing `addr`. A table holding only the entries
    /// this returns for a set of addresses names those addresses exactly as the full table does.
    #[must_use]
    pub fn entry(&self, addr: u64) -> Option<(u64, &str)> {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        i.checked_sub(1)
            .map(|i| (self.syms[i].0, self.syms[i].1.as_str()))
    }

    /// `addr` as a recording stores it, so that a file any user may read gives no kernel
    /// address away (KASLR): the rank of its symbol in this table (from 1) above the offset
    /// into the symbol (24 bits, clamped); 0 before the first symbol. The order of addresses is
    /// kept at every symbol's start, so the ranges of scheduler and lock text, published the
    /// same way, contain the same frames.
    #[must_use]
    pub fn public_addr(&self, addr: u64) -> u64 {
        const OFFSET_BITS: u32 = 24;
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        i.checked_sub(1).map_or(0, |i| {
            let offset = (addr - self.syms[i].0).min((1 << OFFSET_BITS) - 1);
            ((i as u64 + 1) << OFFSET_BITS) | offset
        })
    }

    /// The ranges of scheduler and lock text as [`Kallsyms::public_addr`] writes them.
    #[must_use]
    pub fn public_ranges(&self) -> (Range<u64>, Range<u64>) {
        let public = |r: &Range<u64>| self.public_addr(r.start)..self.public_addr(r.end);
        (public(&self.sched_text), public(&self.lock_text))
    }

    /// The function containing `addr`.
    #[must_use]
    pub fn name(&self, addr: u64) -> Option<&str> {
        self.entry(addr).map(|(_, name)| name)
    }

    /// The frames of a waker's backtrace (taken in `sched_waking`): the BPF program's and the
    /// tracing frames on top (up to the tracepoint's `bpf_trace_run` or `__traceiter_`) are
    /// dropped, so the first frame is the wakeup function. At most `depth` frames.
    #[must_use]
    pub fn waker_frames(&self, raw: &[u64], depth: usize) -> Vec<String> {
        let names: Vec<String> = raw
            .iter()
            .filter(|&&a| a != 0)
            .map(|&a| {
                self.name(a)
                    .map_or_else(|| format!("0x{a:x}"), str::to_owned)
            })
            .collect();
        let tracing = |name: &String| {
            ["bpf_trace_run", "__bpf_trace_", "__traceiter_"]
                .iter()
                .any(|p| name.starts_with(p))
        };
        // The tracing frames sit in the first few; a frame further down is the waker's own.
        let start = names.iter().take(8).rposition(tracing).map_or(0, |i| i + 1);
        names.into_iter().skip(start).take(depth).collect()
    }

    fn skipped(&self, addr: u64) -> bool {
        self.sched_text.contains(&addr) || self.lock_text.contains(&addr)
    }

    /// The frames that name a cause, as latencytop takes them: the tracing and BPF frames above
    /// the scheduler are dropped, then every frame in scheduler or lock text, so the first frame
    /// is the function that chose to sleep. At most `depth` frames.
    #[must_use]
    pub fn cause_frames(&self, raw: &[u64], depth: usize) -> Vec<String> {
        let first_sched = raw.iter().position(|&a| self.skipped(a)).unwrap_or(0);
        raw[first_sched..]
            .iter()
            .filter(|&&a| a != 0 && !self.skipped(a))
            .take(depth)
            .map(|&a| {
                self.name(a)
                    .map_or_else(|| format!("0x{a:x}"), str::to_owned)
            })
            .collect()
    }
}

/// A cause's backtrace as people read it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Backtrace {
    /// Kernel frames, innermost first, the function that chose to sleep first.
    Frames(Vec<String>),
    /// Run-queue latency (from wakeup to running): no backtrace to take.
    WaitingForCpu,
    /// A sleep whose backtrace the kernel could not store.
    Unavailable,
    /// A sleep recovered after its wakeup was hidden from tracing: its backtrace was to be
    /// taken at that wakeup.
    WakeupHidden,
}

impl Backtrace {
    /// The text shown for [`Backtrace::Unavailable`], also its reason.
    pub const UNAVAILABLE: &'static str = "[stack unavailable]";
    /// The text shown for [`Backtrace::WaitingForCpu`].
    pub const WAITING_FOR_CPU: &'static str = "[waiting for CPU]";
    /// The text shown for [`Backtrace::WakeupHidden`], also its reason.
    pub const WAKEUP_HIDDEN: &'static str = "[wakeup hidden from tracing]";

    /// The backtrace of a stack id, from its raw instruction pointers where they are known.
    #[must_use]
    pub fn of(stack_id: u64, raw: Option<&[u64]>, syms: &Kallsyms, depth: usize) -> Self {
        if stack_id == latprof_common::RUNQ_STACK {
            return Self::WaitingForCpu;
        }
        if stack_id == latprof_common::RECOVERED_STACK {
            return Self::WakeupHidden;
        }
        let frames = raw
            .filter(|_| stack_id != latprof_common::NO_STACK)
            .map(|raw| syms.cause_frames(raw, depth))
            .unwrap_or_default();
        if frames.is_empty() {
            Self::Unavailable
        } else {
            Self::Frames(frames)
        }
    }

    /// The lines shown for it: its frames, or one bracketed word for the two without.
    #[must_use]
    pub fn lines(&self) -> Vec<&str> {
        match self {
            Self::Frames(frames) => frames.iter().map(String::as_str).collect(),
            Self::WaitingForCpu => vec![Self::WAITING_FOR_CPU],
            Self::Unavailable => vec![Self::UNAVAILABLE],
            Self::WakeupHidden => vec![Self::WAKEUP_HIDDEN],
        }
    }

    /// Its lines joined by `sep`.
    #[must_use]
    pub fn join(&self, sep: &str) -> String {
        self.lines().join(sep)
    }
}

impl Ord for Backtrace {
    /// By the text shown, so that tables list ties in the order people read.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.lines().cmp(&other.lines())
    }
}

impl PartialOrd for Backtrace {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81100000 T bpf_trace_run4
ffffffff81100100 t __traceiter_sched_switch
ffffffff81200000 T hrtimer_nanosleep
ffffffff81200200 T common_nsleep
ffffffff81200400 T __x64_sys_clock_nanosleep
ffffffff81300000 T do_syscall_64
ffffffff81400000 T __sched_text_start
ffffffff81400010 t __schedule
ffffffff81400400 T schedule
ffffffff81400800 T do_nanosleep
ffffffff81401000 T __sched_text_end
ffffffff81401000 T __lock_text_start
ffffffff81401010 T _raw_spin_lock_irqsave
ffffffff81402000 T __lock_text_end
ffffffff81500000 D some_data
ffffffffc0000000 t ext4_sync_file\t[ext4]
";

    #[test]
    fn an_address_with_several_names_gets_the_first_as_the_kernel_prints() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000100 T __do_sys_vfork\n\
             ffffffff81000100 T __ia32_sys_vfork\n\
             ffffffff81000100 T __x64_sys_vfork\n\
             ffffffff81000200 T kernel_clone\n",
        )
        .unwrap();
        assert_eq!(k.name(0xffff_ffff_8100_0150), Some("__do_sys_vfork"));
        assert_eq!(k.name(0xffff_ffff_8100_0200), Some("kernel_clone"));
    }

    #[test]
    fn names_addresses_inside_functions() {
        let k = Kallsyms::parse(KALLSYMS).unwrap();
        assert_eq!(k.name(0xffff_ffff_8120_0010), Some("hrtimer_nanosleep"));
        assert_eq!(k.name(0xffff_ffff_8120_0200), Some("common_nsleep"));
        assert_eq!(k.name(0xffff_ffff_c000_0042), Some("ext4_sync_file [ext4]"));
        assert_eq!(k.name(0x10), None);
        // Data symbols are not functions: an address after some_data is still in the last text.
        assert_eq!(k.name(0xffff_ffff_8150_0010), Some("__lock_text_end"));
    }

    #[test]
    fn cause_frames_start_where_the_task_chose_to_sleep() {
        let k = Kallsyms::parse(KALLSYMS).unwrap();
        let raw = [
            0xffff_ffff_8110_0010, // bpf_trace_run4 (tracing)
            0xffff_ffff_8110_0110, // __traceiter_sched_switch (tracing)
            0xffff_ffff_8140_0020, // __schedule
            0xffff_ffff_8140_0410, // schedule
            0xffff_ffff_8140_0810, // do_nanosleep
            0xffff_ffff_8120_0010, // hrtimer_nanosleep
            0xffff_ffff_8140_1020, // _raw_spin_lock_irqsave (lock text, skipped)
            0xffff_ffff_8120_0210, // common_nsleep
            0xffff_ffff_8120_0410, // __x64_sys_clock_nanosleep
            0xffff_ffff_8130_0010, // do_syscall_64
        ];
        assert_eq!(
            k.cause_frames(&raw, 12),
            [
                "hrtimer_nanosleep",
                "common_nsleep",
                "__x64_sys_clock_nanosleep",
                "do_syscall_64"
            ]
        );
        assert_eq!(
            k.cause_frames(&raw, 2),
            ["hrtimer_nanosleep", "common_nsleep"]
        );
        // Without any scheduler frame nothing is dropped from the top.
        assert_eq!(k.cause_frames(&raw[5..6], 12), ["hrtimer_nanosleep"]);
        assert_eq!(k.cause_frames(&[], 12), Vec::<String>::new());
    }

    /// The per-CPU variables the waker programs place come from the same read as the text
    /// symbols (data symbols, never in a backtrace).
    #[test]
    fn per_cpu_symbols_are_read_with_the_table() {
        let text = format!("{KALLSYMS}0000000000034a00 D runqueues\n0000000000032000 D pcpu_hot\n");
        let syms = Kallsyms::parse(&text).unwrap();
        assert_eq!(
            syms.percpu(),
            PercpuSymbols {
                runqueues: 0x34a00,
                preempt_count: 0,
                pcpu_hot: 0x32000,
            }
        );
        assert_ne!(syms.name(0x34a00), Some("runqueues"));
    }
}

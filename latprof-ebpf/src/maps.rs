//! Every map of the object, with the value types that only the eBPF side uses (the types that
//! cross to user space are in latprof-common), and the counters' one-line helpers. The symbol
//! names are user space's (`latprof/src/probe/names.rs`): do not rename them.

use crate::settings::skipped;
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{Array, CgroupArray, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use latprof_common::{
    CACHE_FRAMES, COUNTER_COUNT, CachedStack, CauseParts, CgroupCause, ChainKey, ChainValue,
    Counter, CpuSwitch, GlobalRecord, HIDDEN_SLEEP_SHORT, HiddenEvent, Histogram, ProcUnwind,
    RawStack, SKIP_COUNTERS, STACK_REGION, StackCache, TICK_COUNTER_COUNT, TaskState, TickCounter,
    UNWIND_PROCESSES, UNWIND_TABLE_ROWS, UserStack, WakerKey, WakerValue,
};

/// Words of `STACK_COPY`: the part of a sleeping task's stack the stack cache reads.
pub(crate) const REGION_WORDS: usize = STACK_REGION / 8;

/// Per-task state, keyed by tid, where the run has no task slots (`task_table`; one unused
/// entry where it has). Only events of that task touch its entry.
#[map]
pub(crate) static TASKS: HashMap<u32, TaskState> = HashMap::with_max_entries(8192, 0);
/// Global causes keyed by stack id: every event in normal mode, exits (and overflow) in lazy.
#[map]
pub(crate) static GLOBAL_LATENCY: HashMap<u64, GlobalRecord> = HashMap::with_max_entries(16384, 0);
/// Lazy mode's exit merges, per CPU; user space adds them to `GLOBAL_LATENCY`.
#[map]
pub(crate) static MERGED: PerCpuHashMap<u64, GlobalRecord> =
    PerCpuHashMap::with_max_entries(16384, 0);
/// Kernel backtraces keyed by the hash of their frames.
#[map]
pub(crate) static STACKS: HashMap<u64, RawStack> = HashMap::with_max_entries(8192, 0);
/// Latency histograms per cause and cgroup, per CPU: no cache line is shared between CPUs.
#[map]
pub(crate) static HISTOGRAMS: PerCpuHashMap<CgroupCause, Histogram> =
    PerCpuHashMap::with_max_entries(16384, 0);
/// Per cgroup and cause, per CPU: the records of exited tasks (in both modes; user space adds
/// the live tasks' own records, which carry their cgroup), and those past a task's
/// `TASK_RECORDS`. Written at exit, never per event: no cache line shared on the hot path.
#[map]
pub(crate) static CGROUP_LATENCY: PerCpuHashMap<CgroupCause, GlobalRecord> =
    PerCpuHashMap::with_max_entries(16384, 0);
/// `--cgroup`: the cgroups (directory descriptors) whose tasks, and their descendants', are
/// traced; the first `FILTER_CGROUPS` slots are set.
#[map]
pub(crate) static CGROUP_FILTER: CgroupArray = CgroupArray::with_max_entries(8, 0);
/// User backtraces (`--user-stacks`) keyed by `user_stack_hash` (1 entry when off).
#[map]
pub(crate) static USER_STACKS: HashMap<u64, UserStack> = HashMap::with_max_entries(8192, 0);
/// Per-CPU buffer a user backtrace is walked into.
#[map]
pub(crate) static USER_BUF: PerCpuArray<UserStack> = PerCpuArray::with_max_entries(1, 0);
/// The kernel and user parts of each combined cause id (1 entry when off).
#[map]
pub(crate) static CAUSE_PARTS: HashMap<u64, CauseParts> = HashMap::with_max_entries(16384, 0);
/// Unwind tables' rows of all files (`--user-stacks`; 1 entry when off): `unwind`.
#[map]
pub(crate) static UNWIND_ROWS: Array<u64> = Array::with_max_entries(UNWIND_TABLE_ROWS, 0);
/// Where each process (by layout) maps files with unwind tables (1 entry when off).
#[map]
pub(crate) static UNWIND_PROCS: LruHashMap<u64, ProcUnwind> =
    LruHashMap::with_max_entries(UNWIND_PROCESSES, 0);
/// Per CPU: where the walk by the unwind tables stands (`unwind`).
#[map]
pub(crate) static UNWIND_WALK: PerCpuArray<UnwindWalk> = PerCpuArray::with_max_entries(1, 0);

/// Where a walk by the unwind tables stands: the instruction pointer, stack pointer and frame
/// pointer of its last frame, and what user space's own unwinding takes up from: the frames up
/// to the last one a table stepped to (`stepped`, the first frame counted: 1 where none) and
/// that frame's stack pointer (`win_sp`); the process's ranges, copied once for the walk.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UnwindWalk {
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    /// The link register at the syscall (arm64; 0 elsewhere): the first step's return
    /// address where its rule says it is still there.
    pub(crate) lr: u64,
    /// 1 where `sp` is the frame's stack pointer; 0 after an arm64 frame-pointer step, which
    /// leaves it unknown (see `unwind::step`).
    pub(crate) sp_known: u64,
    pub(crate) win_sp: u64,
    pub(crate) stepped: u64,
    /// Scratch: the index of the range a step's address lies in (`unwind::rule`).
    pub(crate) range: u64,
    /// 1 where the process has tables (`UNWIND_PROCS`), then copied into `process`.
    pub(crate) tables: u64,
    pub(crate) process: ProcUnwind,
    /// The highest address of the stack a step read (`TaskState::user_top` for the next walk).
    pub(crate) top: u64,
    /// The stack from `window_base` (the walk's first stack pointer), `window_len` bytes of it
    /// read at the walk's start into this CPU's `unwind::STACK_WINDOWS` entry (`window_cpu`),
    /// where the steps take their words from.
    pub(crate) window_base: u64,
    pub(crate) window_len: u64,
    pub(crate) window_cpu: u32,
}
/// First sightings of user backtraces (`UserSeen`), for user space to read the process's
/// memory map while it lives.
#[map]
pub(crate) static USER_SEEN: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);
/// Per-CPU buffer the stack is walked into.
#[map]
pub(crate) static STACK_BUF: PerCpuArray<RawStack> = PerCpuArray::with_max_entries(1, 0);
/// Pipeline counters, one slot per `Counter`, per CPU so no cache line is shared.
#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);
/// Spike events for user space.
#[map]
pub(crate) static SPIKES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);
/// Slot 0 is 1 while the spike reader is about to sleep (or sleeping) and wants a wakeup.
#[map]
pub(crate) static READER: Array<u64> = Array::with_max_entries(1, 0);
/// Per CPU: (second, anomalies logged in it), to rate-limit debug logging.
#[map]
pub(crate) static DEBUG_LOG_BUDGET: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);
/// Tick and time-accounting counters, one slot per `TickCounter`, per CPU.
#[map]
pub(crate) static TICKS: PerCpuArray<u64> = PerCpuArray::with_max_entries(TICK_COUNTER_COUNT, 0);
/// Per-CPU copy of the part of a sleeping task's kernel stack the stack cache looks at.
#[map]
pub(crate) static STACK_COPY: PerCpuArray<[u64; REGION_WORDS]> =
    PerCpuArray::with_max_entries(1, 0);
/// Per-CPU: where a task's user registers sit above its stack's lowest address, in bytes (0:
/// not found yet), found once with `bpf_task_pt_regs` (`stack_cache::user_regs`).
#[map]
pub(crate) static REGS_IN_STACK: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU: frames of the last walk (in `STACK_BUF`).
#[map]
pub(crate) static WALKED_FRAMES: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU stack cache, shared by the tasks woken on that CPU.
#[map]
pub(crate) static CPU_CACHE: PerCpuArray<StackCache> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU scratch for a stack cache entry being learnt.
#[map]
pub(crate) static LEARNT: PerCpuArray<CachedStack> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU progress of the stack cache's scan, in a map rather than in the callback's context
/// so the verifier does not track the count (verifier rule 3 in `stack_cache`).
#[map]
pub(crate) static SCAN_POS: PerCpuArray<ScanPos> = PerCpuArray::with_max_entries(1, 0);

/// `SCAN_POS`'s value: how many of the walked frames the scan has found, and where each sits
/// (in words from the saved stack pointer).
#[repr(C)]
pub(crate) struct ScanPos {
    pub(crate) found: u64,
    pub(crate) pos: [u16; CACHE_FRAMES],
}
/// Each CPU's last seen switch, to count the switches the kernel ran no program for.
#[map]
pub(crate) static LAST_SWITCH: PerCpuArray<CpuSwitch> = PerCpuArray::with_max_entries(1, 0);
/// Gaps in what the kernel showed latprof, and the sleeps lost or recovered in them
/// (`HiddenEvent`); user space matches them. Sent without waking the reader, which drains it
/// at each snapshot.
#[map]
pub(crate) static HIDDEN: RingBuf = RingBuf::with_byte_size(HIDDEN_BYTES, 0);
/// `HIDDEN`'s size.
const HIDDEN_BYTES: u32 = 128 * 1024;
/// Each exiting task's records (`ExitedTask`, with `EXITS_ON`), so that user space can tell
/// which process and thread slept after the task is gone. Sent without waking the reader,
/// which drains it at each snapshot; full, an exit is counted in `ExitsUnlogged`.
#[map]
pub(crate) static EXITED: RingBuf = RingBuf::with_byte_size(512 * 1024, 0);
/// 1 once any CPU saw a hidden switch (`note_switch`): from then on each sleep keeps the run
/// time and wait its recovery needs; before, that cost is not paid. Written once, read by
/// every sleep: the cache line stays shared.
#[map]
pub(crate) static HIDING_SEEN: Array<u32> = Array::with_max_entries(1, 0);
/// Who ended the sleeps of each cause, per sleeping process, per CPU (`wakers`): written at
/// each counted wakeup in both modes, no cache line shared between CPUs.
#[map]
pub(crate) static WAKERS: PerCpuHashMap<WakerKey, WakerValue> =
    PerCpuHashMap::with_max_entries(8192, 0);
/// Per cause and sleeping process, per CPU: the sleeps whose waker found `WAKERS` full
/// (`WakerKey::kind` is `WAKER_OTHER`).
#[map]
pub(crate) static WAKERS_OTHER: PerCpuHashMap<WakerKey, WakerValue> =
    PerCpuHashMap::with_max_entries(8192, 0);
/// Per cause and sleeping process, waker process and what the waker's most recent sleep was,
/// per CPU (`chains`, `--chains`): written at each counted wakeup a task made, no cache line
/// shared between CPUs.
#[map]
pub(crate) static CHAINS: PerCpuHashMap<ChainKey, ChainValue> =
    PerCpuHashMap::with_max_entries(8192, 0);
/// Per CPU: where its preempt count lives and the timer callbacks running (`wakers`).
#[map]
pub(crate) static CPU_CONTEXT: PerCpuArray<CpuContext> = PerCpuArray::with_max_entries(1, 0);

/// `CPU_CONTEXT`'s value.
#[repr(C)]
pub(crate) struct CpuContext {
    /// Address of this CPU's preempt count (0: not found yet).
    pub(crate) pc_addr: u64,
    /// Per level of context (task, softirq, hard interrupt, NMI): 1 while a timer callback
    /// runs at it.
    pub(crate) timer: [u32; 4],
}

/// `--debug-defect`: per CPU, the cause of the last sleep counted there, and the last other
/// cause counted before it (`defects`).
#[map]
pub(crate) static DEFECT_LAST: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// Per-CPU scratch space to build a new task entry (too large for the 512-byte stack).
#[map]
pub(crate) static SCRATCH: PerCpuArray<TaskState> = PerCpuArray::with_max_entries(1, 0);

/// Logs an event to `HIDDEN` (counted in `HiddenLogFull` when it is full): `ids` is the task's
/// `ids(tid, tgid)` (five arguments at most for a BPF function). Rare: only where the kernel
/// hid something.
/// A task's tid and tgid in one argument, as `bpf_get_current_pid_tgid` returns them.
#[inline(always)]
pub(crate) fn ids(tid: u32, tgid: u32) -> u64 {
    (u64::from(tgid) << 32) | u64::from(tid)
}

#[inline(never)]
pub(crate) fn log_hidden(kind: u32, ids: u64, start_ns: u64, end_ns: u64, woken_ns: u64) {
    let event = HiddenEvent {
        kind,
        // SAFETY: a helper without arguments.
        cpu: unsafe { bpf_get_smp_processor_id() },
        tid: ids as u32,
        tgid: (ids >> 32) as u32,
        start_ns,
        end_ns,
        woken_ns,
    };
    if HIDDEN.output(&event, u64::from(BPF_RB_NO_WAKEUP)).is_err() {
        count(Counter::HiddenLogFull);
    }
}

/// A sleep of `ids` from `start_ns` to `end_ns`, shorter than `MIN_SLEEP_NS`: not counted, like
/// latencytop (`SkippedZero`), and logged to `HIDDEN` so that its process is told what its
/// numbers leave out, while the log is at most half full: its room goes to the gaps first
/// (`ShortUnlogged` past that). Rare: a task woken within a microsecond of leaving its CPU.
#[inline(never)]
pub(crate) fn short_sleep(ids: u64, start_ns: u64, end_ns: u64) {
    count(Counter::SkippedZero);
    if HIDDEN.query(u64::from(BPF_RB_AVAIL_DATA)) > u64::from(HIDDEN_BYTES / 2) {
        count(Counter::ShortUnlogged);
    } else {
        log_hidden(HIDDEN_SLEEP_SHORT, ids, start_ns, end_ns, 0);
    }
}

/// Adds one to this CPU's slot of `counter` in `COUNTERS`.
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    count_n(counter, 1);
}

/// Adds `n` to this CPU's slot of `counter` in `COUNTERS`.
#[inline(always)]
pub(crate) fn count_n(counter: Counter, n: u64) {
    if skipped(SKIP_COUNTERS) {
        return;
    }
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot; programs on one CPU do not run concurrently.
        unsafe { *slot += n };
    }
}

/// Adds one to this CPU's slot of `counter` in `TICKS`.
#[inline(always)]
pub(crate) fn tick_count(counter: TickCounter) {
    if skipped(SKIP_COUNTERS) {
        return;
    }
    if let Some(slot) = TICKS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot; programs on one CPU do not run concurrently.
        unsafe { *slot += 1 };
    }
}

//! The kernel memory latprof's maps pin, estimated before anything loads, so that table sizes
//! the machine cannot hold are refused with one line rather than taken from everything else
//! (`--max-tasks 4194304` alone pins 8.6 GiB).
//!
//! The hash maps are preallocated: the kernel allocates every entry when the map is created,
//! used or not. Their size follows the kernel's own accounting (`htab_map_mem_usage`, what
//! `/proc/PID/fdinfo` shows as `memlock`): a bucket per power of two of entries, and an element
//! of 48 bytes of links and hash, the key and the value (for a per-CPU map a pointer, and the
//! value once per possible CPU). What the defaults pin is in docs/bench.md ("Measured while
//! building"); `tests/lifecycle.rs` checks the estimate against the kernel's own account on
//! every run.
use std::path::Path;

use anyhow::{Result, bail};
use latprof_common::{
    CauseParts, ChainKey, ChainValue, GlobalRecord, Histogram, ProcUnwind, RawStack, TaskState,
    UNWIND_PROCESSES, UNWIND_RULE_BITS, UNWIND_RULE_SLOT, UNWIND_TABLE_ROWS, USER_STACK_WINDOW,
    UserStack, WakerKey, WakerValue,
};

use super::ProbeConfig;

/// `struct htab_elem` on 64-bit kernels: list node, free-list link, per-CPU pointer, hash.
const HTAB_ELEM: u64 = 48;
/// `struct bucket`: list head and lock.
const BUCKET: u64 = 16;
/// `struct bpf_htab` and its per-CPU lock counters, per map (rounded up).
const HTAB_FIXED: u64 = 1024;
/// The maps of fixed size: four ring buffers (spikes, hidden log, exited tasks, aya-log) and
/// the bookkeeping of the rest.
const FIXED: u64 = 1088 << 10;
/// The per-CPU arrays of fixed size (stack buffers, the stack cache, scratch), per CPU.
const FIXED_PER_CPU: u64 = 8 << 10;
/// `struct bpf_array`, per array map (rounded up).
const ARRAY_FIXED: u64 = 1024;

const fn round8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Bytes the kernel allocates for a preallocated hash map.
fn hash_map(entries: u32, key: usize, value: usize, per_cpu: bool, cpus: u64) -> u64 {
    let entries = u64::from(entries);
    let (key, value) = (round8(key as u64), round8(value as u64));
    let buckets = entries.next_power_of_two() * BUCKET;
    if per_cpu {
        buckets + entries * (HTAB_ELEM + key + 8 + value * cpus) + HTAB_FIXED
    } else {
        // A spare element per CPU, for updates that replace an entry.
        buckets + (entries + cpus) * (HTAB_ELEM + key + value) + HTAB_FIXED
    }
}

/// An array map of `entries` values of `value` bytes.
fn array(entries: u32, value: u64) -> u64 {
    u64::from(entries) * round8(value) + ARRAY_FIXED
}

/// An array map of `entries` values of `value` bytes that user space can map
/// (`BPF_F_MMAPABLE`): its header and its values each take whole pages.
fn mmapable_array(entries: u32, value: u64) -> u64 {
    const PAGE: u64 = 4096;
    ARRAY_FIXED.div_ceil(PAGE) * PAGE + (u64::from(entries) * round8(value)).div_ceil(PAGE) * PAGE
}

/// A per-CPU array map of `entries` values of `value` bytes on each of `cpus` CPUs (and a
/// pointer per entry).
fn per_cpu_array(entries: u32, value: u64, cpus: u64) -> u64 {
    u64::from(entries) * (round8(value) * cpus + 8) + ARRAY_FIXED
}

/// What the maps sized by the command line pin, and all of them together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// `--max-tasks`: the task table.
    pub tasks: u64,
    /// `--max-records`: the global table, the lazy merges, the histograms and the per-cgroup
    /// table (the last three per CPU).
    pub records: u64,
    /// `--max-stacks`: the backtraces.
    pub stacks: u64,
    /// `--max-wakers`: the waker table and its overflow's (per CPU; none without `--wakers`).
    pub wakers: u64,
    /// `--max-chains`: the chain table (per CPU; none without `--chains`).
    pub chains: u64,
    /// `--max-user-stacks`: the user backtraces, and the kernel + user causes' parts (one
    /// entry each without `--user-stacks`).
    pub user_stacks: u64,
    pub total: u64,
}

/// The kernel memory `config`'s maps pin on a machine with `cpus` possible CPUs.
#[must_use]
pub fn estimate(config: &ProbeConfig, cpus: u64) -> Estimate {
    // The task slots and their owner words where the kernel has compare-and-swap, else the
    // hash: the hash's estimate, the larger by its links and buckets (3% here), and the owner
    // words hold for both.
    let tasks = hash_map(config.max_tasks, 4, size_of::<TaskState>(), false, cpus)
        + array(1, size_of::<TaskState>() as u64)
        + mmapable_array(config.max_tasks, 8);
    let records = hash_map(
        config.max_records,
        8,
        size_of::<GlobalRecord>(),
        false,
        cpus,
    ) + hash_map(config.max_records, 8, size_of::<GlobalRecord>(), true, cpus)
        + hash_map(config.max_records, 16, size_of::<Histogram>(), true, cpus)
        + hash_map(
            config.max_records,
            16,
            size_of::<GlobalRecord>(),
            true,
            cpus,
        );
    let stacks = hash_map(config.max_stacks, 8, size_of::<RawStack>(), false, cpus);
    // The waker table and its overflow's, unused at their smallest without --wakers.
    let wakers = 2 * hash_map(
        if config.wakers { config.max_wakers } else { 1 },
        size_of::<WakerKey>(),
        size_of::<WakerValue>(),
        true,
        cpus,
    );
    let chains = hash_map(
        if config.chains_on() {
            config.max_chains
        } else {
            1
        },
        size_of::<ChainKey>(),
        size_of::<ChainValue>(),
        true,
        cpus,
    );
    let (user, parts) = if config.user_stacks {
        (config.max_user_stacks, config.max_records)
    } else {
        (1, 1)
    };
    let (rows, processes, rules, windows) = if config.user_stacks {
        (
            UNWIND_TABLE_ROWS,
            UNWIND_PROCESSES,
            1 << UNWIND_RULE_BITS,
            u32::try_from(cpus).unwrap_or(u32::MAX),
        )
    } else {
        (1, 1, 1, 1)
    };
    let user_stacks = hash_map(user, 8, size_of::<UserStack>(), false, cpus)
        + hash_map(parts, 8, size_of::<CauseParts>(), false, cpus)
        + array(rows, 8)
        + hash_map(processes, 8, size_of::<ProcUnwind>(), false, cpus)
        + per_cpu_array(rules, UNWIND_RULE_SLOT, cpus)
        + array(windows, (USER_STACK_WINDOW * 8) as u64);
    Estimate {
        tasks,
        records,
        stacks,
        wakers,
        chains,
        user_stacks,
        total: tasks
            + records
            + stacks
            + wakers
            + chains
            + user_stacks
            + FIXED
            + FIXED_PER_CPU * cpus,
    }
}

/// `MemAvailable` of `/proc/meminfo` in bytes: what can be allocated without swapping.
#[must_use]
pub fn mem_available(meminfo: &Path) -> Option<u64> {
    std::fs::read_to_string(meminfo)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// `1.5 GiB`, `394 MiB`, `512 KiB`.
#[must_use]
pub fn format_bytes(n: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "sizes for people")]
    let f = n as f64;
    if n >= 1 << 30 {
        format!("{:.1} GiB", f / f64::from(1u32 << 30))
    } else if n >= 1 << 20 {
        format!("{:.0} MiB", f / f64::from(1u32 << 20))
    } else {
        format!("{:.0} KiB", f / 1024.0)
    }
}

/// Refuses table sizes whose maps would pin more than half of the memory available now
/// (`available`, or the least of `MemAvailable` and what latprof's cgroup leaves it: the maps
/// are charged there; nothing is refused where the kernel does not say).
pub fn check(config: &ProbeConfig, available: Option<u64>) -> Result<()> {
    let available = available.or_else(|| {
        let machine = mem_available(Path::new("/proc/meminfo"));
        match (machine, super::cgroup_room::room()) {
            (Some(m), Some(c)) => Some(m.min(c)),
            (m, c) => m.or(c),
        }
    });
    let Some(available) = available else {
        return Ok(());
    };
    let cpus = crate::cpus::possible();
    let e = estimate(config, cpus);
    if e.total <= available / 2 {
        return Ok(());
    }
    let largest = [
        (e.tasks, "--max-tasks"),
        (e.records, "--max-records"),
        (e.stacks, "--max-stacks"),
        (e.wakers, "--max-wakers"),
        (e.chains, "--max-chains"),
        (e.user_stacks, "--max-user-stacks"),
    ]
    .into_iter()
    .max()
    .map_or("--max-tasks", |(_, flag)| flag);
    bail!(
        "the kernel tables would pin about {} of memory (--max-tasks {}: {}, --max-records {}: {}, --max-stacks {}: {}, --max-wakers {}: {}, --max-chains {}: {}, --max-user-stacks {}: {}; {cpus} possible CPUs), over half of the {} available; lower {largest}",
        format_bytes(e.total),
        config.max_tasks,
        format_bytes(e.tasks),
        config.max_records,
        format_bytes(e.records),
        config.max_stacks,
        format_bytes(e.stacks),
        config.max_wakers,
        format_bytes(e.wakers),
        config.max_chains,
        format_bytes(e.chains),
        config.max_user_stacks,
        format_bytes(e.user_stacks),
        format_bytes(available),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_own_numbers() {
        // /proc/PID/fdinfo `memlock` of latprof's maps with the default sizes, Linux 6.18 with
        // 2 possible CPUs.
        let records = 16384;
        for (what, bytes, measured) in [
            (
                "TASK_SLOTS",
                array(8192, size_of::<TaskState>() as u64),
                17_432_888,
            ),
            ("SLOT_TIDS", mmapable_array(8192, 8), 69_632),
            (
                "TASKS",
                hash_map(8192, 4, size_of::<TaskState>(), false, 2),
                18_027_680,
            ),
            (
                "WAKERS",
                hash_map(8192, 32, size_of::<WakerValue>(), true, 2),
                1_508_288,
            ),
            (
                "CHAINS",
                hash_map(8192, 32, size_of::<ChainValue>(), true, 2),
                1_639_296,
            ),
            (
                "GLOBAL_LATENCY",
                hash_map(records, 8, size_of::<GlobalRecord>(), false, 2),
                1_574_000,
            ),
            (
                "MERGED",
                hash_map(records, 8, size_of::<GlobalRecord>(), true, 2),
                2_098_112,
            ),
            (
                "HISTOGRAMS",
                hash_map(records, 16, size_of::<Histogram>(), true, 2),
                5_637_056,
            ),
            (
                "CGROUP_LATENCY",
                hash_map(records, 16, size_of::<GlobalRecord>(), true, 2),
                2_229_184,
            ),
            (
                "STACKS",
                hash_map(8192, 8, size_of::<RawStack>(), false, 2),
                8_916_016,
            ),
            (
                "USER_STACKS",
                hash_map(8192, 8, size_of::<UserStack>(), false, 2),
                13_373_488,
            ),
            (
                "CAUSE_PARTS",
                hash_map(records, 8, size_of::<CauseParts>(), false, 2),
                1_442_912,
            ),
            ("UNWIND_ROWS", array(UNWIND_TABLE_ROWS, 8), 2_097_464),
            (
                "UNWIND_PROCS",
                hash_map(UNWIND_PROCESSES, 8, size_of::<ProcUnwind>(), false, 2),
                1_344_384,
            ),
        ] {
            assert!(
                bytes.abs_diff(measured) < 1024,
                "{what}: {bytes} vs {measured}"
            );
        }
        // About 42.6 MB for all maps with --wakers (the task table estimated as the hash);
        // without, the two waker tables hold one entry.
        let wakers = ProbeConfig {
            wakers: true,
            ..ProbeConfig::default()
        };
        let e = estimate(&wakers, 2);
        assert!(e.total.abs_diff(42_648_608) < 42_648_608 / 100, "{e:?}");
        // Each of the six user stack maps at one entry (the stack window's one entry is its
        // 16 KiB).
        assert!(e.user_stacks < 32768, "{e:?}");
        let user = estimate(
            &ProbeConfig {
                user_stacks: true,
                ..ProbeConfig::default()
            },
            2,
        );
        assert!(
            user.user_stacks
                .abs_diff(13_373_488 + 1_442_912 + 2_097_464 + 1_344_384 + 41_272 + 33_080)
                < 4096,
            "{user:?}"
        );
        let without = estimate(&ProbeConfig::default(), 2);
        assert!(without.wakers < 8192, "{without:?}");
        let big = ProbeConfig {
            max_tasks: 4_194_304,
            ..ProbeConfig::default()
        };
        assert_eq!(format_bytes(estimate(&big, 2).tasks), "8.6 GiB");
    }

    #[test]
    fn over_half_of_what_is_available_is_refused() {
        let config = ProbeConfig {
            max_tasks: 1 << 20,
            ..ProbeConfig::default()
        };
        let err = check(&config, Some(2 << 30)).unwrap_err().to_string();
        assert!(err.contains("lower --max-tasks"), "{err}");
        assert!(err.contains("of the 2.0 GiB available"), "{err}");
        check(&ProbeConfig::default(), Some(2 << 30)).expect("the defaults fit in 2 GiB");
        // The user backtraces' table is named when it is the one too large.
        let config = ProbeConfig {
            user_stacks: true,
            max_user_stacks: 1 << 20,
            ..ProbeConfig::default()
        };
        let err = check(&config, Some(2 << 30)).unwrap_err().to_string();
        assert!(err.contains("lower --max-user-stacks"), "{err}");
    }
}

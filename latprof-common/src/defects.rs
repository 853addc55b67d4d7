//! Defects injected on purpose (`--debug-defect NAME`, hidden): one wrong answer of each kind
//! the kernel programs give, made in about one event in N of its kind, so that the suite can
//! show which of its tests catch which kind (`cargo xtask mutants`, `latprof/tests/must_fail`).
//!
//! The programs read the kind and N from settings (`DEBUG_DEFECT`, `DEBUG_DEFECT_ONE_IN`):
//! without the flag both are 0 and every defect's branch is dead code the verifier removes.

/// No defect (the `DEBUG_DEFECT` of every normal run).
pub const DEFECT_NONE: u32 = 0;
/// A counted sleep vanishes, counted nowhere.
pub const DEFECT_DROP_SLEEP: u32 = 1;
/// A counted sleep's duration is doubled.
pub const DEFECT_DURATION: u32 = 2;
/// A sleep is counted under the last cause other than its own counted on its CPU (another
/// backtrace, often another process's), or under no backtrace where there is none.
pub const DEFECT_WRONG_CAUSE: u32 = 3;
/// A sleep a task woke is told as woken by the sleeper itself (waker table and chains).
pub const DEFECT_WRONG_WAKER: u32 = 4;
/// A sleep is counted in the root cgroup (id 1) instead of its task's.
pub const DEFECT_WRONG_CGROUP: u32 = 5;
/// A user backtrace has its second and third frames swapped (a frame for its neighbour).
pub const DEFECT_USER_FRAME: u32 = 6;
/// A chain link names the sleeper's own previous sleep where it names the waker's.
pub const DEFECT_CHAIN_LINK: u32 = 7;
/// A run-queue wait is counted as a sleep, under the cause of the sleep counted before it on
/// its CPU.
pub const DEFECT_RUNQ_AS_SLEEP: u32 = 8;
/// An exiting task's record is merged twice into the global and per-cgroup tables.
pub const DEFECT_MERGE_TWICE: u32 = 9;

/// A defect: its kind (`DEFECT_*`), its name on the command line, its N (about one event in N
/// of its kind is made wrong), and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defect {
    pub kind: u32,
    pub name: &'static str,
    pub one_in: u32,
    pub what: &'static str,
}

/// Every defect, in `DEFECT_*` order.
///
/// N is chosen so that a test's workload meets its defect with a probability over 1 - 1e-6:
/// a workload of k events of the kind escapes with probability (1 - 1/N)^k, under 1e-6 when
/// k > ln(1e6) / -ln(1 - 1/N), about 13.8 N. With N = 4, 49 events; with N = 2, 20; N = 1
/// makes every one wrong. The smallest workloads the tests judge (ustacks' and chains'
/// counted sleeps, a few dozen; a test's exiting processes, a handful of records each) set
/// the N of their kinds.
pub const DEFECTS: [Defect; 9] = [
    Defect {
        kind: DEFECT_DROP_SLEEP,
        name: "drop-sleep",
        one_in: 4,
        what: "a counted sleep vanishes, counted nowhere",
    },
    Defect {
        kind: DEFECT_DURATION,
        name: "duration",
        one_in: 4,
        what: "a counted sleep's duration is doubled",
    },
    Defect {
        kind: DEFECT_WRONG_CAUSE,
        name: "wrong-cause",
        one_in: 4,
        what: "a sleep is counted under the last other cause counted on its CPU (or no backtrace)",
    },
    Defect {
        kind: DEFECT_WRONG_WAKER,
        name: "wrong-waker",
        one_in: 4,
        what: "a sleep a task woke is told as woken by the sleeper itself",
    },
    Defect {
        kind: DEFECT_WRONG_CGROUP,
        name: "wrong-cgroup",
        one_in: 4,
        what: "a sleep is counted in the root cgroup instead of its task's",
    },
    Defect {
        kind: DEFECT_USER_FRAME,
        name: "user-frame",
        one_in: 4,
        what: "a user backtrace has its second and third frames swapped",
    },
    Defect {
        kind: DEFECT_CHAIN_LINK,
        name: "chain-link",
        one_in: 4,
        what: "a chain link names the sleeper's own previous sleep instead of its waker's",
    },
    Defect {
        kind: DEFECT_RUNQ_AS_SLEEP,
        name: "runq-as-sleep",
        one_in: 4,
        what: "a run-queue wait is counted as a sleep (the cause counted before it on its CPU)",
    },
    Defect {
        kind: DEFECT_MERGE_TWICE,
        name: "merge-twice",
        one_in: 1,
        what: "an exiting task's records are merged twice (lazy mode's global table, cgroups)",
    },
];

/// The defect named `name`.
#[must_use]
pub fn defect_named(name: &str) -> Option<Defect> {
    DEFECTS.iter().copied().find(|d| d.name == name)
}

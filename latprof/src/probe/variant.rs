//! The variants of latprof's programs and which kernel needs which: where backtraces are taken
//! (stack cache, bounded cache, walk at wakeup, walk at switch-out) and whether the kernel has
//! BPF compare-and-swap.
use super::names;

/// Which programs a session runs: the best the kernel accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub backtraces: Backtraces,
    /// BPF compare-and-swap (Linux 5.12): normal mode raises the shared record's maximum in
    /// place; without it each CPU keeps its own maximum, combined when read (one more lookup).
    pub cas: bool,
}

impl Variant {
    /// The wakeup program of this variant.
    pub(super) fn wakeup_program(self) -> &'static str {
        match (self.backtraces, self.cas) {
            (Backtraces::AtWakeupCached, _) => names::PROG_SCHED_WAKEUP_BTF,
            (Backtraces::AtWakeupCachedBounded, true) => names::PROG_SCHED_WAKEUP_BTF_BOUNDED,
            (Backtraces::AtWakeupCachedBounded, false) => {
                names::PROG_SCHED_WAKEUP_BTF_BOUNDED_NOCAS
            }
            (Backtraces::AtWakeup, true) => names::PROG_SCHED_WAKEUP_BTF_WALK,
            (Backtraces::AtWakeup, false) => names::PROG_SCHED_WAKEUP_BTF_WALK_NOCAS,
            (Backtraces::AtSwitchOut, true) => names::PROG_SCHED_WAKEUP,
            (Backtraces::AtSwitchOut, false) => names::PROG_SCHED_WAKEUP_NOCAS,
        }
    }

    /// The switch program: on the BTF tracepoint where the wakeup program is.
    pub(super) fn switch_program(self) -> &'static str {
        match (self.btf(), self.cas) {
            (true, true) => names::PROG_SCHED_SWITCH_BTF,
            (true, false) => names::PROG_SCHED_SWITCH_BTF_NOCAS,
            (false, true) => names::PROG_SCHED_SWITCH,
            (false, false) => names::PROG_SCHED_SWITCH_NOCAS,
        }
    }

    /// Whether the wakeup and switch programs are on BTF tracepoints.
    pub(super) fn btf(self) -> bool {
        self.backtraces != Backtraces::AtSwitchOut
    }

    pub(super) fn free_program(self) -> &'static str {
        if self.cas {
            names::PROG_SCHED_PROCESS_FREE
        } else {
            names::PROG_SCHED_PROCESS_FREE_NOCAS
        }
    }

    pub(super) fn exit_program(self) -> &'static str {
        if self.cas {
            names::PROG_SCHED_PROCESS_EXIT
        } else {
            names::PROG_SCHED_PROCESS_EXIT_NOCAS
        }
    }

    /// The variant in a few words, for headers.
    #[must_use]
    pub fn short(self) -> String {
        let backtraces = match self.backtraces {
            Backtraces::AtWakeupCached => "stack cache",
            Backtraces::AtWakeupCachedBounded => "stack cache, bounded loop",
            Backtraces::AtWakeup => "walk at wakeup",
            Backtraces::AtSwitchOut => "walk at switch-out",
        };
        if self.cas {
            backtraces.to_owned()
        } else {
            format!("{backtraces}, no CAS")
        }
    }

    /// What this variant does, and what it costs next to the best one, in one line.
    #[must_use]
    pub fn describe(self) -> String {
        let backtraces = match self.backtraces {
            Backtraces::AtWakeupCached => "backtraces at wakeup through the stack cache",
            Backtraces::AtWakeupCachedBounded => {
                "backtraces at wakeup through the stack cache, learnt in a bounded loop (no bpf_loop: a little more per new backtrace)"
            }
            Backtraces::AtWakeup => {
                "backtraces walked at wakeup, no stack cache (about 3x the kernel time per counted sleep)"
            }
            Backtraces::AtSwitchOut => {
                "backtraces walked at every switch-out (no BTF tracepoints: every sleep pays a walk, counted or not)"
            }
        };
        if self.cas {
            backtraces.to_owned()
        } else {
            format!(
                "{backtraces}; no BPF compare-and-swap: normal mode keeps maxima per CPU (one more lookup per sleep)"
            )
        }
    }
}

/// Where the loaded programs take backtraces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backtraces {
    /// At wakeup, only for sleeps that count, from the task's stack cache when it can vouch for
    /// the backtrace (x86-64, BTF tracepoints and bpf_loop).
    AtWakeupCached,
    /// The same where the kernel has no `bpf_loop` (before 5.17): the stack is scanned in a
    /// bounded loop, the user registers found from the task's stack.
    AtWakeupCachedBounded,
    /// At wakeup, only for sleeps that count; every one walked.
    AtWakeup,
    /// Walked at every switch-out (no BTF tracepoints).
    AtSwitchOut,
}

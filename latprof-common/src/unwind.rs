//! Unwind tables (`--user-stacks`): how the kernel side steps through the frames of functions
//! that keep no frame pointer, in the files where a frame-pointer walk breaks (a distribution's
//! libc saves the caller's frame pointer and reuses the register: the walk ends at the first
//! such frame). User space turns a file's `.eh_frame` into rows, each where a rule starts; a
//! process's ranges of those files say where to look its instruction pointers up.

/// Rows all the files' tables hold together.
pub const UNWIND_TABLE_ROWS: u32 = 1 << 18;
/// Rows of one file at most, as many as `UNWIND_SEARCH` rounds search: an interpreter built
/// without frame pointers fits (Debian 13's python3.13, whose perf trampolines name Python
/// functions only if the walk goes through its evaluation loop: about 70,000), a large program
/// does not (node: 370,000; libjvm: 177,000), which keeps frame pointers itself where it
/// matters. libc and libstdc++ hold about 20,000 each.
pub const UNWIND_FILE_ROWS: u32 = 1 << UNWIND_SEARCH;
/// Processes (address-space layouts) with unwind ranges.
pub const UNWIND_PROCESSES: u32 = 4096;
/// Files with tables one process maps, at most (a JVM maps 7: libc, libstdc++, libm, the
/// dynamic loader, libgcc_s, libz and one of its own).
pub const UNWIND_RANGES: usize = 8;
/// Steps of a binary search over one file's rows (`UNWIND_FILE_ROWS`: each halves them).
pub const UNWIND_SEARCH: usize = 17;
/// Per CPU, the rules the searches found last (`UNWIND_RULES`), as many as `1 <<` this: a
/// sleeping thread's backtrace goes through the same return addresses sleep after sleep.
pub const UNWIND_RULE_BITS: u32 = 10;
/// Bytes of one of them: the row and address it is for, and the rule.
pub const UNWIND_RULE_SLOT: u64 = 16;
/// Words of a task's user stack a walk reads at its start in one read (at most up to the
/// highest address the task's last walk read), where its steps then take their words from:
/// 16 KiB per CPU, with `--user-stacks` only.
pub const USER_STACK_WINDOW: usize = 2048;

/// Where one file with a table is mapped executable in a process: its instruction pointers
/// `start..end` look up rows `first..first + count` at `ip - bias` (the file's own addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRange {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub first: u32,
    pub count: u32,
}
const _: () = assert!(size_of::<UnwindRange>() == 32);

/// A process's ranges, by its address-space layout (`layout_key`: forks share it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcUnwind {
    pub ranges: [UnwindRange; UNWIND_RANGES],
}
const _: () = assert!(size_of::<ProcUnwind>() == 32 * UNWIND_RANGES);

/// A row: the address its rule starts at (low 32 bits), then the rule: the canonical frame
/// address (CFA, the stack pointer before the call) as `UNWIND_CFA_RBP` or not (`rsp`) plus
/// an offset (bits 32-46), then how far below the CFA the caller's frame pointer was saved
/// (bits 48-63; 0: not saved, the register still holds it). A rule of 0 is no information
/// (between functions, or a rule the kernel side does not follow): the walk goes on by frame
/// pointers from there. The return address is at the CFA less 8 on x86-64.
#[inline(always)]
#[must_use]
pub const fn unwind_row(addr: u32, rule: u32) -> u64 {
    (rule as u64) << 32 | addr as u64
}

/// The CFA is the frame pointer plus the offset (rather than the stack pointer).
pub const UNWIND_CFA_RBP: u32 = 1 << 15;

/// The rule of a CFA at `rbp` or `rsp` plus `offset` with the caller's frame pointer `saved`
/// bytes below it (0: not saved); `None` where the numbers do not fit.
#[must_use]
pub fn unwind_rule(rbp: bool, offset: u64, saved: u64) -> Option<u32> {
    if offset == 0 || offset >= u64::from(UNWIND_CFA_RBP) || saved > 0xffff {
        return None;
    }
    let base = if rbp { UNWIND_CFA_RBP } else { 0 };
    #[expect(clippy::cast_possible_truncation, reason = "checked above")]
    Some((saved as u32) << 16 | base | offset as u32)
}

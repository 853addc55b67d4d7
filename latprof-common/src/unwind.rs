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

/// A row: the address its rule starts at (low 32 bits), then the rule (`unwind_rule`). A rule
/// of 0 is no information (between functions, or a rule the kernel side does not follow): the
/// walk goes on by frame pointers from there.
#[inline(always)]
#[must_use]
pub const fn unwind_row(addr: u32, rule: u32) -> u64 {
    (rule as u64) << 32 | addr as u64
}

/// The CFA is the frame pointer plus the offset (rather than the stack pointer).
pub const UNWIND_CFA_FP: u32 = 1 << 15;

/// Where a rule says the return address is: saved on the stack `n` words below the CFA
/// (x86-64's always 1: the call pushed it; arm64's where the function saved its link
/// register), or still in the link register (arm64 only, where no call has been made yet:
/// the leaf functions, and every function before its prologue saves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnAddress {
    Saved(u64),
    InLinkRegister,
}

/// Bits 16-27 of a rule: the return address in the link register.
pub const UNWIND_RA_IN_LR: u32 = 0xfff;

/// The rule of a CFA at the frame pointer (`fp`) or stack pointer plus `offset`, with the
/// caller's frame pointer `saved` bytes below the CFA (0: not saved, the register still holds
/// it) and the return address where `ra` says; `None` where the numbers do not fit. Bits 0-14:
/// the offset; bit 15: `UNWIND_CFA_FP`; bits 16-27: the return address's distance below the
/// CFA in words (up to 32 KiB: a frame with a large local array saves it at its bottom), or
/// `UNWIND_RA_IN_LR`; bits 28-31: the saved frame pointer's distance below the return
/// address's place in words (1 to 15; 0: not saved). The two are saved together: arm64's
/// `stp x29, x30` puts them side by side, x86-64's `push rbp` comes after the call's push and
/// at most a few other pushes. A rule is never 0 (every return address has a place), so 0
/// stays "no information".
#[must_use]
pub fn unwind_rule(fp: bool, offset: u64, saved: u64, ra: ReturnAddress) -> Option<u32> {
    if offset >= u64::from(UNWIND_CFA_FP) || !saved.is_multiple_of(8) {
        return None;
    }
    let (ra, ra_bytes) = match ra {
        ReturnAddress::Saved(at)
            if at.is_multiple_of(8) && (1..u64::from(UNWIND_RA_IN_LR)).contains(&(at / 8)) =>
        {
            (at / 8, at)
        }
        ReturnAddress::Saved(_) => return None,
        ReturnAddress::InLinkRegister => (u64::from(UNWIND_RA_IN_LR), 0),
    };
    let fp_words = match saved {
        0 => 0,
        _ if ra_bytes == 0 || saved <= ra_bytes => return None,
        _ => (saved - ra_bytes) / 8,
    };
    if fp_words > 15 {
        return None;
    }
    let base = if fp { UNWIND_CFA_FP } else { 0 };
    #[expect(clippy::cast_possible_truncation, reason = "checked above")]
    Some((fp_words as u32) << 28 | (ra as u32) << 16 | base | offset as u32)
}

/// The places a rule (`unwind_rule`) gives, below the CFA in bytes: the return address's
/// (`None`: in the link register) and the saved frame pointer's (0: not saved).
#[inline(always)]
#[must_use]
pub const fn unwind_places(rule: u32) -> (Option<u64>, u64) {
    let ra = (rule >> 16) & UNWIND_RA_IN_LR;
    if ra == UNWIND_RA_IN_LR {
        return (None, 0);
    }
    let ra = ra as u64 * 8;
    let fp = (rule >> 28) as u64 * 8;
    (Some(ra), if fp == 0 { 0 } else { ra + fp })
}

#[cfg(test)]
mod tests {
    use super::{ReturnAddress, UNWIND_CFA_FP, unwind_places, unwind_rule};

    #[test]
    fn rules_keep_each_part_and_are_never_zero() {
        // x86-64's frame: CFA = rbp + 16, rbp saved at CFA - 16, return address at CFA - 8.
        let rule = unwind_rule(true, 16, 16, ReturnAddress::Saved(8)).expect("fits");
        assert_eq!(rule, 1 << 28 | 1 << 16 | UNWIND_CFA_FP | 16);
        assert_eq!(unwind_places(rule), (Some(8), 16));
        // arm64's leaf: CFA = sp + 0, the return address in x30.
        let leaf = unwind_rule(false, 0, 0, ReturnAddress::InLinkRegister).expect("fits");
        assert_ne!(leaf, 0);
        assert_eq!(unwind_places(leaf), (None, 0));
        // arm64 with a 2 KiB local array: x29 and x30 saved at the frame's bottom.
        let big = unwind_rule(false, 2080, 2080, ReturnAddress::Saved(2072)).expect("fits");
        assert_eq!(unwind_places(big), (Some(2072), 2080));
        // Misaligned or out-of-range places have no rule.
        assert_eq!(unwind_rule(false, 16, 12, ReturnAddress::Saved(8)), None);
        assert_eq!(unwind_rule(false, 16, 0, ReturnAddress::Saved(4)), None);
        assert_eq!(unwind_rule(false, 16, 0, ReturnAddress::Saved(0)), None);
        assert_eq!(
            unwind_rule(false, 16, 8 + 8 * 16, ReturnAddress::Saved(8)),
            None
        );
        assert_eq!(unwind_rule(false, 16, 8, ReturnAddress::Saved(16)), None);
        assert_eq!(
            unwind_rule(false, 16, 8, ReturnAddress::InLinkRegister),
            None
        );
        assert_eq!(
            unwind_rule(false, 1 << 15, 0, ReturnAddress::Saved(8)),
            None
        );
    }
}

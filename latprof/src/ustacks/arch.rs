//! What the user walk needs to know of the architecture latprof is built for (x86-64 or
//! arm64): the DWARF numbers of its stack pointer, frame pointer and return address, where
//! `struct pt_regs` keeps them, what a call instruction looks like, and (arm64) which bits of a
//! return address pointer authentication signs.
//!
//! arm64 keeps a frame record where x86-64 keeps a frame: `[x29]` is the caller's x29 and
//! `[x29 + 8]` the saved x30 (the link register), the same pair at the same place, so the
//! frame-pointer walks serve both. What differs: a call leaves the return address in x30, not
//! on the stack, so a function that has not saved it (a leaf, such as the C libraries' syscall
//! wrappers) has its caller in x30 at the syscall; and with pointer authentication
//! (ARMv8.3, `paca` in /proc/cpuinfo) the saved x30 carries a signature in its upper bits.

use gimli::{AArch64, Register, X86_64};

/// An architecture latprof runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The one this build runs on.
    pub const HOST: Self = if cfg!(target_arch = "aarch64") {
        Self::Aarch64
    } else {
        Self::X86_64
    };
}

/// The DWARF registers of the architecture latprof runs on: stack pointer, frame pointer,
/// return address.
#[must_use]
pub const fn registers(arch: Arch) -> (Register, Register, Register) {
    match arch {
        Arch::X86_64 => (X86_64::RSP, X86_64::RBP, X86_64::RA),
        Arch::Aarch64 => (AArch64::SP, AArch64::X29, AArch64::X30),
    }
}

/// Where `struct pt_regs` keeps the user stack pointer, instruction pointer, frame pointer and
/// link register, as (struct member, index into it in words): x86-64's `sp`, `ip`, `bp` and no
/// link register; arm64's `sp`, `pc`, `regs[29]`, `regs[30]`.
#[must_use]
pub const fn pt_regs_members(arch: Arch) -> [Option<(&'static str, u32)>; 4] {
    match arch {
        Arch::X86_64 => [Some(("sp", 0)), Some(("ip", 0)), Some(("bp", 0)), None],
        Arch::Aarch64 => [
            Some(("sp", 0)),
            Some(("pc", 0)),
            Some(("regs", 29)),
            Some(("regs", 30)),
        ],
    }
}

/// Whether `bytes` (those before a return address) end in a call instruction of `arch`.
#[must_use]
pub fn ends_in_call(arch: Arch, bytes: &[u8]) -> bool {
    match arch {
        Arch::X86_64 => x86_ends_in_call(bytes),
        Arch::Aarch64 => bytes
            .last_chunk::<4>()
            .is_some_and(|b| is_arm64_call(u32::from_le_bytes(*b))),
    }
}

/// An arm64 call: `BL imm26`, `BLR Xn`, or one of the authenticating `BLRAA`, `BLRAAZ`,
/// `BLRAB`, `BLRABZ`.
#[must_use]
pub const fn is_arm64_call(insn: u32) -> bool {
    insn & 0xfc00_0000 == 0x9400_0000
        || insn & 0xffff_fc1f == 0xd63f_0000
        || insn & 0xfeff_f800 == 0xd63f_0800
}

/// The bits of a user return address that pointer authentication signs on this CPU, as the
/// CPU itself strips them: `XPACLRI` (a hint, so a no-op where the CPU has no pointer
/// authentication) clears the signature bits of x30 and leaves the rest; the bits it changes
/// in an address with all of them set are the mask. It depends on the kernel's user VA size
/// (48 or 52 bits) and on whether top-byte-ignore is on, so it is read, not assumed. 0 on
/// x86-64, and on arm64 CPUs without pointer authentication.
#[must_use]
pub fn pac_mask() -> u64 {
    #[cfg(target_arch = "aarch64")]
    {
        // Bit 55 selects the user (0) or kernel (1) half: a user address has it clear, and
        // the stripped bits are filled with it.
        let all: u64 = !(1 << 55);
        let stripped: u64;
        // SAFETY: XPACLRI only rewrites x30, which is declared clobbered (in and out here).
        unsafe {
            core::arch::asm!(
                "xpaclri",
                inout("x30") all => stripped,
                options(nomem, nostack, preserves_flags)
            );
        }
        all ^ stripped
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        0
    }
}

/// Whether `bytes` (those before a return address) end in an x86-64 call: `call rel32` or an
/// indirect `call` (`FF /2`, any addressing form, with or without a REX prefix).
#[must_use]
pub fn x86_ends_in_call(bytes: &[u8]) -> bool {
    let n = bytes.len();
    if n >= 5 && bytes[n - 5] == 0xe8 {
        return true;
    }
    (2..=n.min(7)).any(|len| indirect_call_len(&bytes[n - len..]) == Some(len))
}

/// The length of the `FF /2` call that starts `b`, if one does.
fn indirect_call_len(b: &[u8]) -> Option<usize> {
    let mut i = usize::from((0x40..=0x4f).contains(b.first()?));
    if *b.get(i)? != 0xff {
        return None;
    }
    let modrm = *b.get(i + 1)?;
    if (modrm >> 3) & 7 != 2 {
        return None;
    }
    i += 2;
    let (md, rm) = (modrm >> 6, modrm & 7);
    if md == 3 {
        return Some(i);
    }
    if rm == 4 {
        let sib = *b.get(i)?;
        i += 1;
        if md == 0 && sib & 7 == 5 {
            i += 4;
        }
    } else if md == 0 && rm == 5 {
        i += 4;
    }
    Some(
        i + match md {
            1 => 1,
            2 => 4,
            _ => 0,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{Arch, ends_in_call, is_arm64_call, pac_mask};

    #[test]
    fn arm64_calls_are_told_from_other_instructions() {
        // bl #0x40, blr x8, blraaz x1, blrab x3, x4 (as objdump encodes them).
        for insn in [0x9400_0010u32, 0xd63f_0100, 0xd63f_083f, 0xd73f_0c64] {
            assert!(is_arm64_call(insn), "{insn:#x}");
        }
        // b #0x40, br x8, ret, nop, paciasp, a load.
        for insn in [
            0x1400_0010u32,
            0xd61f_0100,
            0xd65f_03c0,
            0xd503_201f,
            0xd503_233f,
            0xf940_0000,
        ] {
            assert!(!is_arm64_call(insn), "{insn:#x}");
        }
        assert!(ends_in_call(Arch::Aarch64, &[0, 0, 0x10, 0, 0, 0x94]));
        assert!(!ends_in_call(Arch::Aarch64, &[0x1f, 0x20, 0x03, 0xd5]));
        assert!(!ends_in_call(Arch::Aarch64, &[0x94]));
    }

    #[test]
    fn arm64_mapping_symbols_are_no_functions() {
        use crate::ustacks::resolve::is_mapping_symbol;
        for name in ["$x", "$d", "$x.12", "$d.rodata", "$a", "$t"] {
            assert!(is_mapping_symbol(name), "{name}");
        }
        for name in ["$", "$xyz", "$dollar", "main", "x$d", ""] {
            assert!(!is_mapping_symbol(name), "{name}");
        }
    }

    #[test]
    fn the_pac_mask_keeps_every_user_address_bit() {
        let mask = pac_mask();
        // Never a bit of a 48-bit user address, and never bit 55 (the half selector).
        assert_eq!(mask & ((1 << 48) - 1), 0, "{mask:#x}");
        assert_eq!(mask & (1 << 55), 0, "{mask:#x}");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(mask, 0);
        }
    }
}

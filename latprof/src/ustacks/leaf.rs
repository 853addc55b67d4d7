//! The callers of frameless functions. A frame-pointer walk starts at the frame pointer the
//! task had at its syscall; functions that made no frame of their own (glibc's `read`,
//! `usleep` and most of a distribution's libc) leave it pointing at the innermost frame that
//! has one, so their callers are missing from the walk. Their return addresses are on the
//! stack at each function's canonical frame address less 8, which the binary's `.eh_frame`
//! gives for the instruction it was at; the kernel kept the stack words at the user stack
//! pointer (the window) when it first stored the backtrace. Unwinding goes up through the
//! window until a function with a frame, where the frame-pointer walk takes over.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
    Vendor,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// A loaded segment: (file offset, size in the file, virtual address, executable).
pub type Segment = (u64, u64, u64, bool);

/// What the unwinding needs of one binary, read once: its `.eh_frame` and where its
/// segments load (not the whole file: a large library is hundreds of megabytes).
#[derive(Debug)]
pub struct UnwindInfo {
    eh_frame: Vec<u8>,
    eh_frame_addr: u64,
    text_addr: u64,
    /// Loaded segments: (file offset, size in the file, virtual address, executable).
    segments: Vec<Segment>,
}

impl UnwindInfo {
    /// Reads the `.eh_frame` of an ELF binary; `None` without one, or where its header claims
    /// more than `untrusted::MAX_SECTION` bytes (the binary is any user's: the claim is checked
    /// before anything is allocated).
    #[must_use]
    pub fn read(file: &std::fs::File) -> Option<Self> {
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        let section = elf.section_by_name(".eh_frame")?;
        let (_, size) = section.file_range()?;
        if size > super::untrusted::MAX_SECTION {
            return None;
        }
        let text_addr = elf.section_by_name(".text").map_or(0, |s| s.address());
        let segments = elf
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                let exec = matches!(
                    s.flags(),
                    object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0
                );
                (off, size, s.address(), exec)
            })
            .collect();
        Some(Self {
            eh_frame: {
                let data = section.data().ok()?;
                let mut copy = Vec::new();
                copy.try_reserve_exact(data.len()).ok()?;
                copy.extend_from_slice(data);
                copy
            },
            eh_frame_addr: section.address(),
            text_addr,
            segments,
        })
    }

    /// The same, its `.eh_frame` dropped: where its segments load (`bias`) is all that is
    /// kept of a file whose unwind table is loaded.
    #[must_use]
    pub(super) fn without_eh_frame(&self) -> Self {
        Self {
            eh_frame: Vec::new(),
            eh_frame_addr: self.eh_frame_addr,
            text_addr: self.text_addr,
            segments: self.segments.clone(),
        }
    }

    /// Where its `.eh_frame` and `.text` are and its segments load: with the `.eh_frame`'s
    /// bytes, all its rows depend on.
    pub(super) fn layout(&self) -> (u64, u64, &[Segment]) {
        (self.eh_frame_addr, self.text_addr, &self.segments)
    }

    /// The `.eh_frame` section's bytes.
    pub(super) fn eh_frame(&self) -> &[u8] {
        &self.eh_frame
    }

    /// The bases its pointers are relative to.
    pub(super) fn bases(&self) -> BaseAddresses {
        BaseAddresses::default()
            .set_eh_frame(self.eh_frame_addr)
            .set_text(self.text_addr)
    }

    /// What to take from an address in an executable mapping of the file at `start..end`
    /// (file offset `offset`) for the file's own address (the load bias of the segment it
    /// holds); `None` where no segment is there. The executable segment the mapping holds,
    /// rather than the one at its offset: a mapping starts at a page, and a linker that packs
    /// segments (lld, gold) starts the code segment within the page of the one before it.
    pub(super) fn bias(&self, start: u64, end: u64, offset: u64) -> Option<u64> {
        let until = offset.saturating_add(end.saturating_sub(start));
        let (off, _, vaddr, _) = self
            .segments
            .iter()
            .find(|(off, size, _, exec)| {
                *exec && *off < until && offset < off.saturating_add(*size)
            })
            .or_else(|| {
                self.segments
                    .iter()
                    .find(|(off, size, ..)| (*off..off.saturating_add(*size)).contains(&offset))
            })?;
        Some(
            start
                .wrapping_sub(offset)
                .wrapping_add(*off)
                .wrapping_sub(*vaddr),
        )
    }

    /// How the function at file offset `at` found its caller then: through a frame of its
    /// own (the frame-pointer walk is right from here), or at `k` bytes above its stack pointer
    /// (the return address at `k - 8`); `Unknown` without unwind information for `at`.
    #[must_use]
    pub fn step(&self, at: u64) -> Step {
        let Some(vaddr) = self
            .segments
            .iter()
            .find(|(off, size, ..)| (*off..off.saturating_add(*size)).contains(&at))
            .map(|(off, _, vaddr, _)| at - off + vaddr)
        else {
            return Step::Unknown;
        };
        let (sp, fp, ra) = super::arch::registers(super::arch::Arch::HOST);
        let mut eh = EhFrame::new(&self.eh_frame, LittleEndian);
        if super::arch::Arch::HOST == super::arch::Arch::Aarch64 {
            eh.set_vendor(Vendor::AArch64);
        }
        let bases = self.bases();
        let mut ctx = Box::new(UnwindContext::new());
        let Ok(row) = eh.unwind_info_for_address(&bases, &mut ctx, vaddr, EhFrame::cie_from_offset)
        else {
            return Step::Unknown;
        };
        // The return address right below the CFA (x86-64's always; arm64's where the
        // function saved x30 last, at the top of its frame).
        if row.register(ra) != Some(RegisterRule::Offset(-8))
            && super::arch::Arch::HOST == super::arch::Arch::Aarch64
        {
            return Step::Unknown;
        }
        match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } if *register == sp => {
                match u64::try_from(*offset) {
                    Ok(k) if k >= 8 && k % 8 == 0 => Step::Rsp(k),
                    _ => Step::Unknown,
                }
            }
            CfaRule::RegisterAndOffset { register, .. } if *register == fp => Step::Frame,
            _ => Step::Unknown,
        }
    }
}

/// See `UnwindInfo::step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Frame,
    Rsp(u64),
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::UnwindInfo;

    /// A file as lld lays it out: the read-only segment, then the code segment starting in
    /// the same page of the file (offset 0x1240, loaded at 0x2240).
    fn packed() -> UnwindInfo {
        UnwindInfo {
            eh_frame: Vec::new(),
            eh_frame_addr: 0,
            text_addr: 0x2240,
            segments: vec![(0, 0x1234, 0, false), (0x1240, 0x4000, 0x2240, true)],
        }
    }

    #[test]
    fn the_bias_of_a_code_segment_that_shares_a_page_with_the_one_before() {
        let base = 0x7f00_0000_0000;
        // The code mapping starts at the page of 0x2240, file offset 0x1000 (the page of
        // 0x1240): the offset lies in the read-only segment, the code in the next one.
        assert_eq!(
            packed().bias(base + 0x2000, base + 0x6000, 0x1000),
            Some(base)
        );
    }

    #[test]
    fn this_test_binarys_code_is_where_its_load_bias_says() {
        // Linked by rust-lld: its code segment starts within the page of the read-only one.
        let me = std::fs::File::open("/proc/self/exe").expect("this test's binary");
        let cfi = UnwindInfo::read(&me).expect("its .eh_frame");
        let maps = crate::ustacks::maps::parse(
            &std::fs::read_to_string("/proc/self/maps").expect("its memory map"),
        );
        let exe = std::fs::read_link("/proc/self/exe").expect("its path");
        let exe = exe.to_string_lossy();
        let mine: Vec<_> = maps.iter().filter(|m| m.path == exe).collect();
        let base = mine
            .iter()
            .find(|m| m.offset == 0)
            .expect("its first mapping")
            .start;
        let code = mine.iter().find(|m| m.exec).expect("its code mapping");
        assert_eq!(cfi.bias(code.start, code.end, code.offset), Some(base));
    }

    #[test]
    fn the_bias_of_page_aligned_segments() {
        // GNU ld: the code segment at its own page (offset 0x1000, loaded at 0x1000).
        let cfi = UnwindInfo {
            segments: vec![(0, 0x800, 0, false), (0x1000, 0x3000, 0x1000, true)],
            ..packed()
        };
        let base = 0x5555_0000_0000;
        assert_eq!(cfi.bias(base + 0x1000, base + 0x4000, 0x1000), Some(base));
    }
}

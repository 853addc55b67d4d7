//! The caller of a frameless leaf function. A frame-pointer walk starts at the frame pointer
//! the task had at its syscall; a leaf that made no frame of its own (glibc's `read`, most
//! syscall wrappers) leaves it pointing at its caller's frame, so the walk's first return
//! address is the caller's caller, and the caller is missing. Its return address is on the
//! stack at the leaf's canonical frame address less 8, which the binary's `.eh_frame` gives
//! for the instruction the task was at; the kernel kept the stack words at the user stack
//! pointer (the window) when it first stored the backtrace.

use std::ops::Range;

use gimli::{BaseAddresses, CfaRule, EhFrame, LittleEndian, UnwindContext, UnwindSection, X86_64};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// What the unwinding needs of one binary, read once.
#[derive(Debug)]
pub struct Cfi {
    data: Vec<u8>,
    eh_frame: Range<usize>,
    eh_frame_addr: u64,
    text_addr: u64,
    /// Loaded segments: (file offset, size in the file, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

impl Cfi {
    /// Reads the `.eh_frame` of an ELF binary; `None` without one.
    #[must_use]
    pub fn read(data: Vec<u8>) -> Option<Self> {
        let (eh_frame, eh_frame_addr, text_addr, segments) = {
            let file = object::File::parse(&*data).ok()?;
            let section = file.section_by_name(".eh_frame")?;
            let (start, size) = section.file_range()?;
            let text_addr = file.section_by_name(".text").map_or(0, |s| s.address());
            let segments = file
                .segments()
                .map(|s| {
                    let (off, size) = s.file_range();
                    (off, size, s.address())
                })
                .collect();
            (
                usize::try_from(start).ok()?..usize::try_from(start + size).ok()?,
                section.address(),
                text_addr,
                segments,
            )
        };
        Some(Self {
            data,
            eh_frame,
            eh_frame_addr,
            text_addr,
            segments,
        })
    }

    /// The return address of the leaf at file offset `at` whose stack pointer was `sp`, from
    /// `window` (the stack words from `sp` up); `None` where the leaf has a frame of its own
    /// (the walk is right), no unwind information, or the slot is outside the window.
    #[must_use]
    pub fn leaf_return(&self, at: u64, sp: u64, window: &[u64]) -> Option<u64> {
        let vaddr = self
            .segments
            .iter()
            .find(|(off, size, _)| (*off..off + size).contains(&at))
            .map(|(off, _, vaddr)| at - off + vaddr)?;
        let eh = EhFrame::new(self.data.get(self.eh_frame.clone())?, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(self.eh_frame_addr)
            .set_text(self.text_addr);
        let mut ctx = Box::new(UnwindContext::new());
        let row = eh
            .unwind_info_for_address(&bases, &mut ctx, vaddr, EhFrame::cie_from_offset)
            .ok()?;
        let CfaRule::RegisterAndOffset { register, offset } = row.cfa() else {
            return None;
        };
        if *register != X86_64::RSP {
            return None;
        }
        let slot = offset.checked_sub(8)?;
        let index = usize::try_from(slot / 8).ok()?;
        if slot % 8 != 0 {
            return None;
        }
        let _ = sp;
        window.get(index).copied().filter(|&ret| ret != 0)
    }
}

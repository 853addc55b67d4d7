//! The kfuncs the programs call (`latprof_common::KFUNCS`): each marker call in the object is
//! rewritten before the object is loaded, into a call of the kfunc by its id in this kernel's
//! BTF where the kernel has it, else into `r0 = 0`, which the programs never run (a setting the
//! verifier reads as a constant keeps them off that path).

use anyhow::{Context as _, Result, bail};
use latprof_common::{KFUNC_RDONLY_CAST, KFUNCS};
use object::{Object as _, ObjectSection as _, SectionKind};

use super::{DebugConfig, btf::Btf};

/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// A call's source register when it calls a kfunc (`BPF_PSEUDO_KFUNC_CALL`).
const PSEUDO_KFUNC_CALL: u8 = 2;
/// `BPF_ALU64 | BPF_MOV | BPF_K`, into r0.
const MOV_IMM: u8 = 0xb7;

/// The kfuncs this kernel has, by their ids in its BTF.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Kfuncs {
    /// `bpf_rdonly_cast` (Linux 6.2) and the struct of words it casts to (`struct pt_regs`):
    /// the stack cache's plain loads.
    pub(super) rdonly_cast: Option<(u32, u32)>,
}

impl Kfuncs {
    /// Those `btf` has; none with `--debug-no-kfuncs` (the paths older kernels take); with
    /// `--debug-refuse-kfuncs`, one whose call the kernel refuses in place of each.
    pub(super) fn find(btf: &Btf, debug: &DebugConfig) -> Self {
        if debug.no_kfuncs {
            return Self::default();
        }
        let name = if debug.refuse_kfuncs {
            // A socket buffer's kfunc: the kernel has it, and refuses this call of it (its
            // arguments are none it takes).
            "bpf_dynptr_from_skb"
        } else {
            "bpf_rdonly_cast"
        };
        Self {
            rdonly_cast: btf.func_id(name).zip(btf.struct_id("pt_regs")),
        }
    }

    /// The setting `RDONLY_CAST_WORDS_ID`: the struct's id, 0 without the kfunc.
    pub(super) fn rdonly_cast_words(self) -> u32 {
        self.rdonly_cast.map_or(0, |(_, words)| words)
    }

    /// The kfunc's id each marker becomes (`None`: `r0 = 0`).
    fn id_of(self, marker: u32) -> Option<u32> {
        match marker {
            KFUNC_RDONLY_CAST => self.rdonly_cast.map(|(func, _)| func),
            _ => None,
        }
    }

    /// A copy of the eBPF object `elf` with every marker call rewritten; says how many.
    pub(super) fn rewrite(self, elf: &[u8]) -> Result<(AlignedObject, usize)> {
        let mut object = AlignedObject::new(elf);
        let code: Vec<(usize, usize)> = {
            let file = object::File::parse(elf).context("parsing latprof's eBPF object")?;
            file.sections()
                .filter(|s| s.kind() == SectionKind::Text)
                .filter_map(|s| s.file_range())
                .map(|(at, len)| Ok((usize::try_from(at)?, usize::try_from(len)?)))
                .collect::<Result<_>>()?
        };
        let mut rewritten = 0;
        let bytes = object.bytes_mut();
        for (at, len) in code {
            let Some(section) = bytes.get_mut(at..at + len) else {
                bail!("latprof's eBPF object: a code section past the file's end");
            };
            for insn in section.as_chunks_mut::<8>().0 {
                if let Some(marker) = marker_call(*insn) {
                    rewrite_call(insn, self.id_of(marker));
                    rewritten += 1;
                }
            }
        }
        Ok((object, rewritten))
    }
}

/// The marker an instruction calls, if it is a marker call (a helper call by a marker's
/// number: no helper has one).
fn marker_call(insn: [u8; 8]) -> Option<u32> {
    let imm = u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
    (insn[0] == CALL && insn[1] == 0 && KFUNCS.contains(&imm)).then_some(imm)
}

/// A marker call made a call of the kfunc `id` (in vmlinux's BTF: offset 0), or `r0 = 0`.
fn rewrite_call(insn: &mut [u8; 8], id: Option<u32>) {
    let (code, regs, imm) = match id {
        Some(id) => (CALL, PSEUDO_KFUNC_CALL << 4, id),
        None => (MOV_IMM, 0, 0),
    };
    insn[0] = code;
    insn[1] = regs;
    insn[2..4].copy_from_slice(&0u16.to_le_bytes());
    insn[4..8].copy_from_slice(&imm.to_le_bytes());
}

/// An object's bytes, 8-byte aligned as the ELF reader needs them (a `Vec<u8>` promises 1).
pub(super) struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    fn new(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        Self {
            words,
            len: bytes.len(),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of `words`' memory, initialised, read as bytes (any alignment).
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(imm: u32) -> [u8; 8] {
        let mut insn = [CALL, 0, 0, 0, 0, 0, 0, 0];
        insn[4..].copy_from_slice(&imm.to_le_bytes());
        insn
    }

    #[test]
    fn marker_calls_become_the_kfunc_or_r0_zero() {
        let mut insn = call(KFUNC_RDONLY_CAST);
        assert_eq!(marker_call(insn), Some(KFUNC_RDONLY_CAST));
        rewrite_call(&mut insn, Some(64_911));
        assert_eq!(insn[0], CALL);
        assert_eq!(insn[1] >> 4, PSEUDO_KFUNC_CALL);
        assert_eq!(u32::from_le_bytes(insn[4..].try_into().unwrap()), 64_911);
        assert_eq!(marker_call(insn), None);
        let mut insn = call(KFUNC_RDONLY_CAST);
        rewrite_call(&mut insn, None);
        assert_eq!(insn, [MOV_IMM, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn helper_calls_are_left_alone() {
        // bpf_probe_read_kernel (113), and a subprogram call (source register 1).
        assert_eq!(marker_call(call(113)), None);
        let mut sub = call(KFUNC_RDONLY_CAST);
        sub[1] = 1 << 4;
        assert_eq!(marker_call(sub), None);
    }

    /// The embedded object holds the stack cache's marker calls, and after the rewrite none
    /// is left, either way.
    #[test]
    fn the_object_s_markers_are_all_rewritten() {
        let count = |k: Kfuncs| {
            let (object, n) = k.rewrite(super::super::EBPF_OBJECT).expect("rewrite");
            let again = Kfuncs::default().rewrite(object.bytes()).expect("rewrite");
            (n, again.1)
        };
        let (with, left) = count(Kfuncs {
            rdonly_cast: Some((1, 2)),
        });
        assert!(with > 0, "no marker call in the object");
        assert_eq!(left, 0);
        assert_eq!(count(Kfuncs::default()), (with, 0));
    }
}

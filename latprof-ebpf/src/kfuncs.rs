//! The kfuncs the programs call, each by its marker (`latprof_common::KFUNCS`), which user
//! space rewrites into the kfunc's call where the kernel has it.

use latprof_common::KFUNC_RDONLY_CAST;

use crate::settings::{RDONLY_CAST_WORDS_ID, read_field};

/// Whether `bpf_rdonly_cast` is called here: a constant to the verifier, which follows only
/// the path it picks (where it is false, the call was rewritten into `r0 = 0`).
#[inline(always)]
pub(crate) fn rdonly_cast_on() -> bool {
    RDONLY_CAST_WORDS_ID.load() != 0
}

/// The kernel value at `addr` (a `u64` or smaller) by a plain load (a probe load, which
/// reads 0 where the address faults) through `bpf_rdonly_cast`, instead of a
/// `bpf_probe_read_kernel` call. Only where [`rdonly_cast_on`].
#[inline(always)]
pub(crate) fn kernel_read<T: Copy>(addr: u64) -> T {
    const { assert!(size_of::<T>() <= 8) };
    // SAFETY: the marker becomes `bpf_rdonly_cast(void *, u32)`, which returns its first
    // argument as a read-only pointer to a struct of words (`RDONLY_CAST_WORDS_ID`, a constant
    // to the verifier, as its argument must be); the load at offset 0 is (part of) its first.
    unsafe {
        let cast: unsafe extern "C" fn(u64, u32) -> *const T =
            core::mem::transmute(KFUNC_RDONLY_CAST as usize);
        core::ptr::read_volatile(cast(addr, RDONLY_CAST_WORDS_ID.load()))
    }
}

/// The kernel field at `offset` in the object at `base` (any pointer, also one the verifier
/// knows only as a number): a plain load where [`rdonly_cast_on`] (a fault reads 0, which
/// every caller takes as "none"), else a `bpf_probe_read_kernel` (a fault is an error).
#[inline(always)]
pub(crate) fn read_kernel<T: Copy>(base: *const u8, offset: u32) -> Result<T, i32> {
    if rdonly_cast_on() {
        Ok(kernel_read((base as u64).wrapping_add(u64::from(offset))))
    } else {
        read_field(base, offset)
    }
}

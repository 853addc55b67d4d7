//! Kernel functions (kfuncs) the programs call where the kernel has them.
//!
//! Rust cannot declare a kfunc yet: the loader finds one by the BTF of an extern function,
//! which the compiler does not emit. So the programs call each as if it were a helper, by a
//! number no helper has, and user space rewrites every such call before the object is loaded
//! (`probe/kfuncs.rs`): into a call of the kfunc (by its id in the kernel's BTF) where the
//! kernel has it, else into `r0 = 0`. A setting the verifier reads as a constant keeps the
//! programs off that path where it was not rewritten into the kfunc, so the `r0 = 0` never
//! runs and the verifier never follows it.

/// The call `bpf_rdonly_cast(void *obj, u32 btf_id)` is written as (Linux 6.2): `obj` as a
/// read-only pointer to the kernel type `btf_id`, which the program may load from (each load
/// a probe load: a bad address reads 0) instead of calling `bpf_probe_read_kernel`. The
/// verifier turns the call into a plain move.
pub const KFUNC_RDONLY_CAST: u32 = 0x4c50_4b01;

/// Every kfunc marker: what user space looks for in the object.
pub const KFUNCS: [u32; 1] = [KFUNC_RDONLY_CAST];

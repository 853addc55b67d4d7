//! Settings fixed for a run: `Global`s that the loader writes (`override_global`) before the
//! verifier sees the programs, so it removes the branches a run does not use (the eBPF form of
//! `IS_ENABLED(CONFIG_...)`). No setting is read from a map on an event. Each one is declared
//! once, with its meaning, in `latprof-common/src/settings.rs`, which both sides expand.
//!
//! Offsets into kernel structures come from vmlinux BTF at load time and are read through
//! [`read_field`], never hard-coded for one kernel.

use aya_ebpf::{Global, helpers::bpf_probe_read_kernel};

/// The `Global` statics of a settings table (`latprof_common::settings!`): each one's
/// symbol is the name the loader writes it by.
macro_rules! globals {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $default:expr,)*) => {
        $(
            $(#[$doc])*
            #[unsafe(no_mangle)]
            pub(crate) static $name: Global<$ty> = Global::new($default);
        )*
    };
}

latprof_common::settings!(globals);
latprof_common::debug_settings!(globals);

/// Whether `--debug-skip` leaves `part` (a `SKIP_*` bit) out of this run: a constant the
/// verifier folds, so a part left out costs nothing and one kept costs no test.
#[inline(always)]
pub(crate) fn skipped(part: u32) -> bool {
    DEBUG_SKIP.load() & part != 0
}

/// Reads a field of a task the verifier knows by its BTF type (a BTF tracepoint's trusted
/// task): a plain load, which the verifier checks against the type (the offset is a setting,
/// a constant to it), instead of a helper call. Where the pointer is not one the verifier
/// knows (a raw tracepoint's argument), the program is rejected: use [`read_field`] there.
#[inline(always)]
pub(crate) fn read_btf_field<T: Copy>(task: *const u8, offset: u32) -> T {
    // SAFETY: the verifier allows the load only within the object's type; a fault on the
    // object's memory reads zero (the load is a probe load).
    unsafe { core::ptr::read_volatile(task.add(offset as usize).cast()) }
}

/// The ids of a task the verifier knows by its BTF type, in `bpf_get_current_pid_tgid`'s
/// layout (tgid high, tid low): two plain loads instead of that helper's call.
#[inline(always)]
pub(crate) fn btf_pid_tgid(task: *const u8) -> u64 {
    (u64::from(read_btf_field::<i32>(task, TASK_TGID_OFF.load()) as u32) << 32)
        | u64::from(read_btf_field::<i32>(task, TASK_PID_OFF.load()) as u32)
}

/// Reads a field of a kernel object at an offset taken from BTF.
#[inline(always)]
pub(crate) fn read_field<T>(object: *const u8, offset: u32) -> Result<T, i32> {
    // SAFETY: a probe read fails safely on a bad address.
    unsafe { bpf_probe_read_kernel(object.add(offset as usize).cast()) }
}

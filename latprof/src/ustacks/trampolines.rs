//! Python's perf trampolines (`python3 -X perf`, CPython 3.12 on): each Python function is
//! entered through a small copy of a template the interpreter carries, in anonymous
//! executable memory its perf map names (`py::waitHere:/app/main.py`). On x86-64 the template
//! keeps no frame pointer (`sub $8,%rsp; call *%rcx; add $8,%rsp; ret`), so a frame-pointer
//! step from it reads whatever the register holds and the walk ends at the innermost Python
//! function. Where the template has that shape, the process's trampoline memory gets a
//! one-row table of its own: the caller's return address is 16 bytes above the stack pointer
//! at the trampoline's return address, the frame pointer untouched. The template is read from
//! the interpreter's file (never from the process's memory), and only that shape is taken: a
//! template that keeps a frame pointer is walked by it.

use std::fs::File;

use latprof_common::{ReturnAddress, unwind_rule};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// The symbols around CPython's template (exported by the interpreter or `libpython3.x.so`).
const START: &str = "_Py_trampoline_func_start";
const END: &str = "_Py_trampoline_func_end";

/// Symbols looked at, at most.
const MAX_SYMBOLS: usize = 200_000;

/// `endbr64`, which a build with control-flow protection puts first.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The rule (`unwind_rule`) at the return address of a trampoline made from `file`'s template;
/// `None` where `file` has no template, or one of another shape.
#[must_use]
pub fn python_rule(file: &File) -> Option<u32> {
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    let (mut start, mut end) = (None, None);
    // A user's binary may claim any number of symbols: CPython's are among its dynamic ones.
    for sym in elf.dynamic_symbols().chain(elf.symbols()).take(MAX_SYMBOLS) {
        match sym.name_bytes() {
            Ok(name) if name == START.as_bytes() => start = Some(sym),
            Ok(name) if name == END.as_bytes() => end = Some(sym.address()),
            _ => {}
        }
        if start.is_some() && end.is_some() {
            break;
        }
    }
    let (start, end) = (start?, end?);
    let len = end.checked_sub(start.address()).filter(|&len| len <= 64)?;
    let section = elf.section_by_index(start.section_index()?).ok()?;
    let code = section.data_range(start.address(), len).ok()??;
    shape_rule(code)
}

/// The rule of a template whose code is `code`: `[endbr64] sub $N,%rsp; call *%rcx; add
/// $N,%rsp; ret` keeps `N` bytes and the return address below its caller's stack pointer.
fn shape_rule(code: &[u8]) -> Option<u32> {
    let code = code.strip_prefix(&ENDBR64).unwrap_or(code);
    match code {
        [
            0x48,
            0x83,
            0xec,
            n,
            0xff,
            0xd1,
            0x48,
            0x83,
            0xc4,
            m,
            0xc3,
            ..,
        ] if n == m && n < &0x80 => {
            unwind_rule(false, u64::from(*n) + 8, 0, ReturnAddress::Saved(8))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpython_3_13s_template_keeps_16_bytes_without_a_frame_pointer() {
        // Debian 13's python3.13, as objdump shows `_Py_trampoline_func_start`.
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08,
            0xc3,
        ];
        assert_eq!(
            shape_rule(&code),
            unwind_rule(false, 16, 0, ReturnAddress::Saved(8))
        );
        assert_eq!(
            shape_rule(&code[4..]),
            unwind_rule(false, 16, 0, ReturnAddress::Saved(8))
        );
    }

    #[test]
    fn other_shapes_are_left_to_the_frame_pointers() {
        // push %rbp; mov %rsp,%rbp; call *%rcx; pop %rbp; ret
        assert_eq!(
            shape_rule(&[0x55, 0x48, 0x89, 0xe5, 0xff, 0xd1, 0x5d, 0xc3]),
            None
        );
        // sub and add that do not match, and a truncated template.
        assert_eq!(
            shape_rule(&[
                0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x10, 0xc3
            ]),
            None
        );
        assert_eq!(shape_rule(&[0x48, 0x83, 0xec]), None);
    }

    #[test]
    fn a_binary_without_the_template_has_no_rule() {
        let me = File::open("/proc/self/exe").expect("this test's binary");
        assert_eq!(python_rule(&me), None);
    }
}

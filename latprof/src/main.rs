//! latprof's entry point: parse the command line, run the command, map errors to exit codes.
use std::{
    alloc::{GlobalAlloc, Layout, System},
    process::ExitCode,
};

use latprof::cli::Cli;

/// The system allocator, except that running out of memory (a small `ulimit -v`, a cgroup
/// limit) is one line and exit status 1, not Rust's abort with a backtrace (exit 134).
struct OneLineOnFailure;

impl OneLineOnFailure {
    /// Says so without allocating, and exits without running anything that might: a
    /// recording's frames on disk are whole (each is written and synced before the next).
    fn fail(size: usize) -> ! {
        const HEAD: &[u8] = b"latprof: error: out of memory allocating ";
        const TAIL: &[u8] = b" bytes (a memory limit such as ulimit -v?)\n";
        let mut digits = [0u8; 20];
        let mut n = size;
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789"[n % 10];
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut line = [0u8; HEAD.len() + 20 + TAIL.len()];
        let mut len = 0;
        for part in [HEAD, &digits[i..], TAIL] {
            line[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        // SAFETY: writes a local buffer to stderr, then ends the process.
        unsafe {
            libc::write(2, line.as_ptr().cast(), len);
            libc::_exit(1)
        }
    }
}

// SAFETY: every call goes to System; a failed allocation ends the process instead of returning.
unsafe impl GlobalAlloc for OneLineOnFailure {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            Self::fail(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            Self::fail(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            Self::fail(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: OneLineOnFailure = OneLineOnFailure;

/// Parses the command line; a bad one is one line (clap's first, which names the flag and
/// why) and exit status 2, as for any other bad input. Help and version print as clap prints
/// them.
fn parse() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    latprof::cli::parse().map_err(|err| {
        if matches!(
            err.kind(),
            ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        ) {
            err.exit();
        }
        let text = err.render().to_string();
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let why = first.strip_prefix("error: ").unwrap_or(first);
        eprintln!("latprof: error: {why} (latprof --help lists the flags)");
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match latprof::cmd::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("latprof: error: {err:#}");
            match err.downcast_ref::<latprof::Error>() {
                Some(latprof::Error::Privileges | latprof::Error::BadInput(_)) => ExitCode::from(2),
                None => ExitCode::FAILURE,
            }
        }
    }
}

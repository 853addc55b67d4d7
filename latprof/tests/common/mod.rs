//! Helpers shared by the integration tests that run latprof as a user would.
// Each test binary uses only some of these.
#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, ChildStderr, Command, Output, Stdio},
};

pub mod vm;

pub const LATPROF: &str = env!("CARGO_BIN_EXE_latprof");

/// Spawns `cmd` (a latprof command; stdout as the caller set it) and waits for its first
/// stderr line, which must contain `ready` ("attached", or "recording to").
pub fn start(cmd: &mut Command, ready: &str) -> (Child, BufReader<ChildStderr>) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn latprof");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("read stderr");
    assert!(
        line.contains(ready),
        "latprof {cmd:?} did not start: {line}"
    );
    (child, stderr)
}

/// Stops a latprof command with SIGINT; it must exit 0. Returns its output and the stderr
/// after the first line.
pub fn interrupt(child: Child, mut stderr: BufReader<ChildStderr>) -> (Output, String) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().expect("wait for latprof");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(out.status.success(), "latprof exit {}: {rest}", out.status);
    (out, rest)
}

/// The sleeps latprof reported lost ("latprof: warning: N sleeps lost: ..."), 0 if none.
pub fn reported_lost(text: &str) -> u64 {
    text.lines()
        .find(|l| l.contains("sleeps lost"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map_or(0, |n| n.parse().expect("lost count"))
}

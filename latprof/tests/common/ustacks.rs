//! The user stack tests' workload: `tests/fixtures/ustacks/server.c`, a server whose main
//! thread waits for requests on a pipe (`main -> serve_requests -> wait_for_request -> read`),
//! built by the test with gcc, with or without frame pointers.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The server's own functions, innermost first, above libc's `read`.
pub const SERVER_FRAMES: [&str; 3] = ["wait_for_request", "serve_requests", "main"];

/// The fixture's source.
#[must_use]
pub fn server_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ustacks/server.c")
}

/// Builds the server into `dir` as `name`: with frame pointers (every call keeps its frame), or
/// optimized without them.
#[must_use]
pub fn build_server(dir: &Path, name: &str, frame_pointers: bool) -> PathBuf {
    build_fixture(&server_source(), dir, name, frame_pointers)
}

/// Builds the C fixture `source` into `dir` as `name`, as `build_server` says.
#[must_use]
pub fn build_fixture(source: &Path, dir: &Path, name: &str, frame_pointers: bool) -> PathBuf {
    let out = dir.join(name);
    let flags: &[&str] = if frame_pointers {
        &[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
        ]
    } else {
        &["-O2", "-fomit-frame-pointer"]
    };
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(source)
        .arg("-lpthread")
        .status()
        .unwrap_or_else(|e| {
            panic!("gcc did not run ({e}): the user stack tests build their workload with it; `cargo xtask setup` installs it")
        });
    assert!(status.success(), "gcc failed building {}", out.display());
    out
}

/// The user frames of a JSON cause (`user_frames`), as strings.
#[must_use]
pub fn user_frames(cause: &serde_json::Value) -> Vec<String> {
    cause["user_frames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A frame's function, without the source line latprof adds where the binary has DWARF
/// (`wait_for_request (server.c:21)`).
#[must_use]
pub fn function(frame: &str) -> &str {
    frame.split_once(" (").map_or(frame, |(f, _)| f)
}

/// Whether `frames` hold the server's functions in order, right after one libc frame.
#[must_use]
pub fn has_server_chain(frames: &[String]) -> bool {
    frames.len() > SERVER_FRAMES.len()
        && frames[1..=SERVER_FRAMES.len()]
            .iter()
            .zip(SERVER_FRAMES)
            .all(|(f, want)| function(f) == want)
}

/// The causes of `json` whose kernel frames hold `kernel` and whose user frames satisfy
/// `user`.
pub fn causes_where<'a>(
    json: &'a serde_json::Value,
    kernel: &str,
    user: impl Fn(&[String]) -> bool,
) -> Vec<&'a serde_json::Value> {
    json["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter(|c| {
            c["frames"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f.as_str().is_some_and(|f| f.contains(kernel)))
            }) && user(&user_frames(c))
        })
        .collect()
}

//! Issue 32's Node case on Debian 12's own kernel (6.1, under ../shared/vm): tests/vm/node.sh
//! runs node (this machine's, copied in with its libraries) waiting in `Atomics.wait` inside
//! `outer() -> middle() -> waitHere()` under `latprof --user-stacks`: every wait counted under
//! those three JavaScript functions, in order, above V8's wait, as tests/runtimes.rs checks on
//! this kernel. Needs root, node and ../shared/vm (`cargo xtask test`).
use serde_json::Value;

mod common;

use common::{
    runtimes::{WAITS, check_three, javascript, sleeps_in_three},
    vm::{boot, section},
};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/node.sh");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/runtimes/sleep_in_three.js"
);

/// The node on the PATH, as a file run.sh can copy in.
fn node() -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .expect("sh");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !path.is_empty(),
        "node is missing: `cargo xtask test` installs Debian's nodejs"
    );
    std::fs::canonicalize(&path)
        .expect("node's path")
        .to_string_lossy()
        .into_owned()
}

#[test]
#[ignore = "needs root, node and ../shared/vm: run `cargo xtask test`"]
fn node_names_its_javascript_functions_on_debian_12s_kernel() {
    let node = node();
    let Some(out) = boot(
        SCRIPT,
        "sh /work/node.sh",
        &[
            "--kernel",
            "debian-6.1",
            "--smp",
            "2",
            "--mem",
            "2048",
            "--bin",
            &node,
            "--file",
            FIXTURE,
        ],
    ) else {
        return;
    };
    assert!(
        section(&out, "uname")
            .first()
            .is_some_and(|r| r.starts_with("6.1.")),
        "{out}"
    );
    assert_eq!(section(&out, "rc"), ["0"], "{out}");
    let pid: u32 = section(&out, "pid")
        .join("")
        .parse()
        .unwrap_or_else(|_| panic!("no pid: {out}"));
    let said = section(&out, "node").join(" ");
    let slept: u64 = said
        .split_whitespace()
        .find_map(|w| w.strip_prefix("slept="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("node said {said:?}"));
    let text = section(&out, "stats").join("\n");
    let doc: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("stats: not JSON ({e}):\n{out}"));
    let err = section(&out, "stats stderr").join("\n");
    let counted = sleeps_in_three(&doc, javascript, "Builtin_AtomicsWait");
    check_three(&doc, &err, pid, WAITS, slept, counted);
}

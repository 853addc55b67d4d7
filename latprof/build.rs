//! Builds latprof's eBPF object with the pinned nightly and bpf-linker; the object is embedded
//! in the binary with `aya::include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

/// The nightly whose LLVM (22) matches bpf-linker's: the one pin, which xtask's setup installs.
const EBPF_TOOLCHAIN: &str = include_str!("../latprof-ebpf/NIGHTLY").trim_ascii();

fn main() -> anyhow::Result<()> {
    revision();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| anyhow!("no workspace root"))?
        .join("latprof-ebpf");
    let root = root.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [Package {
            name: "latprof-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::Custom(EBPF_TOOLCHAIN),
    )
    .context("building the eBPF programs (run `cargo xtask setup` if a toolchain is missing)")
}

/// `LATPROF_REVISION` for `--version`: the git commit latprof is built from (12 hex digits),
/// or `LATPROF_REVISION` from the environment (a build from a source archive), else `unknown`.
fn revision() {
    println!("cargo:rerun-if-env-changed=LATPROF_REVISION");
    let from_env = std::env::var("LATPROF_REVISION").ok();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let revision = from_env
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // A new commit or another branch: the revision again.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{head}");
        }
    }
    println!("cargo:rustc-env=LATPROF_REVISION={revision}");
}

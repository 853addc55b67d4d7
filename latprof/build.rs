//! Builds latprof's eBPF object with the pinned nightly and bpf-linker; the object is embedded
//! in the binary with `aya::include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

/// The nightly whose LLVM (22) matches bpf-linker's: the one pin, which xtask's setup installs.
const EBPF_TOOLCHAIN: &str = include_str!("../latprof-ebpf/NIGHTLY").trim_ascii();

fn main() -> anyhow::Result<()> {
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

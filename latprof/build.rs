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
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
    // One eBPF build for every build of latprof in this target directory (clippy's, the debug
    // build, the static release): the object is the same, and aya-build otherwise compiles it,
    // core included, once per OUT_DIR (about 40 s each). aya-build keeps its build under
    // OUT_DIR, so it is handed the shared folder as OUT_DIR; a lock keeps two builds of latprof
    // at once from copying the object while the other writes it.
    // One object per target architecture: `bpf_target_arch` (aya-build's, from the target)
    // picks the kernel's register layout.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;
    let shared = shared_dir(&out_dir).join(arch);
    std::fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    let lock = std::fs::File::create(shared.join("lock")).context("the eBPF build's lock")?;
    lock.lock().context("locking the eBPF build")?;
    // SAFETY: this script's one thread sets it before aya-build starts any of its own, and
    // aya-build reads it once, first; its threads (which forward the inner build's messages)
    // never read the environment.
    unsafe { std::env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf(
        [Package {
            name: "latprof-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::Custom(EBPF_TOOLCHAIN),
    );
    // SAFETY: as above.
    unsafe { std::env::set_var("OUT_DIR", &out_dir) };
    built.context(
        "building the eBPF programs (run `cargo xtask setup` if a toolchain is missing)",
    )?;
    // `AYA_BUILD_SKIP=1` builds nothing (clippy without the nightly): OUT_DIR keeps what it
    // has, as aya-build leaves it, rather than an object another build left here.
    if std::env::var_os("AYA_BUILD_SKIP")
        .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    {
        return Ok(());
    }
    // The object where `include_bytes_aligned!(concat!(env!("OUT_DIR"), "/latprof"))` finds it.
    std::fs::copy(shared.join("latprof"), out_dir.join("latprof"))
        .context("copying the eBPF object")?;
    Ok(())
}

/// `ebpf/` in the target directory above OUT_DIR: the first folder cargo tagged as one
/// (`CACHEDIR.TAG`), or its parent where that is tagged too (`target/` above
/// `target/x86_64-unknown-linux-musl/`), and no further; OUT_DIR's own `ebpf/` where none is.
fn shared_dir(out_dir: &std::path::Path) -> std::path::PathBuf {
    let tagged = |dir: &std::path::Path| dir.join("CACHEDIR.TAG").is_file();
    let mut above = out_dir.ancestors().skip_while(|dir| !tagged(dir));
    let Some(first) = above.next() else {
        return out_dir.join("ebpf");
    };
    above
        .next()
        .filter(|parent| tagged(parent))
        .unwrap_or(first)
        .join("ebpf")
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

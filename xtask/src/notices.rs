//! `cargo xtask notices`: THIRD-PARTY-NOTICES from Cargo's metadata by cargo-deny, and the
//! check that the license list bites.
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{root_dir, setup::CARGO_DENY};

/// The license check can fail: with the Apache and BSD licenses taken off the allowed list,
/// cargo-deny must refuse the dependencies that have only those.
pub(crate) fn licenses_check_bites() -> Result<()> {
    let allowed = std::fs::read_to_string(root_dir().join("deny.toml")).context("deny.toml")?;
    let narrowed = allowed
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("\"Apache") && !l.starts_with("\"BSD")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = root_dir().join("target/deny-narrowed.toml");
    std::fs::create_dir_all(root_dir().join("target"))?;
    std::fs::write(&path, narrowed)?;
    let refused = !Command::new("cargo-deny")
        .args(["--all-features", "--config"])
        .arg(&path)
        .args(["check", "licenses"])
        .current_dir(root_dir())
        .output()
        .context("running cargo-deny")?
        .status
        .success();
    if !refused {
        bail!(
            "the license check passed with Apache-2.0 and BSD licenses not allowed: it checks nothing"
        );
    }
    eprintln!("xtask: the license check refuses what deny.toml does not allow");
    Ok(())
}

/// The third-party notices: every crate latprof builds with (the eBPF object's included),
/// by license, as `cargo deny list` reads them from Cargo's metadata. `write`: (re)writes
/// THIRD-PARTY-NOTICES (`cargo xtask notices`); otherwise fails when the file is not current.
pub(crate) fn notices(write: bool) -> Result<()> {
    let path = root_dir().join("THIRD-PARTY-NOTICES");
    let listed = Command::new("cargo-deny")
        .args([
            "--all-features",
            "list",
            "--layout",
            "license",
            "--format",
            "human",
        ])
        .current_dir(root_dir())
        .output()
        .context("running cargo-deny (cargo xtask setup installs it)")?;
    if !listed.status.success() {
        bail!(
            "cargo deny list failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let text = format!(
        "Third-party software in latprof\n\
         \n\
         latprof (the binary, and the eBPF object embedded in it) is built from these crates,\n\
         listed by license as their Cargo metadata declares it (made by `cargo xtask notices`\n\
         with cargo-deny {CARGO_DENY}; `cargo xtask test` checks that it is current and that every\n\
         license is on the list allowed in deny.toml). Each crate's license text ships in its\n\
         source on crates.io.\n\
         \n{}",
        strip_ansi(&String::from_utf8_lossy(&listed.stdout))
    );
    if write {
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: wrote {}", path.display());
        return Ok(());
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != text {
        bail!(
            "{} is not current (a dependency or its license changed): run `cargo xtask notices` and commit it",
            path.display()
        );
    }
    Ok(())
}

/// `text` without terminal color sequences.
pub(crate) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

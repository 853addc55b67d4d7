//! `latprof-docs DIR`: latprof's man pages and shell completions, made from its command line
//! (clap) so that they never disagree with `--help`: DIR/man/latprof.1 and one page per
//! command (latprof-stats.1, ...), DIR/completions/latprof.bash, _latprof (zsh) and
//! latprof.fish. `cargo xtask deb` packages them; not shipped itself.
use std::{io::Write as _, path::PathBuf};

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;
use clap_complete::Shell;

/// The EXIT STATUS section, as docs/guide/stats.md says it.
const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success.
.TP
\fB1\fR
latprof failed while it ran (a kernel table could not be read, a file could not be written,
memory ran out); one line on standard error says why.
.TP
\fB2\fR
Bad input, said in one line before anything is loaded: an unknown or bad flag, a flag the
command would ignore, a missing privilege (root, or CAP_BPF and CAP_PERFMON), a file latprof
refuses.
"#;

/// One page: the command's name, synopsis, description, options (under the help's headings),
/// its commands (the top page), examples, exit status and version.
fn page(cmd: &clap::Command, top: bool) -> Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    if top {
        man.render_subcommands_section(&mut out)?;
    }
    // The help's examples (after_help), as they are typed.
    if let Some(examples) = cmd.get_after_help() {
        let text = examples.to_string();
        writeln!(out, ".SH EXAMPLES\n.nf")?;
        for line in text.lines().skip_while(|l| l.starts_with("Examples:")) {
            let line = line.replace('\\', "\\e");
            let line = if line.starts_with(['.', '\'']) {
                format!("\\&{line}")
            } else {
                line
            };
            writeln!(out, "{line}")?;
        }
        writeln!(out, ".fi")?;
    }
    out.write_all(EXIT_STATUS.as_bytes())?;
    if !top {
        writeln!(out, ".SH \"SEE ALSO\"\n\\fBlatprof\\fR(1)")?;
    }
    man.render_version_section(&mut out)?;
    Ok(out)
}

fn main() -> Result<()> {
    let dir = PathBuf::from(
        std::env::args_os()
            .nth(1)
            .context("usage: latprof-docs DIR")?,
    );
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let mut cmd = latprof::cli::Cli::command();
    cmd.build();
    std::fs::write(man.join("latprof.1"), page(&cmd, true)?)?;
    // clap takes names as 'static strings; this program makes a few pages and ends.
    let version: &'static str = Box::leak(
        cmd.get_version()
            .unwrap_or_default()
            .to_owned()
            .into_boxed_str(),
    );
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name: &'static str = Box::leak(format!("latprof-{}", sub.get_name()).into_boxed_str());
        let sub = sub.clone().name(name).version(version);
        std::fs::write(man.join(format!("{name}.1")), page(&sub, false)?)
            .with_context(|| format!("writing {name}.1"))?;
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, "latprof", &completions)
            .with_context(|| format!("{shell} completions"))?;
    }
    Ok(())
}

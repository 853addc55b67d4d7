//! The command examples of README.md and docs/ are latprof's real command line and, where they
//! show output, its real output.
//!
//! An example is a ```console block: each `$ ` line a command, the lines after it up to the
//! next command the output the page shows (`...` on a line of its own stands for any lines,
//! `[..]` for the rest of a line; snapbox's matching). The block's info string says what may
//! run where:
//! - `console`: needs no root and no live kernel (a checked-in recording, `--help`): run by
//!   `examples_without_root_print_what_the_page_shows` in docs/examples, as any user;
//! - `console,root`: run the same way as root, by the privileged run (`cargo xtask test`);
//! - `console,ignore`: parsed only (an interactive view, a server that runs until stopped).
//!
//! Every `latprof` command of every kind is parsed by latprof's own clap definition
//! (`latprof::cli::Cli`), so a renamed or removed flag fails here even where the example is
//! not run. snapbox rather than trycmd: trycmd runs every console block of a file as it
//! stands (`sudo` included) with no say in which need root, and this suite must run those
//! only in its privileged pass; snapbox gives the same matching as a library.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use clap::Parser as _;

/// Where a block may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Run,
    Root,
    ParseOnly,
}

/// One `$ ` line of a console block, with the output the page shows after it.
#[derive(Debug)]
struct Example {
    page: PathBuf,
    line: usize,
    kind: Kind,
    command: String,
    output: String,
}

impl Example {
    fn at(&self) -> String {
        format!("{}:{}", self.page.display(), self.line)
    }
}

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("docs/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// The examples of `text` (page `page`).
fn examples_of(page: &Path, text: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let (mut fenced, mut block) = (false, None);
    // Whether the block's lines so far follow one of its commands (lines before its first
    // command are no one's output).
    let mut filling = false;
    for (n, line) in text.lines().enumerate() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            block = if fenced {
                None
            } else {
                match info.trim() {
                    "console" => Some(Kind::Run),
                    "console,root" => Some(Kind::Root),
                    "console,ignore" => Some(Kind::ParseOnly),
                    _ => None,
                }
            };
            fenced = !fenced;
            filling = false;
            continue;
        }
        let Some(kind) = block else {
            continue;
        };
        if let Some(command) = line.strip_prefix("$ ") {
            filling = true;
            out.push(Example {
                page: page.strip_prefix(root()).unwrap_or(page).to_path_buf(),
                line: n + 1,
                kind,
                command: command.to_owned(),
                output: String::new(),
            });
        } else if filling && let Some(last) = out.last_mut() {
            last.output.push_str(line);
            last.output.push('\n');
        }
    }
    out
}

fn examples() -> Vec<Example> {
    pages()
        .iter()
        .flat_map(|page| {
            let text = std::fs::read_to_string(page).expect("a page");
            examples_of(page, &text)
        })
        .collect()
}

/// The words of the first command of a shell line (up to a pipe, redirection or `;`), quotes
/// removed, `sudo` dropped: what latprof's argv would be, if it is latprof.
fn argv(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, '|' | '>' | '<' | ';' | '&') => {
                // `2>&1`: the digits name a descriptor, not an argument.
                if !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit()) {
                    word.clear();
                }
                break;
            }
            // A comment ends the command.
            (None, '#') if word.is_empty() && !any => break,
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (_, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    if words.first().is_some_and(|w| w == "sudo") {
        words.remove(0);
    }
    // A shell variable (`--pid $!`) stands for a number here.
    for w in &mut words {
        if w.starts_with('$') {
            "1".clone_into(w);
        }
    }
    words
}

/// Whether latprof's command line accepts `words` (a latprof command).
fn parses(words: &[String]) -> Result<(), String> {
    match latprof::cli::Cli::try_parse_from(words) {
        Ok(_) => Ok(()),
        // --help and --version stop parsing on purpose.
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn every_example_parses_with_latprofs_command_line() {
    let examples = examples();
    let latprof: Vec<&Example> = examples
        .iter()
        .filter(|e| argv(&e.command).first().is_some_and(|w| w == "latprof"))
        .collect();
    // README's and the guide's: a few per command at least.
    assert!(latprof.len() >= 10, "{latprof:#?}");
    let wrong: Vec<String> = latprof
        .iter()
        .filter_map(|e| {
            parses(&argv(&e.command))
                .err()
                .map(|err| format!("{}: {}\n{err}", e.at(), e.command))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check fails where it must: an example's flag renamed (`--duration` as `--durations`),
/// a flag that moved to another command, a command that does not exist.
#[test]
fn a_renamed_flag_fails_the_parse() {
    assert!(parses(&argv("sudo latprof stats --duration 5s")).is_ok());
    assert!(parses(&argv("sudo latprof stats --durations 5s")).is_err());
    assert!(parses(&argv("latprof dump run.lpr --listen 127.0.0.1:1")).is_err());
    assert!(parses(&argv("latprof stat")).is_err());
    assert_eq!(
        argv("sudo latprof stats --format json | jq '.causes[0]' > out"),
        ["latprof", "stats", "--format", "json"]
    );
    assert_eq!(
        argv("latprof dump 'a b.lpr'"),
        ["latprof", "dump", "a b.lpr"]
    );
    assert_eq!(
        argv("latprof dump x.lpr --info 2>&1 >/dev/null"),
        ["latprof", "dump", "x.lpr", "--info"]
    );
    assert_eq!(
        argv("sudo latprof --pid $! top   # a comment"),
        ["latprof", "--pid", "1", "top"]
    );
}

/// Runs the examples of `kind` in docs/examples (where the recordings they read are), with
/// the built latprof first on the PATH; returns what differs from the pages.
fn run(kind: Kind) -> Vec<String> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_latprof"));
    let path = format!(
        "{}:{}",
        bin.parent().expect("a folder").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = root().join("docs/examples");
    let mut wrong = Vec::new();
    for e in examples().iter().filter(|e| e.kind == kind) {
        let command = e.command.strip_prefix("sudo ").unwrap_or(&e.command);
        let out = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(&dir)
            .env("PATH", &path)
            .env("COLUMNS", "100")
            .output()
            .expect("sh");
        let actual = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            wrong.push(format!(
                "{}: `{}` failed ({}): {}",
                e.at(),
                e.command,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let expected = snapbox::IntoData::into_data(e.output.clone());
        let actual = snapbox::IntoData::into_data(actual);
        if let Err(err) = snapbox::Assert::new().try_eq(None, actual, expected) {
            wrong.push(format!("{}: `{}`:\n{err}", e.at(), e.command));
        }
    }
    wrong
}

#[test]
fn examples_without_root_print_what_the_page_shows() {
    let n = examples().iter().filter(|e| e.kind == Kind::Run).count();
    assert!(n >= 5, "only {n} examples run without root");
    let wrong = run(Kind::Run);
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
#[ignore = "needs root: run `cargo xtask test`"]
fn examples_with_root_print_what_the_page_shows() {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let n = examples().iter().filter(|e| e.kind == Kind::Root).count();
    assert!(n >= 2, "only {n} examples run as root");
    let wrong = run(Kind::Root);
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// A page's output that differs from the command's fails the comparison (the check can fail).
#[test]
fn a_changed_output_fails_the_comparison() {
    let page = "```console\n$ printf 'a\\nb\\n'\na\nc\n```\n";
    let examples = examples_of(Path::new("page.md"), page);
    assert_eq!(examples.len(), 1);
    let expected = snapbox::IntoData::into_data(examples[0].output.clone());
    assert!(
        snapbox::Assert::new()
            .try_eq(None, snapbox::IntoData::into_data("a\nb\n"), expected)
            .is_err()
    );
    let wildcard = snapbox::IntoData::into_data("a\n...\n");
    assert!(
        snapbox::Assert::new()
            .try_eq(None, snapbox::IntoData::into_data("a\nb\nc\n"), wildcard)
            .is_ok()
    );
}

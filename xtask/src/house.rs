//! `cargo xtask house`: the house's plan, checked (the test command runs it first).
//!
//! Each crate's modules sit on floors ([`LATPROF`], [`EBPF`]): a module may use only modules on
//! floors below its own, so no import runs up a floor or in a circle, and the next feature
//! cannot bring one back. A module missing from its plan is an error too: a new module is
//! placed on purpose. Then the map: README's Layout names every source file, and each crate's
//! doc (`latprof/src/lib.rs`, `latprof-ebpf/src/main.rs`) every module. And no shipped file
//! holds more than [`MAX_CODE_LINES`] lines of code: past that a file is a hub.
//!
//! Imports are read from the source text: `crate::NAME` anywhere, and each item of a
//! `use crate::{...}` group. Test code (`tests.rs`, and whatever follows a file's
//! `#[cfg(test)]`) is left out: a test may reach any floor.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// latprof's floors, lowest first. `lib` and `main` stand above them all.
const LATPROF: &[&[&str]] = &[
    // Plain helpers: names made printable, clocks, files as root opens them, systemd's
    // protocol, the kernel's symbols and CPU lists.
    &["text", "time", "files", "notify", "symbols", "cpus"],
    // What the kernel's numbers are named by: cgroups, user backtraces, reasons.
    &["cgroups", "ustacks", "reasons"],
    // Load and attach the programs.
    &["probe"],
    // Read their maps into snapshots.
    &["collect"],
    // What a view shows, and recordings (which know nothing of views).
    &["model", "store"],
    // Text, JSON, folded, OpenMetrics, pprof.
    &["export"],
    // The views: HTTP and the terminal.
    &["serve", "tui"],
    // The command line, then the commands.
    &["cli"],
    &["cmd"],
];

/// The eBPF crate's floors, lowest first; `main` and `lib` stand above them all.
const EBPF: &[&[&str]] = &[
    // Programs that do nothing: the benchmark's floor.
    &["floor"],
    &["settings"],
    &["maps"],
    &["shared", "unwind", "kfuncs"],
    &["task_table", "defects"],
    &[
        "debug", "stacks", "ustacks", "spikes", "ticks", "rename", "chains",
    ],
    &["stack_cache", "wakers", "account"],
    &["recover"],
    &["exit"],
    &["switch"],
    &["wakeup"],
];

/// The crates whose code ships in the binary.
const SHIPPED: [&str; 3] = ["latprof/src", "latprof-common/src", "latprof-ebpf/src"];
/// Lines of code a shipped file may hold: a hub past this holds several concerns.
const MAX_CODE_LINES: usize = 500;

/// Lines of code in a source file: not blank, not a comment, not in its tests (`tests.rs` is
/// all test; elsewhere a `#[cfg(test)]` module, up to its closing brace at the margin).
fn code_lines(text: &str) -> usize {
    let mut n = 0;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("#[cfg(test)]") {
            let item = lines.next().unwrap_or_default();
            if item.trim_end().ends_with('{') {
                for inner in lines.by_ref() {
                    if inner == "}" {
                        break;
                    }
                }
            }
            continue;
        }
        let t = line.trim();
        if !t.is_empty() && !t.starts_with("//") {
            n += 1;
        }
    }
    n
}

/// Runs every check; fails with all that is wrong, one line each.
pub fn check(root: &Path) -> Result<()> {
    let mut wrong = Vec::new();
    for (crate_dir, plan, doc) in [
        ("latprof/src", LATPROF, "lib.rs"),
        ("latprof-ebpf/src", EBPF, "main.rs"),
    ] {
        let dir = root.join(crate_dir);
        let modules = modules(&dir)?;
        wrong.extend(floors(crate_dir, plan, &modules)?);
        let doc_text = std::fs::read_to_string(dir.join(doc))
            .with_context(|| format!("reading {crate_dir}/{doc}"))?;
        let doc_text: String = doc_text
            .lines()
            .filter(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        for module in modules.keys().filter(|m| !is_top(m)) {
            if !doc_text.contains(&format!("`{module}`")) {
                wrong.push(format!(
                    "{crate_dir}/{doc}: its doc does not name module `{module}`"
                ));
            }
        }
    }
    wrong.extend(layout(root)?);
    wrong.extend(crate::links::check(root)?);
    for src in [
        "latprof/src",
        "latprof-ebpf/src",
        "latprof-common/src",
        "latprof-bench/src",
        "xtask/src",
    ] {
        wrong.extend(crate::circles::check(root, src)?);
    }
    for crate_dir in SHIPPED {
        for file in rust_files(&root.join(crate_dir))?
            .into_iter()
            .filter(|f| !f.ends_with("tests.rs"))
        {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let n = code_lines(&text);
            if n > MAX_CODE_LINES {
                wrong.push(format!(
                    "{} holds {n} lines of code (at most {MAX_CODE_LINES}): give a concern a file of its own",
                    file.strip_prefix(root).unwrap_or(&file).display()
                ));
            }
        }
    }
    if wrong.is_empty() {
        eprintln!(
            "xtask: the house: every import runs down a floor, docs/architecture.md's Layout names every file by its path, no circle among the files of any folder, every doc is linked from README and every link leads somewhere, no shipped file over {MAX_CODE_LINES} lines of code"
        );
        Ok(())
    } else {
        for w in &wrong {
            eprintln!("xtask: house: {w}");
        }
        bail!(
            "out of the house's plan (xtask/src/house.rs): {} in all",
            wrong.len()
        )
    }
}

fn is_top(module: &str) -> bool {
    module == "lib" || module == "main"
}

/// A crate's top-level modules and their files: `name.rs`, or every file below `name/`.
fn modules(dir: &Path) -> Result<BTreeMap<String, Vec<PathBuf>>> {
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for file in rust_files(dir)? {
        let rel = file.strip_prefix(dir).context("below the crate")?;
        let top = rel
            .components()
            .next()
            .context("a file name")?
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        out.entry(top).or_default().push(file);
    }
    Ok(out)
}

/// Every `.rs` file below `dir`, sorted.
pub fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What runs against the floors: each import from a module to one on its own floor or above.
fn floors(
    crate_dir: &str,
    plan: &[&[&str]],
    modules: &BTreeMap<String, Vec<PathBuf>>,
) -> Result<Vec<String>> {
    let floor_of: BTreeMap<&str, usize> = plan
        .iter()
        .enumerate()
        .flat_map(|(i, floor)| floor.iter().map(move |m| (*m, i)))
        .collect();
    let mut wrong = Vec::new();
    for module in modules.keys().filter(|m| !is_top(m)) {
        if !floor_of.contains_key(module.as_str()) {
            wrong.push(format!(
                "{crate_dir}: module `{module}` is on no floor (place it in xtask/src/house.rs)"
            ));
        }
    }
    for (module, files) in modules.iter().filter(|(m, _)| !is_top(m)) {
        let Some(&from) = floor_of.get(module.as_str()) else {
            continue;
        };
        for file in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let text = without_tests(&text);
            let used: BTreeSet<String> = imports(text);
            for to in used
                .iter()
                .filter(|u| *u != module && modules.contains_key(*u))
            {
                let Some(&floor) = floor_of.get(to.as_str()) else {
                    continue;
                };
                if floor >= from {
                    wrong.push(format!(
                        "{}: `{module}` (floor {from}) uses `{to}` (floor {floor}): an import must run down a floor",
                        file.display()
                    ));
                }
            }
        }
    }
    Ok(wrong)
}

/// A source file's text up to its test module (`#[cfg(test)]` then `mod`, at the margin): a
/// `#[cfg(test)]` on anything else (an item, a line inside a macro) is the file's code.
pub fn without_tests(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with("#[cfg(test)]") {
            let rest = text[at + line.len()..].trim_start();
            if rest.starts_with("mod ") || rest.starts_with("pub mod ") {
                return &text[..at];
            }
        }
        at += line.len();
    }
    text
}

/// The modules `text` names through `crate::`.
fn imports(text: &str) -> BTreeSet<String> {
    imports_after(text, "crate::")
}

/// The first names `text` uses after `prefix` (`crate::`, `super::`): `prefix a::b` gives `a`,
/// `prefix {a::b, c, d::{e, f}}` gives `a`, `c` and `d`.
pub fn imports_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        // `super::super::x` is not `super::x` seen one `super::` later.
        if text[..i].ends_with("::") {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if prefix.starts_with("super") && rest.starts_with("super::") {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::b, c, d::{e, f}}`: the first name of each item at depth one.
            let mut depth = 1;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && (c.is_ascii_alphanumeric() || c == '_') => {
                        out.insert(ident(&group[j..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The Layout of docs/architecture.md must name every source file of the shipped crates, the
/// eBPF crate, the shared types, the benchmark and xtask by its whole path (in backticks), and
/// every path it names must be a file: a file moved or removed leaves no stale line.
fn layout(root: &Path) -> Result<Vec<String>> {
    let doc = root.join("docs/architecture.md");
    let text = std::fs::read_to_string(&doc).context("reading docs/architecture.md")?;
    let named = layout_paths(&text).context("docs/architecture.md has no Layout section")?;
    let mut wrong = Vec::new();
    let mut files = BTreeSet::new();
    for crate_dir in [
        "latprof/src",
        "latprof-ebpf/src",
        "latprof-common/src",
        "latprof-bench/src",
        "xtask/src",
    ] {
        for file in rust_files(&root.join(crate_dir))? {
            let rel = file
                .strip_prefix(root)
                .context("below the root")?
                .to_string_lossy()
                .into_owned();
            if !named.contains(&rel) {
                wrong.push(format!("docs/architecture.md's Layout does not name {rel}"));
            }
            files.insert(rel);
        }
    }
    for path in named.difference(&files) {
        wrong.push(format!(
            "docs/architecture.md's Layout names {path}, which is no source file"
        ));
    }
    Ok(wrong)
}

/// The paths (backticked, ending in `.rs`) of the section `## Layout`, up to the next `## `.
fn layout_paths(text: &str) -> Option<BTreeSet<String>> {
    let section = text.split("\n## Layout\n").nth(1)?;
    let section = section.split("\n## ").next()?;
    Some(
        section
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|p| p.contains('/') && p.rsplit_once('.').is_some_and(|(_, ext)| ext == "rs"))
            .map(str::to_owned)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::imports;

    #[test]
    fn code_lines_leave_out_comments_blanks_and_tests() {
        let text = "//! doc\nuse x;\n\n// note\nfn f() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\nfn g() {}\n";
        assert_eq!(super::code_lines(text), 3);
    }

    #[test]
    fn only_the_test_module_is_left_out() {
        let text = "use a;\n#[cfg(test)]\nconst X: u8 = 1;\nuse crate::b;\n#[cfg(test)]\nmod tests {\n use crate::c;\n}\n";
        let code = super::without_tests(text);
        assert!(
            code.contains("crate::b") && !code.contains("crate::c"),
            "{code}"
        );
    }

    #[test]
    fn the_layout_names_whole_paths_only() {
        let text = "# A\n## Layout\n| `latprof/src/a.rs` | x |\n| b.rs | `c.rs` |\n## Next\n`latprof/src/d.rs`\n";
        let named: Vec<String> = super::layout_paths(text)
            .expect("a Layout")
            .into_iter()
            .collect();
        assert_eq!(named, ["latprof/src/a.rs"]);
    }

    #[test]
    fn imports_are_read_from_paths_and_groups() {
        let text = "use crate::{\n    cgroups::CgroupPath,\n    probe::{Mode, names},\n    text,\n};\n\
                    fn f() { crate::model::x(); }";
        let found: Vec<String> = imports(text).into_iter().collect();
        assert_eq!(found, ["cgroups", "model", "probe", "text"]);
    }
}

//! The docs' own map, checked by `cargo xtask house`: every page under docs/ is linked from
//! README's table of the docs, and every link in README and the docs leads somewhere: a file
//! or folder that exists, and where it names a heading (`#anchor`), a heading of that page as
//! GitHub makes its anchor. Links to the web are not followed.
use std::{
    collections::BTreeSet,
    path::{Component, Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// Everything wrong with the docs' links, one line each.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut pages = vec![root.join("README.md")];
    pages.extend(markdown_files(&root.join("docs"))?);
    let mut wrong = Vec::new();
    let mut from_readme = BTreeSet::new();
    for page in &pages {
        let text =
            std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
        let shown = page
            .strip_prefix(root)
            .unwrap_or(page)
            .display()
            .to_string();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let to = if file.is_empty() {
                page.clone()
            } else {
                normalized(&page.parent().unwrap_or(root).join(file))
            };
            if !to.exists() {
                wrong.push(format!("{shown}: the link ({target}) leads nowhere"));
                continue;
            }
            if page.ends_with("README.md") && page.parent() == Some(root) {
                from_readme.insert(to.clone());
            }
            if !anchor.is_empty() {
                let headings = std::fs::read_to_string(&to)
                    .map(|t| anchors(&t))
                    .unwrap_or_default();
                if !headings.contains(anchor) {
                    wrong.push(format!(
                        "{shown}: the link ({target}) names no heading of {}",
                        to.strip_prefix(root).unwrap_or(&to).display()
                    ));
                }
            }
        }
    }
    for page in pages.iter().skip(1) {
        if !from_readme.contains(page) {
            wrong.push(format!(
                "README.md's table of the docs does not link {}",
                page.strip_prefix(root).unwrap_or(page).display()
            ));
        }
    }
    Ok(wrong)
}

/// The markdown files below `dir`, sorted.
fn markdown_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(markdown_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// `path` without `.` and `..` components (the files need not exist).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The targets of a page's inline links `[text](target)`, outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold no links: drop them first.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push(target.to_owned());
            }
            rest = &after[end..];
        }
    }
    out
}

/// The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_` gone,
/// spaces as `-`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        out.insert(anchor(title));
    }
    out
}

fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{anchor, links};

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(
            anchor("What the kernel needs, and the kernels it runs on"),
            "what-the-kernel-needs-and-the-kernels-it-runs-on"
        );
        assert_eq!(anchor("`top`: the live view"), "top-the-live-view");
    }

    #[test]
    fn links_outside_code_are_found() {
        let text =
            "see [a](a.md) and [b](b.md#x \"t\")\n`[not](code.md)`\n```\n[no](fenced.md)\n```\n";
        assert_eq!(links(text), ["a.md", "b.md#x"]);
    }
}

//! Circles below the top level, checked by `cargo xtask house`: in every folder of a crate,
//! the files and subfolders beside each other (a folder's modules, `mod.rs` aside) must not use
//! each other in a circle. The floors (house.rs) order a crate's top-level modules; a circle
//! of two files inside one of them (`a.rs` uses `b.rs`, which uses `a.rs`) is just as much a
//! knot: neither can be read, changed or tested without the other.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// Every circle among sibling modules below `src` (the crate's top level is the floors'), one
/// line each.
pub fn check(root: &Path, src: &str) -> Result<Vec<String>> {
    let mut wrong = Vec::new();
    let mut folders = vec![root.join(src)];
    while let Some(dir) = folders.pop() {
        let mut siblings: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            let name = path
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if path.is_dir() {
                folders.push(path.clone());
                siblings.insert(name, super::house::rust_files(&path)?);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !matches!(name.as_str(), "mod" | "lib" | "main")
            {
                siblings.insert(name, vec![path]);
            }
        }
        if dir == root.join(src) || siblings.len() < 2 {
            continue;
        }
        let module = dir
            .strip_prefix(root.join(src))
            .context("below the crate")?
            .to_string_lossy()
            .replace('/', "::");
        let mut uses: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for (name, files) in &siblings {
            let mut used = BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("reading {}", file.display()))?;
                let text = super::house::without_tests(&text);
                // How a file names its folder's modules: `super::` from a file beside them,
                // one `super::` more per folder below, and `crate::` with the folder's path.
                let below = file
                    .parent()
                    .and_then(|p| p.strip_prefix(&dir).ok())
                    .map_or(0, |p| p.components().count());
                let own_mod = file.file_name().is_some_and(|f| f == "mod.rs");
                let supers = "super::".repeat(below + usize::from(!own_mod));
                for prefix in [supers, format!("crate::{module}::")] {
                    if prefix.is_empty() {
                        continue;
                    }
                    used.extend(
                        super::house::imports_after(text, &prefix)
                            .into_iter()
                            .filter(|u| u != name && siblings.contains_key(u)),
                    );
                }
            }
            uses.insert(name, used);
        }
        for circle in circles(&uses) {
            wrong.push(format!(
                "{}: {} use each other in a circle",
                dir.strip_prefix(root).unwrap_or(&dir).display(),
                circle.join(", ")
            ));
        }
    }
    Ok(wrong)
}

/// The strongly connected parts of more than one node of `graph` (Tarjan's algorithm).
fn circles(graph: &BTreeMap<&str, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<&'a str, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn strong(s: &mut State<'_>, v: &str) {
        s.index.insert(v.to_owned(), s.next);
        s.low.insert(v.to_owned(), s.next);
        s.next += 1;
        s.stack.push(v.to_owned());
        let edges: Vec<String> = s.graph.get(v).into_iter().flatten().cloned().collect();
        for w in edges {
            if !s.index.contains_key(&w) {
                strong(s, &w);
                let low = s.low[v].min(s.low[&w]);
                s.low.insert(v.to_owned(), low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[&w]);
                s.low.insert(v.to_owned(), low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut part = Vec::new();
            while let Some(w) = s.stack.pop() {
                let done = w == v;
                part.push(w);
                if done {
                    break;
                }
            }
            if part.len() > 1 {
                part.sort();
                s.out.push(part);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(*v) {
            strong(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::circles;

    #[test]
    fn a_circle_of_two_or_more_is_found_and_a_chain_is_not() {
        let set = |names: &[&str]| {
            names
                .iter()
                .map(|n| (*n).to_owned())
                .collect::<BTreeSet<_>>()
        };
        let mut graph = BTreeMap::new();
        graph.insert("a", set(&["b"]));
        graph.insert("b", set(&["c"]));
        graph.insert("c", set(&["a"]));
        graph.insert("d", set(&["a"]));
        assert_eq!(circles(&graph), [["a", "b", "c"]]);
        graph.insert("c", set(&[]));
        assert_eq!(circles(&graph), Vec::<Vec<String>>::new());
    }
}

//! The shape of `host/src` that `docs/architecture.md` promises: dependencies between the
//! top-level modules point one way (no module reaches, through any chain of `crate::`
//! paths, back to itself), and every file says what it owns in a `//!` comment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn host_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules of the crate (`lib.rs` and `main.rs` are the roots, not modules).
fn top_level(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            let name = name.strip_suffix(".rs").map(str::to_string).unwrap_or(name);
            (name != "lib" && name != "main").then_some(name)
        })
        .collect()
}

/// The names that follow `crate::` in `code`, including each of a `crate::{a, b}` group.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.push(name);
            }
        } else {
            found.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    found
}

/// Module → module it uses → the files that use it. Comment lines are not uses (a doc link
/// may point anywhere).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let tops = top_level(src);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_str().unwrap().trim_end_matches(".rs").to_string();
        if !tops.contains(&module) {
            continue;
        }
        let code: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for used in crate_paths(&code) {
            if used != module && tops.contains(&used) {
                graph
                    .entry(module.clone())
                    .or_default()
                    .entry(used)
                    .or_default()
                    .insert(relative.display().to_string());
            }
        }
    }
    graph
}

/// A chain of modules from `from` back to `from`, if there is one.
fn cycle_through(
    graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    from: &str,
) -> Option<Vec<String>> {
    let mut path = vec![from.to_string()];
    let mut seen = BTreeSet::new();
    fn walk(
        graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        target: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let here = path.last().unwrap().clone();
        for next in graph.get(&here).into_iter().flat_map(|m| m.keys()) {
            if next == target {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, target, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(graph, from, &mut path, &mut seen).then_some(path)
}

#[test]
fn top_level_modules_depend_on_each_other_one_way() {
    let src = host_src();
    let graph = module_graph(&src);
    assert!(
        graph
            .get("dispatch")
            .is_some_and(|m| m.contains_key("queue")),
        "the scan finds no `crate::` uses: {graph:?}"
    );
    for module in graph.keys() {
        if let Some(cycle) = cycle_through(&graph, module) {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|pair| {
                    let files = &graph[&pair[0]][&pair[1]];
                    format!("{} -> {} (in {:?})", pair[0], pair[1], files)
                })
                .collect();
            panic!(
                "host/src has a circle of top-level modules: {}.\nMake the lower module not name the higher one: move what both need below them, or pass it in through a trait the lower module owns (see docs/architecture.md).",
                steps.join(", ")
            );
        }
    }
}

#[test]
fn every_file_says_what_it_owns() {
    let src = host_src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let silent: Vec<String> = files
        .iter()
        .filter(|f| {
            !std::fs::read_to_string(f)
                .unwrap()
                .trim_start()
                .starts_with("//!")
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(
        silent.is_empty(),
        "these files do not open with a `//!` comment saying what they own: {silent:?}"
    );
}

//! The documentation cannot drift from the code: every relative link and `#anchor` in
//! `README.md`, `docs/` and `guest-sdk/` resolves, and every page under `docs/` is reachable
//! from the README; every `wharf.toml` example passes `wharf config check`; every `wharf …`
//! command a shell block shows exists; each provider page's capability table says what the
//! comparison table says; and the fault matrix's markers are on the page `cargo xtask chaos`
//! writes to.
//!
//! A `toml` block is a `wharf.toml` example when it has a `[host]`, `[storage]`, `[admin]`,
//! `[external]`, `[inbox…]`, `[queues.…]`, `[providers.…]`, `[telemetry]` or `[schedules.…]` table. An HTML comment on the
//! line right before a block marks it: `<!-- fragment -->` skips it, `<!-- env: NAME=VALUE -->`
//! gives `${NAME}` a value. Otherwise `${NAME:-default}` takes its default and `${NAME}` a
//! dummy value.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use wharf_tests::{TestDir, wharf_binary};

/// The repository root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

/// `path` relative to the repository root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The documentation: `README.md`, every `.md` under `docs/`, and `guest-sdk/*.md`.
fn pages() -> Vec<PathBuf> {
    fn markdown_in(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if recursive {
                    markdown_in(&path, true, out);
                }
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut out = vec![root.join("README.md")];
    markdown_in(&root.join("docs"), true, &mut out);
    markdown_in(&root.join("guest-sdk"), false, &mut out);
    out.sort();
    out
}

/// A fenced code block.
struct Block {
    /// The info string's first word (`toml`, `sh`, `rust,ignore`, or empty).
    lang: String,
    /// The lines between the fences.
    text: String,
    /// The 1-based line of the opening fence.
    line: usize,
    /// The HTML comments on the lines right before the fence, without `<!--` and `-->`.
    marks: Vec<String>,
}

/// A page split into its prose (code blocks blanked, so line numbers stay) and its blocks.
struct Page {
    path: PathBuf,
    prose: String,
    blocks: Vec<Block>,
}

impl Page {
    fn read(path: &Path) -> Page {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", shown(path)));
        let mut prose = String::new();
        let mut blocks = Vec::new();
        let mut open: Option<(String, Block)> = None;
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            match &mut open {
                Some((fence, block)) => {
                    if trimmed.starts_with(fence.as_str())
                        && trimmed
                            .trim_start_matches(fence.chars().next().unwrap_or('`'))
                            .trim()
                            .is_empty()
                    {
                        let (_, block) = open.take().expect("an open block");
                        blocks.push(block);
                    } else {
                        block.text.push_str(line);
                        block.text.push('\n');
                    }
                    prose.push('\n');
                }
                None => {
                    let fence: String = trimmed
                        .chars()
                        .take_while(|&c| c == '`' || c == '~')
                        .collect();
                    let uniform = fence.chars().all(|c| fence.starts_with(c));
                    if fence.len() >= 3 && uniform {
                        let lang = trimmed[fence.len()..]
                            .split_whitespace()
                            .next()
                            .unwrap_or_default()
                            .to_string();
                        let marks = lines[..i]
                            .iter()
                            .rev()
                            .map(|l| l.trim())
                            .take_while(|l| l.starts_with("<!--") && l.ends_with("-->"))
                            .map(|l| {
                                l.trim_start_matches("<!--")
                                    .trim_end_matches("-->")
                                    .trim()
                                    .to_string()
                            })
                            .collect();
                        let block = Block {
                            lang,
                            text: String::new(),
                            line: i + 1,
                            marks,
                        };
                        open = Some((fence, block));
                        prose.push('\n');
                    } else {
                        prose.push_str(line);
                        prose.push('\n');
                    }
                }
            }
        }
        assert!(
            open.is_none(),
            "{}: a code block is never closed",
            shown(path)
        );
        Page {
            path: path.to_path_buf(),
            prose,
            blocks,
        }
    }

    /// The prose with inline code spans blanked (newlines kept).
    fn prose_without_code(&self) -> String {
        let chars: Vec<char> = self.prose.chars().collect();
        let mut out = String::with_capacity(self.prose.len());
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '`' {
                let run = chars[i..].iter().take_while(|&&c| c == '`').count();
                // The closing run of the same length, if there is one.
                let mut j = i + run;
                let mut close = None;
                while j < chars.len() {
                    if chars[j] == '`' {
                        let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                        if other == run {
                            close = Some(j);
                            break;
                        }
                        j += other;
                    } else {
                        j += 1;
                    }
                }
                match close {
                    Some(j) => {
                        out.push_str("code");
                        out.extend(chars[i..j + run].iter().filter(|&&c| c == '\n'));
                        i = j + run;
                    }
                    None => {
                        out.extend(&chars[i..i + run]);
                        i += run;
                    }
                }
            } else {
                out.push(chars[i]);
                i += 1;
            }
        }
        out
    }

    /// The anchors a link may name: each heading's slug (`-1`, `-2`, … for repeats, as GitHub
    /// makes them) and any HTML `id`/`name`.
    fn anchors(&self) -> BTreeSet<String> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut out = BTreeSet::new();
        for line in self.prose.lines() {
            let trimmed = line.trim_start();
            let hashes = trimmed.chars().take_while(|&c| c == '#').count();
            if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
                let base = slug(trimmed[hashes..].trim().trim_end_matches('#').trim());
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            for attr in ["id=\"", "name=\""] {
                for (at, _) in line.match_indices(attr) {
                    let rest = &line[at + attr.len()..];
                    if let Some(end) = rest.find('"') {
                        out.insert(rest[..end].to_string());
                    }
                }
            }
        }
        out
    }

    /// Every link target in the prose, with its line: inline links `[text](target)` (and
    /// images) and reference definitions `[label]: target`.
    fn links(&self) -> Vec<(usize, String)> {
        let text = self.prose_without_code();
        let mut out = Vec::new();
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let mut depth = 0;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = i;
                        break;
                    }
                    ')' => depth -= 1,
                    '\n' => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            let target = target.trim_start_matches('<').trim_end_matches('>');
            let line = text[..at].matches('\n').count() + 1;
            out.push((line, target.to_string()));
        }
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed.strip_prefix('[')
                && let Some((label, target)) = rest.split_once("]:")
                && !label.is_empty()
                && let Some(target) = target.split_whitespace().next()
            {
                out.push((i + 1, target.to_string()));
            }
        }
        out
    }
}

/// The anchor GitHub gives a heading: its text without markup, lowercased, spaces turned into
/// `-`, and every other character that is not a letter, a digit, `-` or `_` dropped.
fn slug(heading: &str) -> String {
    let text = without_link_targets(heading);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// `text` with every `[label](target)` written as `label`.
fn without_link_targets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => rest = &after[end + 1..],
            None => {
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    out.replace(['[', ']'], "")
}

/// `path` with `.` and `..` resolved without touching the filesystem.
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Where `target` (a link on `page`) points, if it points inside the repository.
fn resolve(page: &Path, target: &str) -> Option<(PathBuf, Option<String>)> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor.to_string())),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        normalized(&page.parent().expect("a page's folder").join(path))
    };
    Some((file, anchor))
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("`[storage]` — the SQL queue"),
        "storage--the-sql-queue"
    );
    assert_eq!(
        slug("`[providers.NAME]` and `[external]` — external pending storage"),
        "providersname-and-external--external-pending-storage"
    );
    assert_eq!(slug("Message API (`/api/v1/`)"), "message-api-apiv1");
    assert_eq!(
        slug("Throughput on the user's path"),
        "throughput-on-the-users-path"
    );
    assert_eq!(slug("A minimal `wharf.toml`"), "a-minimal-wharftoml");
    assert_eq!(
        slug("Concurrency, batches and instances"),
        "concurrency-batches-and-instances"
    );
    assert_eq!(slug("[Wharf](../README.md) guide"), "wharf-guide");
}

#[test]
fn every_link_and_anchor_resolves() {
    let pages: Vec<Page> = pages().iter().map(|p| Page::read(p)).collect();
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut linked: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for page in &pages {
        for (line, target) in page.links() {
            let where_ = format!("{}:{line}", shown(&page.path));
            if target.is_empty() {
                problems.push(format!("{where_}: a link without a target"));
                continue;
            }
            let Some((file, anchor)) = resolve(&page.path, &target) else {
                continue;
            };
            if !file.exists() {
                problems.push(format!(
                    "{where_}: `{target}`: {} does not exist",
                    shown(&file)
                ));
                continue;
            }
            linked
                .entry(page.path.clone())
                .or_default()
                .insert(file.clone());
            let Some(anchor) = anchor else {
                continue;
            };
            if file.extension().is_some_and(|e| e == "md") {
                let known = anchors
                    .entry(file.clone())
                    .or_insert_with(|| Page::read(&file).anchors());
                if !known.contains(&anchor) {
                    problems.push(format!(
                        "{where_}: `{target}`: {} has no heading with the anchor `#{anchor}`",
                        shown(&file)
                    ));
                }
            } else if !(anchor.starts_with('L')
                && anchor[1..]
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '-' || c == 'L'))
            {
                problems.push(format!(
                    "{where_}: `{target}`: an anchor into a file that is not Markdown"
                ));
            }
        }
    }
    // Every page under docs/ can be reached from the README.
    let readme = root().join("README.md");
    let mut reached = BTreeSet::from([readme.clone()]);
    let mut next = vec![readme];
    while let Some(page) = next.pop() {
        for file in linked.get(&page).into_iter().flatten() {
            if reached.insert(file.clone()) {
                next.push(file.clone());
            }
        }
    }
    for page in &pages {
        if page.path.starts_with(root().join("docs")) && !reached.contains(&page.path) {
            problems.push(format!(
                "{}: no link leads here from README.md",
                shown(&page.path)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// Whether a `toml` block is (meant as) a whole `wharf.toml`.
fn is_wharf_toml(block: &Block) -> bool {
    block.lang == "toml"
        && block.text.lines().any(|line| {
            let line = line.trim_start();
            [
                "[host]",
                "[storage]",
                "[admin]",
                "[external]",
                "[inbox",
                "[queues.",
                "[providers.",
                "[telemetry]",
                "[schedules.",
            ]
            .iter()
            .any(|table| line.starts_with(table))
        })
}

/// The `${NAME}` and `${NAME:-default}` placeholders of `text`: name → whether it has a
/// default. `$${` is a literal `${`.
fn placeholders(text: &str) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let escaped = at > 0 && rest[..at].ends_with('$');
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            break;
        };
        if !escaped {
            let expr = &after[..end];
            match expr.split_once(":-") {
                Some((name, _)) => out.insert(name.to_string(), true),
                None => out.insert(expr.to_string(), false),
            };
        }
        rest = &after[end + 1..];
    }
    out
}

#[test]
fn every_wharf_toml_example_passes_config_check() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for path in pages() {
        let page = Page::read(&path);
        for block in page.blocks.iter().filter(|b| is_wharf_toml(b)) {
            if block.marks.iter().any(|m| m == "fragment") {
                continue;
            }
            let where_ = format!("{}:{}", shown(&path), block.line);
            let given: BTreeMap<&str, &str> = block
                .marks
                .iter()
                .filter_map(|m| m.strip_prefix("env:"))
                .filter_map(|m| m.trim().split_once('='))
                .collect();
            let dir = TestDir::new();
            std::fs::write(dir.path("wharf.toml"), &block.text).expect("writing wharf.toml");
            let mut cmd = Command::new(wharf_binary());
            cmd.current_dir(dir.dir.path()).args([
                "--config",
                "wharf.toml",
                "config",
                "check",
                "wharf.toml",
            ]);
            for (name, has_default) in placeholders(&block.text) {
                match given.get(name.as_str()) {
                    Some(value) => cmd.env(&name, value),
                    // Empty is unset for the loader: the default applies.
                    None if has_default => cmd.env(&name, ""),
                    None => cmd.env(&name, "dummy"),
                };
            }
            let out = cmd.output().expect("running wharf config check");
            checked += 1;
            if !out.status.success() {
                problems.push(format!(
                    "{where_}: `wharf config check` fails on this example:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(checked >= 5, "only {checked} wharf.toml examples found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The subcommand words of a shown `wharf …` line: the words after `wharf` up to the first
/// option, placeholder (`KEY`, `[FILE]`), quoted or numeric argument, or shell syntax.
fn subcommand(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    let line = line.strip_prefix("$ ").unwrap_or(line);
    let rest = line.strip_prefix("wharf")?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    Some(
        rest.split_whitespace()
            .take_while(|word| {
                word.starts_with(|c: char| c.is_ascii_lowercase())
                    && word
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
            .map(str::to_string)
            .collect(),
    )
}

#[test]
fn every_wharf_command_shown_exists() {
    let mut commands: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for path in pages() {
        let page = Page::read(&path);
        for block in &page.blocks {
            if !["", "sh", "shell", "bash", "console"].contains(&block.lang.as_str()) {
                continue;
            }
            for (i, line) in block.text.lines().enumerate() {
                if let Some(words) = subcommand(line) {
                    commands
                        .entry(words)
                        .or_insert_with(|| format!("{}:{}", shown(&path), block.line + 1 + i));
                }
            }
        }
    }
    assert!(
        commands.len() >= 10,
        "only {} wharf commands found",
        commands.len()
    );
    let mut problems = Vec::new();
    for (words, where_) in &commands {
        let out = Command::new(wharf_binary())
            .args(words)
            .arg("--help")
            .output()
            .expect("running wharf --help");
        if !out.status.success() {
            problems.push(format!(
                "{where_}: `wharf {} --help` fails:\n{}",
                words.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The rows (cells, links written as their text) of the first table after the heading
/// `heading` in `page`.
fn table_after(page: &Page, heading: &str) -> Vec<Vec<String>> {
    let mut lines = page
        .prose
        .lines()
        .skip_while(|line| line.trim() != heading)
        .skip(1)
        .skip_while(|line| !line.starts_with('|'));
    let mut rows = Vec::new();
    for line in lines.by_ref() {
        if !line.starts_with('|') {
            break;
        }
        if line.starts_with("|---") {
            continue;
        }
        rows.push(
            line.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|cell| without_link_targets(cell.trim()))
                .collect(),
        );
    }
    rows
}

#[test]
fn each_provider_page_has_its_column_of_the_capability_table() {
    let docs = root().join("docs");
    let all = table_after(
        &Page::read(&docs.join("external-storage.md")),
        "## What each provider does",
    );
    let header = all.first().expect("the capability table");
    let mut pages_found = 0;
    for entry in std::fs::read_dir(docs.join("providers")).expect("docs/providers") {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let page = Page::read(&path);
        let own = table_after(&page, "## Capabilities");
        let Some(name) = own.first().and_then(|h| h.get(1)) else {
            panic!("{}: no `## Capabilities` table", shown(&path));
        };
        let column = header.iter().position(|h| h == name).unwrap_or_else(|| {
            panic!(
                "{}: `{name}` is not a column of the capability table",
                shown(&path)
            )
        });
        let expected: Vec<(String, String)> = all[1..]
            .iter()
            .map(|row| (row[0].clone(), row[column].clone()))
            .collect();
        let actual: Vec<(String, String)> = own[1..]
            .iter()
            .map(|row| (row[0].clone(), row.get(1).cloned().unwrap_or_default()))
            .collect();
        assert_eq!(
            actual,
            expected,
            "{}: its capabilities differ from its column in docs/external-storage.md",
            shown(&path)
        );
        pages_found += 1;
    }
    assert_eq!(
        pages_found,
        header.len() - 1,
        "every provider of the capability table has a page under docs/providers/"
    );
}

#[test]
fn the_fault_matrix_is_where_xtask_chaos_writes_it() {
    let text =
        std::fs::read_to_string(root().join("docs/guarantees.md")).expect("docs/guarantees.md");
    let start = text.find("<!-- chaos-table:start -->");
    let end = text.find("<!-- chaos-table:end -->");
    assert!(
        matches!((start, end), (Some(s), Some(e)) if s < e),
        "docs/guarantees.md holds the fault matrix between its chaos-table markers"
    );
}

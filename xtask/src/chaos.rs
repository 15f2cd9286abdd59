//! `cargo xtask chaos`: the long form of the fault matrix (`tests/tests/chaos`), one case at
//! a time, and its table written into [`PAGE`] (the delivery guarantees) between the
//! `chaos-table` markers.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::{services, tools};

/// The page that holds the fault matrix table, relative to the repository root.
pub const PAGE: &str = "docs/guarantees.md";
const START: &str = "<!-- chaos-table:start -->";
const END: &str = "<!-- chaos-table:end -->";

/// Run every case (or those whose names contain one of `cases`) with `messages` messages and
/// `cut_secs`-second network cuts (`crash_messages` for the cases with repeated kills), then
/// write the table (or replace those cases' rows in it). With no `cases`, or `state_crash`
/// among them, the state crash test runs too, with `crash_messages`.
pub fn run(messages: u64, cut_secs: u64, crash_messages: u64, cases: &[String]) -> Result<()> {
    tools::ensure_nextest()?;
    services::ensure_postgres()?;
    services::ensure_redis()?;
    services::ensure_rabbitmq()?;
    services::ensure_kafka()?;
    tools::build_guests()?;
    let out = tools::root().join("target/chaos/rows.jsonl");
    std::fs::create_dir_all(out.parent().expect("a folder"))?;
    let _ = std::fs::remove_file(&out);
    let state_crash = cases.is_empty() || cases.iter().any(|c| c == "state_crash");
    let matrix: Vec<&String> = cases.iter().filter(|c| *c != "state_crash").collect();
    let mut outcome = Ok(());
    if cases.is_empty() || !matrix.is_empty() {
        let mut cmd = tools::nextest_one("chaos");
        cmd.args(["--test-threads", "1", "--no-fail-fast"]);
        cmd.args(&matrix);
        cmd.env("WHARF_CHAOS_MESSAGES", messages.to_string())
            .env("WHARF_CHAOS_CUT_SECS", cut_secs.to_string())
            .env("WHARF_STATE_CRASH_MESSAGES", crash_messages.to_string())
            .env("WHARF_CHAOS_OUT", &out);
        outcome = tools::run(cmd);
    }
    if state_crash {
        let mut cmd = tools::nextest_one("state_crash");
        cmd.args(["--test-threads", "1", "--no-fail-fast"]);
        cmd.env("WHARF_STATE_CRASH_MESSAGES", crash_messages.to_string());
        outcome = outcome.and(tools::run(cmd));
        if matrix.is_empty() && !cases.is_empty() {
            return outcome;
        }
    }
    let page = tools::root().join(PAGE);
    let mut rows = read_rows(&out)?;
    if !cases.is_empty() {
        rows = merged(&current_table(&page)?, rows, &heading(messages, cut_secs))?;
    }
    let table = table(rows, messages, cut_secs);
    println!("{table}");
    write_table(&page, &table)?;
    outcome
}

/// The rows a run wrote into `path`.
fn read_rows(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("a chaos row is not JSON")
}

/// The page's text and where its markers start.
fn page_with_markers(page: &Path) -> Result<(String, usize, usize)> {
    let text =
        std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
    let (Some(start), Some(end)) = (text.find(START), text.find(END)) else {
        bail!("{} has no {START} … {END} markers", page.display());
    };
    if end < start {
        bail!("{}: {END} comes before {START}", page.display());
    }
    Ok((text, start, end))
}

/// The text between the page's markers.
fn current_table(page: &Path) -> Result<String> {
    let (text, start, end) = page_with_markers(page)?;
    Ok(text[start + START.len()..end].to_string())
}

/// The fault table's rows, as rows, with `fresh` in place of those of the same backend and
/// fault. The table must have been made with the same settings (its first line is `heading`).
fn merged(
    current: &str,
    fresh: Vec<serde_json::Value>,
    heading: &str,
) -> Result<Vec<serde_json::Value>> {
    if current.trim_start().lines().next() != Some(heading) {
        bail!(
            "the fault table in {PAGE} was made with other settings than `--messages`/`--cut-secs` \
             given now: run every case to rewrite it"
        );
    }
    let mut rows: Vec<serde_json::Value> = current
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| backend"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            let number = |i: usize| -> Result<u64> {
                let cell = cells.get(i).copied().unwrap_or_default();
                cell.trim_end_matches(" ms")
                    .parse()
                    .with_context(|| format!("the fault table row `{line}` in {PAGE}"))
            };
            Ok(serde_json::json!({
                "backend": cells[0],
                "fault": cells.get(1),
                "lost": number(2)?,
                "duplicates": number(3)?,
                "recovered_ms": number(4)?,
                "health": cells.get(5),
            }))
        })
        .collect::<Result<_>>()?;
    let key = |r: &serde_json::Value| (r["backend"].to_string(), r["fault"].to_string());
    rows.retain(|old| !fresh.iter().any(|new| key(new) == key(old)));
    rows.extend(fresh);
    Ok(rows)
}

fn heading(messages: u64, cut_secs: u64) -> String {
    format!(
        "{messages} messages per case, network cuts, store crashes and broker outages of {cut_secs} s (`cargo xtask chaos`):"
    )
}

/// The Markdown table of `rows`, sorted by backend and fault.
fn table(mut rows: Vec<serde_json::Value>, messages: u64, cut_secs: u64) -> String {
    rows.sort_by_key(|r| (r["backend"].to_string(), r["fault"].to_string()));
    let mut out = format!(
        "{}\n\n\
         | backend | fault | lost | duplicate runs | processing resumed after | /readyz |\n\
         |---|---|---|---|---|---|\n",
        heading(messages, cut_secs)
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} ms | {} |\n",
            r["backend"].as_str().unwrap_or("?"),
            r["fault"].as_str().unwrap_or("?"),
            r["lost"],
            r["duplicates"],
            r["recovered_ms"],
            r["health"].as_str().unwrap_or("?"),
        ));
    }
    out
}

/// Replace the text between the markers in the page with `table`.
fn write_table(page: &Path, table: &str) -> Result<()> {
    let (text, start, end) = page_with_markers(page)?;
    let updated = format!("{}{START}\n{table}{}", &text[..start], &text[end..]);
    std::fs::write(page, updated)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_run_replaces_only_its_rows() {
        let heading = heading(10, 1);
        let current = format!(
            "\n{heading}\n\n| backend | fault | lost | duplicate runs | processing resumed after | /readyz |\n\
             |---|---|---|---|---|---|\n\
             | Kafka | network cut | 0 | 3 | 900 ms | stayed green |\n\
             | Redis | network cut | 0 | 1 | 50 ms | red, then green |\n"
        );
        let fresh = vec![serde_json::json!({
            "backend": "Kafka", "fault": "network cut", "lost": 0, "duplicates": 0,
            "recovered_ms": 700, "health": "red, then green",
        })];
        let table = table(merged(&current, fresh, &heading).unwrap(), 10, 1);
        assert!(table.contains("| Kafka | network cut | 0 | 0 | 700 ms | red, then green |"));
        assert!(table.contains("| Redis | network cut | 0 | 1 | 50 ms | red, then green |"));
        assert!(!table.contains("stayed green"), "{table}");
        assert!(merged(&current, Vec::new(), &super::heading(20, 1)).is_err());
    }
    /// The committed table is where `cargo xtask chaos` looks for it, and exactly what it
    /// would write back: a partial run can merge into it.
    #[test]
    fn the_committed_table_reads_back_as_written() {
        let page = tools::root().join(PAGE);
        let current = current_table(&page).unwrap();
        let first = current.trim_start().lines().next().unwrap_or_default();
        let number = |text: &str| -> u64 {
            text.parse()
                .unwrap_or_else(|_| panic!("the table's first line `{first}` is not a heading"))
        };
        let messages = number(first.split(' ').next().unwrap_or_default());
        let cut_secs = number(
            first
                .split(" s (")
                .next()
                .and_then(|s| s.rsplit(' ').next())
                .unwrap_or_default(),
        );
        assert_eq!(first, heading(messages, cut_secs));
        let rows = merged(&current, Vec::new(), first).unwrap();
        assert!(!rows.is_empty(), "{PAGE}: the fault table has no rows");
        assert_eq!(
            format!("\n{}", table(rows, messages, cut_secs)),
            current,
            "{PAGE}: the fault table differs from what `cargo xtask chaos` writes"
        );
    }
}

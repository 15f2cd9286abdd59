//! `cargo xtask chaos`: the long form of the fault matrix (`tests/tests/chaos`), one case at
//! a time, and its table written into the README between the `chaos-table` markers.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::{services, tools};

const START: &str = "<!-- chaos-table:start -->";
const END: &str = "<!-- chaos-table:end -->";

/// Run every case with `messages` messages and `cut_secs`-second network cuts, then write
/// the table.
pub fn run(messages: u64, cut_secs: u64) -> Result<()> {
    tools::ensure_nextest()?;
    services::ensure_postgres()?;
    services::ensure_redis()?;
    services::ensure_rabbitmq()?;
    services::ensure_kafka()?;
    tools::build_guests()?;
    let out = tools::root().join("target/chaos/rows.jsonl");
    std::fs::create_dir_all(out.parent().expect("a folder"))?;
    let _ = std::fs::remove_file(&out);
    let mut cmd = tools::nextest_one("chaos");
    cmd.args(["--test-threads", "1", "--no-fail-fast"]);
    cmd.env("WHARF_CHAOS_MESSAGES", messages.to_string())
        .env("WHARF_CHAOS_CUT_SECS", cut_secs.to_string())
        .env("WHARF_CHAOS_OUT", &out);
    let outcome = tools::run(cmd);
    let table = table(&out, messages, cut_secs)?;
    println!("{table}");
    write_readme(&tools::root().join("README.md"), &table)?;
    outcome
}

/// The Markdown table of the rows in `path`, sorted by backend and fault.
fn table(path: &Path, messages: u64, cut_secs: u64) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("a chaos row is not JSON")?;
    rows.sort_by_key(|r| (r["backend"].to_string(), r["fault"].to_string()));
    let mut out = format!(
        "{messages} messages per case, network cuts, store crashes and broker outages of {cut_secs} s (`cargo xtask chaos`):\n\n\
         | backend | fault | lost | duplicate runs | processing resumed after | /readyz |\n\
         |---|---|---|---|---|---|\n"
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
    Ok(out)
}

/// Replace the text between the markers in the README with `table`.
fn write_readme(readme: &Path, table: &str) -> Result<()> {
    let text = std::fs::read_to_string(readme)?;
    let (Some(start), Some(end)) = (text.find(START), text.find(END)) else {
        bail!("{} has no {START} … {END} markers", readme.display());
    };
    let updated = format!("{}{START}\n{table}{}", &text[..start], &text[end..]);
    std::fs::write(readme, updated)?;
    Ok(())
}

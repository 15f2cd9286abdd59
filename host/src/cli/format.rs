//! Output helpers: tables for people, JSON for scripts, readable timestamps.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use super::Cli;

/// A table with the given header.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    t
}

/// Unix milliseconds as RFC 3339 (UTC, milliseconds).
pub fn time(ms: i64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
        .to_string()
}

/// Shorten `text` to `max` characters for a table cell.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// Print a value as pretty JSON.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Print how many messages a command changed, or fail when it changed none.
pub(crate) fn report(cli: &Cli, what: &str, changed: u64) -> anyhow::Result<ExitCode> {
    if cli.json {
        print_json(&serde_json::json!({ "changed": changed }))?;
    } else {
        println!("{what}: {changed} message(s)");
    }
    Ok(if changed == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

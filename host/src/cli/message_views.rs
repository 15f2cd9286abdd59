//! How `wharf messages` shows messages: a table per command (history, list, one message),
//! or JSON with `--json`.

use super::Cli;
use super::format::{clip, print_json, table, time};
use crate::queue::{HistoryEntry, StoredMessage};

/// The kept versions of one MessageId, oldest first.
pub(super) fn print_history(cli: &Cli, history: &[HistoryEntry]) -> anyhow::Result<()> {
    if cli.json {
        print_json(history)?;
    } else {
        let mut t = table(&[
            "version",
            "status",
            "attempts",
            "enqueued at",
            "recorded at",
            "payload",
            "last error",
        ]);
        for h in history {
            t.add_row(vec![
                h.version.to_string(),
                h.status.to_string(),
                h.attempts.to_string(),
                time(h.enqueued_at_ms),
                time(h.recorded_at_ms),
                clip(&h.payload, 40),
                clip(h.last_error.as_deref().unwrap_or(""), 40),
            ]);
        }
        println!("{t}");
    }
    Ok(())
}

/// A page of messages, newest first; `more` says more match than the `limit` shown.
pub(super) fn print_list(
    cli: &Cli,
    messages: &[StoredMessage],
    limit: u32,
    more: bool,
) -> anyhow::Result<()> {
    if cli.json {
        print_json(messages)?;
    } else {
        // A session column when some listed message is in a session.
        let sessions = messages.iter().any(|m| m.session.is_some());
        let mut headers = vec!["key", "queue", "id", "status"];
        if sessions {
            headers.push("session");
        }
        headers.extend(["prio", "attempts", "process at", "payload", "last error"]);
        let mut t = table(&headers);
        for m in messages {
            let mut row = vec![
                m.key.to_string(),
                m.queue.clone(),
                m.id.clone().unwrap_or_default(),
                m.status.to_string(),
            ];
            if sessions {
                row.push(m.session.clone().unwrap_or_default());
            }
            row.extend([
                m.priority.to_string(),
                m.attempts.to_string(),
                time(m.process_at_ms),
                clip(&m.payload, 40),
                clip(m.last_error.as_deref().unwrap_or(""), 50),
            ]);
            t.add_row(row);
        }
        println!("{t}");
        if more {
            println!(
                "showing the newest {limit}; more match (raise --limit, or filter by --queue / --status)"
            );
        }
    }
    Ok(())
}

/// One message, every field.
pub(super) fn print_message(cli: &Cli, m: &StoredMessage) -> anyhow::Result<()> {
    if cli.json {
        print_json(m)?;
    } else {
        let mut t = table(&["field", "value"]);
        let opt_time = |v: Option<i64>| v.map(time).unwrap_or_default();
        for (k, v) in [
            ("key", m.key.to_string()),
            ("queue", m.queue.clone()),
            ("id", m.id.clone().unwrap_or_default()),
            ("delivery id", m.delivery_id.clone()),
            ("status", m.status.to_string()),
            ("session", m.session.clone().unwrap_or_default()),
            ("priority", m.priority.to_string()),
            ("attempts", m.attempts.to_string()),
            ("process at", time(m.process_at_ms)),
            ("created at", time(m.created_at_ms)),
            ("enqueued at", time(m.enqueued_at_ms)),
            ("updated at", time(m.updated_at_ms)),
            ("processed at", opt_time(m.processed_at_ms)),
            ("lease expires", opt_time(m.lease_expires_at_ms)),
            ("headers", serde_json::to_string(&m.headers)?),
            ("payload", m.payload.clone()),
            ("last error", m.last_error.clone().unwrap_or_default()),
            ("version", m.version.to_string()),
            (
                "waiting version",
                m.next
                    .as_ref()
                    .map(|n| n.payload.clone())
                    .unwrap_or_default(),
            ),
        ] {
            t.add_row(vec![k.to_string(), v]);
        }
        println!("{t}");
    }
    Ok(())
}

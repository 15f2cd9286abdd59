//! `wharf status`: one screen from the running host — readiness with each health check
//! (providers included), every queue with its counts by status and recent rates, follow-ups
//! waiting in the outbox, and the deployed handlers. `--json` prints the same as one object.

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use super::client::AdminClient;
use super::format::{print_json, table};
use super::{Cli, load_config};
use crate::admin::api::QueueInfo;
use crate::admin::{CheckReport, HandlerInfo};

/// `/readyz` as the CLI reads it.
#[derive(Debug, Serialize, Deserialize)]
struct Readiness {
    status: String,
    checks: BTreeMap<String, CheckReport>,
}

/// Everything `wharf status` shows.
#[derive(Debug, Serialize)]
struct Status {
    ready: Readiness,
    queues: Vec<QueueInfo>,
    handlers: Vec<HandlerInfo>,
}

/// The statuses shown as columns; others are summed under "other".
const COLUMNS: [&str; 5] = ["pending", "processing", "processed", "failed", "sleeping"];

/// Run `wharf status`.
pub async fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    let config = load_config(&cli.config)?;
    let client = AdminClient::new(&config);
    let status = Status {
        ready: client.get("/readyz").await?,
        queues: client.get("/api/v1/queues").await?,
        handlers: client.get("/handlers").await?,
    };
    if cli.json {
        print_json(&status)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("host: {}", status.ready.status);
    for (name, check) in &status.ready.checks {
        let mark = if check.healthy { "ok" } else { "FAILING" };
        println!("  {name}: {mark} ({})", check.detail);
    }
    println!();
    let mut headers = vec!["queue", "handler", "storage"];
    headers.extend(COLUMNS);
    headers.extend(["other", "processed/s", "failed/s"]);
    let mut queues = table(&headers);
    for q in &status.queues {
        let handler = match &q.handler {
            None => "(none: holds its messages)".to_string(),
            Some(handler) if q.handler_deployed => handler.clone(),
            Some(handler) => format!("{handler} (not deployed)"),
        };
        let storage = match &q.provider {
            Some(provider) => format!("{} ({provider})", q.storage),
            None => q.storage.clone(),
        };
        let external = q.storage == "external";
        let mut row = vec![q.name.clone(), handler, storage];
        for column in COLUMNS {
            let n = q.counts.get(column).copied().unwrap_or(0);
            row.push(match column {
                // An external queue's successes leave no row in SQL: this host's count.
                "processed" if external => format!("{}*", q.since_start.processed),
                _ => n.to_string(),
            });
        }
        let other: u64 = q
            .counts
            .iter()
            .filter(|(s, _)| !COLUMNS.contains(&s.as_str()))
            .map(|(_, n)| n)
            .sum();
        row.push(other.to_string());
        row.push(format!("{:.1}", q.rates.processed_per_s));
        row.push(format!("{:.1}", q.rates.failed_per_s));
        queues.add_row(row);
    }
    println!("{queues}");
    if status.queues.iter().any(|q| q.storage == "external") {
        println!(
            "* external queue: processed by this host since it started (the broker keeps no record of successes)"
        );
    }
    let now = crate::queue::now_ms();
    for (queue, waiting) in status
        .queues
        .iter()
        .filter_map(|q| Some((&q.name, q.outbox.as_ref()?)))
    {
        let age = (now - waiting.oldest_ms).max(0) / 1000;
        let error = waiting
            .last_error
            .as_deref()
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        println!(
            "outbox: {} follow-up(s) for `{queue}` not yet published, oldest {age} s{error}",
            waiting.rows
        );
    }
    println!();
    let mut handlers = table(&["handler", "sha256", "loaded at", "memory"]);
    for h in &status.handlers {
        handlers.add_row(vec![
            h.name.clone(),
            h.sha256[..16].to_string(),
            h.loaded_at.clone(),
            h.memory_limit.clone(),
        ]);
    }
    println!("{handlers}");
    Ok(ExitCode::SUCCESS)
}

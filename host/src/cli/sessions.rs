//! `wharf sessions list` and `wharf messages complete|fail`: the operator's side of ordered
//! sessions, on the store directly (no running host needed).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;

use super::Cli;
use super::format::report;
use super::format::{clip, print_json, table, time};
use super::open_store;
use crate::queue::{QueueStore, Status};

/// `wharf sessions …`.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// Blocked sessions with the message that blocks each and how many wait behind it,
    /// oldest block first.
    List {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// `wharf sessions …`.
pub async fn run(cli: &Cli, cmd: &SessionsCommand) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    let SessionsCommand::List { queue, limit } = cmd;
    let mut blocked = store
        .blocked_sessions(queue.as_deref(), limit.saturating_add(1))
        .await?;
    let more = blocked.len() > *limit as usize;
    blocked.truncate(*limit as usize);
    if cli.json {
        print_json(&blocked)?;
        return Ok(ExitCode::SUCCESS);
    }
    if blocked.is_empty() {
        println!("no blocked sessions");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(&[
        "queue",
        "session",
        "blocked by",
        "status",
        "parked",
        "since",
        "last error",
    ]);
    for b in &blocked {
        t.add_row(vec![
            b.queue.clone(),
            b.session.clone(),
            b.blocked_by_key.to_string(),
            b.status.to_string(),
            b.parked.to_string(),
            time(b.since_ms),
            clip(b.last_error.as_deref().unwrap_or(""), 50),
        ]);
    }
    println!("{t}");
    if more {
        println!(
            "showing the oldest {limit}; more are blocked (raise --limit, or filter by --queue)"
        );
    }
    println!(
        "resolve a block: `wharf messages retry KEY`, `delete KEY`, `move KEY STATUS`, or for a handoff `complete KEY` / `fail KEY`"
    );
    Ok(ExitCode::SUCCESS)
}

/// `wharf messages complete|fail KEY`: settle a handed-off message.
pub(super) async fn settle_handoff(
    cli: &Cli,
    store: &Arc<dyn QueueStore>,
    key: i64,
    failure: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let settled = store.settle_handoff(key, failure).await?;
    if !settled {
        let now = match store.get(key).await? {
            Some(m) => format!("it is {}", m.status),
            None => "there is no such message".to_string(),
        };
        eprintln!("error: message {key} is not {} ({now})", Status::HandedOff);
    }
    let what = if failure.is_some() {
        "handoff settled as failed"
    } else {
        "handoff settled as completed"
    };
    report(cli, what, u64::from(settled))
}

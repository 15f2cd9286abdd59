//! `wharf enqueue` and `wharf messages list|show`: work on the store directly, so they
//! need no running host.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::format::{clip, print_json, table, time};
use super::{Cli, load_config};
use crate::enqueue::{Enqueuer, QueueRouter};
use crate::queue::{self, MessageFilter, NewMessage, QueueStore, Status, now_ms};

/// `wharf enqueue QUEUE JSON …`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Target queue.
    pub queue: String,
    /// The message JSON.
    #[arg(value_name = "JSON")]
    pub payload: String,
    /// Message identity: an existing message with this id is updated instead.
    #[arg(long)]
    pub id: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Do not process before this delay has passed (e.g. `5m`, `30s`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub delay: Option<std::time::Duration>,
    /// A header `NAME=VALUE` (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not NAME=VALUE"))
}

/// `wharf messages …`.
#[derive(Debug, Subcommand)]
pub enum MessagesCommand {
    /// List messages, newest first.
    List {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only this status (pending, processing, processed, failed, sleeping, …).
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one message by its key.
    Show {
        /// The message key (first column of `messages list`).
        key: i64,
    },
}

async fn open_store(cli: &Cli) -> anyhow::Result<(crate::Config, Arc<dyn QueueStore>)> {
    let config = load_config(&cli.config)?;
    let store = queue::open(&config.storage.url, config.storage.schema.as_deref(), 2)
        .await
        .with_context(|| format!("opening the queue storage at {}", config.storage.url))?;
    Ok((config, store))
}

/// `wharf enqueue`.
pub async fn enqueue(cli: &Cli, args: &EnqueueArgs) -> anyhow::Result<ExitCode> {
    let (config, store) = open_store(cli).await?;
    let router = QueueRouter::new(store, &config);
    let message = NewMessage {
        id: args.id.clone(),
        payload: args.payload.clone(),
        priority: args.priority,
        process_at_ms: args.delay.map(|d| now_ms() + d.as_millis() as i64),
        headers: args.headers.clone(),
        status: None,
    };
    let done = router.enqueue(&args.queue, message).await?;
    if cli.json {
        print_json(&done)?;
    } else {
        let what = match done.status {
            queue::EnqueueStatus::Added => "added",
            queue::EnqueueStatus::Updated => "updated existing message",
            queue::EnqueueStatus::Discarded => "discarded (identical message already queued)",
        };
        println!("{what}: key {} in queue {}", done.key, args.queue);
    }
    Ok(ExitCode::SUCCESS)
}

/// `wharf messages …`.
pub async fn run(cli: &Cli, cmd: &MessagesCommand) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    match cmd {
        MessagesCommand::List {
            queue,
            status,
            limit,
        } => {
            let filter = MessageFilter {
                queue: queue.clone(),
                status: status.as_deref().map(Status::parse),
                limit: *limit,
            };
            let messages = store.list(&filter).await?;
            if cli.json {
                print_json(&messages)?;
            } else {
                let mut t = table(&[
                    "key",
                    "queue",
                    "id",
                    "status",
                    "prio",
                    "attempts",
                    "process at",
                    "payload",
                    "last error",
                ]);
                for m in &messages {
                    t.add_row(vec![
                        m.key.to_string(),
                        m.queue.clone(),
                        m.id.clone().unwrap_or_default(),
                        m.status.to_string(),
                        m.priority.to_string(),
                        m.attempts.to_string(),
                        time(m.process_at_ms),
                        clip(&m.payload, 40),
                        clip(m.last_error.as_deref().unwrap_or(""), 50),
                    ]);
                }
                println!("{t}");
            }
        }
        MessagesCommand::Show { key } => {
            let Some(m) = store.get(*key).await? else {
                eprintln!("error: no message with key {key}");
                return Ok(ExitCode::from(1));
            };
            if cli.json {
                print_json(&m)?;
            } else {
                let mut t = table(&["field", "value"]);
                let opt_time = |v: Option<i64>| v.map(time).unwrap_or_default();
                for (k, v) in [
                    ("key", m.key.to_string()),
                    ("queue", m.queue.clone()),
                    ("id", m.id.clone().unwrap_or_default()),
                    ("delivery id", m.delivery_id.clone()),
                    ("status", m.status.to_string()),
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
                ] {
                    t.add_row(vec![k.to_string(), v]);
                }
                println!("{t}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

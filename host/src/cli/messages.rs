//! `wharf enqueue` and `wharf messages list|show`: work on the store directly, so they
//! need no running host.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};

use super::Cli;
use super::format::{print_json, report};
use super::message_views::{print_history, print_list, print_message};
use super::open_store;
use crate::enqueue::{Enqueuer, Pointers, QueueRouter};
use crate::queue::{self, MessageFilter, NewMessage, Selector, Status, limits, now_ms};

/// `wharf enqueue QUEUE JSON …` or `wharf enqueue QUEUE --file messages.jsonl`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Target queue.
    pub queue: String,
    /// The message JSON.
    #[arg(
        value_name = "JSON",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub payload: Option<String>,
    /// Enqueue every line of a JSON Lines file (one message payload per line).
    #[arg(long, value_name = "FILE.jsonl")]
    pub file: Option<std::path::PathBuf>,
    /// With --file: take each message's id from this JSON pointer (e.g. `/order_id`).
    #[arg(long, value_name = "POINTER", requires = "file")]
    pub id_from: Option<String>,
    /// Store the message in this custom status (kept, not processed, until moved).
    #[arg(long)]
    pub status: Option<String>,
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
    /// Session key: in a queue with `sessions = true`, messages with the same key run one at
    /// a time, in enqueue order.
    #[arg(long)]
    pub session: Option<String>,
    /// With --file: take each message's session key from this JSON pointer (e.g.
    /// `/customer_id`).
    #[arg(
        long,
        value_name = "POINTER",
        requires = "file",
        conflicts_with = "session"
    )]
    pub session_from: Option<String>,
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
        /// Only this session.
        #[arg(long)]
        session: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Settle a handed-off message as completed: its session is unblocked and drained.
    Complete {
        /// The message key.
        key: i64,
    },
    /// Settle a handed-off message as failed (kept for inspection): its session is unblocked
    /// and drained.
    Fail {
        /// The message key.
        key: i64,
        /// What went wrong, kept as its last error.
        #[arg(long, default_value = "the handoff failed")]
        error: String,
    },
    /// Show one message by its key.
    Show {
        /// The message key (first column of `messages list`).
        key: i64,
    },
    /// Make messages ready again now, attempts reset: one by key, or all of a queue in a
    /// status (default status: failed).
    Retry {
        /// The message key.
        #[arg(required_unless_present = "queue", conflicts_with = "queue")]
        key: Option<i64>,
        /// Every message of this queue in `--status`.
        #[arg(long)]
        queue: Option<String>,
        /// With --queue: the status to retry.
        #[arg(long, default_value = "failed", requires = "queue")]
        status: String,
    },
    /// Delete a message (not while it is being processed).
    Delete {
        /// The message key.
        key: i64,
    },
    /// Move a message to another status, e.g. `pending`, `failed` or a custom one.
    Move {
        /// The message key.
        key: i64,
        /// The new status.
        status: String,
    },
    /// Previous versions of an identified message.
    History {
        /// The key of the message (or use --queue and --id).
        #[arg(required_unless_present = "id", conflicts_with = "id")]
        key: Option<i64>,
        /// The message's queue.
        #[arg(long, requires = "id")]
        queue: Option<String>,
        /// The message's id.
        #[arg(long, requires = "queue")]
        id: Option<String>,
    },
}

/// `wharf enqueue`.
pub async fn enqueue(cli: &Cli, args: &EnqueueArgs) -> anyhow::Result<ExitCode> {
    let (config, store) = open_store(cli).await?;
    let tracing = crate::telemetry::start_if(config.traces.as_ref())?;
    let done = enqueue_with(cli, args, config, store).await;
    if let Some(tracing) = tracing {
        tracing.finish().await;
    }
    done
}

/// [`enqueue`], its configuration and store open.
async fn enqueue_with(
    cli: &Cli,
    args: &EnqueueArgs,
    config: crate::Config,
    store: std::sync::Arc<dyn crate::queue::QueueStore>,
) -> anyhow::Result<ExitCode> {
    let providers = crate::external::Providers::open(&config)
        .await
        .map_err(|(name, e)| {
            anyhow::anyhow!("opening provider `{name}` ([providers.{name}]): {e}")
        })?;
    if (args.session.is_some() || args.session_from.is_some())
        && config.queues.get(&args.queue).is_some_and(|q| !q.sessions)
    {
        providers.close().await;
        anyhow::bail!(
            "queue `{0}` does not keep sessions: add `sessions = true` to [queues.{0}] (or leave out --session)",
            args.queue
        );
    }
    let router = QueueRouter::new(store, &config, &providers);
    let template = NewMessage {
        id: args.id.clone(),
        payload: String::new(),
        priority: args.priority,
        process_at_ms: args
            .delay
            .map(|d| limits::due_after(now_ms(), u64::try_from(d.as_millis()).unwrap_or(u64::MAX))),
        headers: args.headers.clone(),
        status: args.status.as_deref().map(parse_status).transpose()?,
        last_error: None,
        source_delivery_id: None,
        attempts: 0,
        session: args.session.clone(),
    };
    if let Some(file) = &args.file {
        let pointers = Pointers {
            id: args.id_from.as_deref(),
            session: args.session_from.as_deref(),
        };
        let done =
            super::bulk::enqueue_file(cli, Arc::new(router), &args.queue, file, pointers, template)
                .await;
        providers.close().await;
        return done;
    }
    let mut message = NewMessage {
        payload: args.payload.clone().unwrap_or_default(),
        ..template
    };
    router.trace_send(&args.queue, &mut message);
    let done = router.enqueue(&args.queue, message).await;
    providers.close().await;
    let done = done?;
    if cli.json {
        print_json(&done)?;
    } else {
        let what = match done.status {
            queue::EnqueueStatus::Added => "added",
            queue::EnqueueStatus::Updated => "updated existing message",
            queue::EnqueueStatus::Discarded => "discarded (identical message already queued)",
        };
        if done.key == 0 {
            // Kept by the queue's provider, not in the SQL queue: its MessageId is what
            // identifies it there (and in the consumer inbox).
            let id = match &args.id {
                Some(id) => format!("MessageId {id}"),
                None => "no MessageId (--id gives it one)".to_string(),
            };
            println!(
                "{what}: in the broker of external queue {}, {id}",
                args.queue
            );
        } else {
            println!("{what}: key {} in queue {}", done.key, args.queue);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A status named on the command line; `processing` and `awaiting-release` belong to the
/// host and cannot be set by hand.
fn parse_status(name: &str) -> anyhow::Result<Status> {
    let status = Status::parse(name);
    if matches!(
        status,
        Status::Processing | Status::AwaitingRelease | Status::Parked | Status::HandedOff
    ) || !crate::config::is_valid_name(name)
    {
        anyhow::bail!(
            "`{name}` cannot be set by hand (the host sets processing, awaiting-release, parked and handed-off): use pending, failed, sleeping, processed or a custom name"
        );
    }
    Ok(status)
}

/// `wharf messages …`.
pub async fn run(cli: &Cli, cmd: &MessagesCommand) -> anyhow::Result<ExitCode> {
    let (_, store) = open_store(cli).await?;
    match cmd {
        MessagesCommand::Retry { key, queue, status } => {
            let selector = match (key, queue) {
                (Some(key), _) => Selector::Key(*key),
                (None, Some(queue)) => Selector::QueueStatus {
                    queue: queue.clone(),
                    status: parse_status(status)?,
                },
                (None, None) => anyhow::bail!("give a message key or --queue"),
            };
            let changed = store.retry(&selector).await?;
            return report(cli, "made ready again", changed);
        }
        MessagesCommand::Delete { key } => {
            let changed = u64::from(store.delete(*key).await?);
            if changed == 0 {
                eprintln!("error: no message with key {key}, or it is being processed");
            }
            return report(cli, "deleted", changed);
        }
        MessagesCommand::Move { key, status } => {
            let changed = u64::from(store.move_to(*key, &parse_status(status)?).await?);
            if changed == 0 {
                eprintln!("error: no message with key {key}, or it is being processed");
            }
            return report(cli, &format!("moved to {status}"), changed);
        }
        MessagesCommand::History { key, queue, id } => {
            let (queue, id) = match (key, queue, id) {
                (Some(key), _, _) => {
                    let m = store
                        .get(*key)
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("no message with key {key}"))?;
                    let id = m.id.ok_or_else(|| {
                        anyhow::anyhow!("message {key} has no id, so it has no history")
                    })?;
                    (m.queue, id)
                }
                (None, Some(q), Some(i)) => (q.clone(), i.clone()),
                _ => anyhow::bail!("give a message key, or --queue and --id"),
            };
            let history = store.history(&queue, &id).await?;
            print_history(cli, &history)?;
            return Ok(ExitCode::SUCCESS);
        }
        MessagesCommand::Complete { key } => {
            return super::sessions::settle_handoff(cli, &store, *key, None).await;
        }
        MessagesCommand::Fail { key, error } => {
            return super::sessions::settle_handoff(cli, &store, *key, Some(error)).await;
        }
        MessagesCommand::List {
            queue,
            status,
            session,
            limit,
        } => {
            // One more than shown tells whether there are more.
            let filter = MessageFilter {
                queue: queue.clone(),
                status: status.as_deref().map(Status::parse),
                session: session.clone(),
                limit: limit.saturating_add(1),
                ..Default::default()
            };
            let mut messages = store.list(&filter).await?;
            let more = messages.len() > *limit as usize;
            messages.truncate(*limit as usize);
            print_list(cli, &messages, *limit, more)?;
        }
        MessagesCommand::Show { key } => {
            let Some(m) = store.get(*key).await? else {
                eprintln!("error: no message with key {key}");
                return Ok(ExitCode::from(1));
            };
            print_message(cli, &m)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

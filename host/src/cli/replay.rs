//! `wharf replay`: run stored messages against a candidate component before deploying it —
//! one message in detail, or a queue's messages in a status as a table with a summary. The
//! candidate's enqueues are shown, never executed; stored messages are not changed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::Cli;
use super::format::{print_json, table};
use super::open_store;
use crate::queue::Status;
use crate::replay::{ReplayResult, Selection, replay_selection};

/// `wharf replay` arguments.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The message to replay (or use `--queue`).
    #[arg(required_unless_present = "queue", conflicts_with = "queue")]
    key: Option<i64>,
    /// The candidate component.
    #[arg(long = "with", value_name = "FILE")]
    candidate: PathBuf,
    /// Replay this queue's messages.
    #[arg(long)]
    queue: Option<String>,
    /// …in this status.
    #[arg(long, default_value = "failed", requires = "queue")]
    status: String,
    /// At most this many (newest first).
    #[arg(long, default_value_t = 100, requires = "queue")]
    limit: u32,
}

/// Run `wharf replay`.
pub async fn run(cli: &Cli, args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let (config, store) = open_store(cli).await?;
    let candidate = std::fs::read(&args.candidate)
        .with_context(|| format!("reading the candidate {}", args.candidate.display()))?;
    let selection = match (args.key, &args.queue) {
        (Some(key), _) => Selection::One(key),
        (None, Some(queue)) => {
            if !config.queues.contains_key(queue) {
                bail!(
                    "no queue `{queue}` is configured in {}",
                    cli.config.display()
                );
            }
            Selection::Queue {
                queue: queue.clone(),
                status: Status::parse(&args.status),
                limit: args.limit,
            }
        }
        (None, None) => bail!("give a message KEY or --queue"),
    };
    let report = replay_selection(config, &store, candidate, &selection).await?;
    let (results, summary) = (&report.results, &report.summary);
    if cli.json {
        print_json(&report)?;
    } else if args.key.is_some() {
        print_one(&results[0]);
        println!("{summary}");
    } else {
        print_table(results);
        println!("{summary}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_one(r: &ReplayResult) {
    println!("message {} ({}, {})", r.key, r.queue, r.status);
    println!("  last:      {}", r.last.as_deref().unwrap_or("-"));
    println!("  candidate: {}", r.candidate);
    for e in &r.enqueues {
        println!("  would enqueue into `{}`: {}", e.queue, e.payload);
    }
    for read in &r.state_reads {
        let value = read.value.as_deref().unwrap_or("(absent)");
        println!("  read {}/{}: {value}", read.bucket, read.key);
    }
    for change in &r.state_changes {
        match change.value.as_deref() {
            Some(value) => println!("  would set {}/{}: {value}", change.bucket, change.key),
            None => println!("  would delete {}/{}", change.bucket, change.key),
        }
    }
    for line in &r.logs {
        println!("  log {line}");
    }
}

fn print_table(results: &[ReplayResult]) {
    let mut t = table(&["key", "last", "candidate", "would enqueue"]);
    for r in results {
        let enqueues: Vec<String> = r.enqueues.iter().map(|e| e.queue.clone()).collect();
        t.add_row(vec![
            r.key.to_string(),
            r.last.clone().unwrap_or_else(|| r.status.clone()),
            r.candidate.clone(),
            enqueues.join(", "),
        ]);
    }
    println!("{t}");
}

//! `wharf enqueue QUEUE --file messages.jsonl`: every line is one message payload (lines with
//! the same id are applied in file order). The whole
//! file is checked first (a bad line stops the import before anything is enqueued, naming
//! the line), then enqueued in batches by a few producers, with a progress bar.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::Cli;
use super::format::print_json;
use crate::enqueue::{Enqueuer, Pointers, QueueRouter, parse_lines};
use crate::queue::{EnqueueStatus, NewMessage};

/// Producers enqueueing at once.
const PARALLEL: usize = 4;

/// Messages per batch a producer hands to the queue (one transaction on a SQL store, a few
/// publish calls on a provider).
const BATCH: usize = 1000;

/// Enqueue every line of `file` into `queue`, each based on `template`.
pub async fn enqueue_file(
    cli: &Cli,
    router: Arc<QueueRouter>,
    queue: &str,
    file: &Path,
    pointers: Pointers<'_>,
    template: NewMessage,
) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let messages = parse_lines(&text, pointers, &template, |m| {
        router.check_limits(queue, m)
    })
    .map_err(|e| anyhow::anyhow!("{}:{e}", file.display()))?;
    let total = messages.len() as u64;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{spinner} {bar:40} {pos}/{len} messages ({per_sec}, eta {eta})",
        )
        .expect("valid progress template"),
    );
    let queue: Arc<str> = Arc::from(queue);
    // Messages of the same session (else with the same id) go to the same producer, in file
    // order: a session keeps the file's order, and the last line for an id is the version
    // that stays. The others are spread evenly.
    let mut chunks: Vec<Vec<NewMessage>> = (0..PARALLEL).map(|_| Vec::new()).collect();
    for (n, mut message) in messages.into_iter().enumerate() {
        router.trace_send(&queue, &mut message);
        let slot = match message.session.as_ref().or(message.id.as_ref()) {
            Some(key) => {
                use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
                BuildHasherDefault::<DefaultHasher>::default().hash_one(key) as usize % PARALLEL
            }
            None => n % PARALLEL,
        };
        chunks[slot].push(message);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in chunks {
        let (router, queue, bar) = (router.clone(), queue.clone(), bar.clone());
        tasks.spawn(async move {
            let mut counts = [0u64; 3];
            let mut messages = chunk.into_iter().peekable();
            while messages.peek().is_some() {
                let batch: Vec<NewMessage> = messages.by_ref().take(BATCH).collect();
                for done in router.enqueue_many(&queue, batch).await? {
                    let slot = match done.status {
                        EnqueueStatus::Added => 0,
                        EnqueueStatus::Updated => 1,
                        EnqueueStatus::Discarded => 2,
                    };
                    counts[slot] += 1;
                    bar.inc(1);
                }
            }
            Ok::<_, crate::enqueue::EnqueueError>(counts)
        });
    }
    let mut counts = [0u64; 3];
    while let Some(result) = tasks.join_next().await {
        let part = result??;
        for (total, n) in counts.iter_mut().zip(part) {
            *total += n;
        }
    }
    bar.finish_and_clear();
    let [added, updated, discarded] = counts;
    if cli.json {
        print_json(
            &serde_json::json!({ "added": added, "updated": updated, "discarded": discarded }),
        )?;
    } else {
        println!(
            "{total} messages from {}: {added} added, {updated} updated, {discarded} discarded",
            file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

//! The outbox relay: publishes the follow-ups for external queues that committed as outbox
//! rows ([`crate::queue::OutboxRow`]) into their brokers, then deletes them. The host that
//! committed them is woken at once; every host with an external queue also sweeps the outbox
//! every second, so rows a crash or an outage left behind are published by whichever host
//! runs next. Rows are claimed with a lease, a queue's rows by one relay at a time and in
//! commit order; a broker
//! that fails keeps them waiting (with backoff), never drops them. At least once: a relay
//! that dies after the broker took a row but before deleting it publishes it again, under
//! the same MessageId.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::QueueRouter;
use crate::external::{Envelope, PublishOptions};
use crate::queue::{OutboxRow, QueueStore, now_ms};

/// Most rows claimed at once.
const CLAIM: u32 = 500;

/// How long a claim holds: a relay that stops mid-publication leaves its rows to others
/// after this.
const CLAIM_MS: i64 = 30_000;

/// How often the outbox is swept for rows nobody published.
const SWEEP: Duration = Duration::from_secs(1);

/// Longest wait before a failed publication is tried again.
const MAX_BACKOFF_MS: i64 = 30_000;

/// The relay of one host.
pub struct Relay {
    store: Arc<dyn QueueStore>,
    router: Arc<QueueRouter>,
    /// Who claims rows (unique per process).
    holder: String,
    /// The last publication error per target queue, cleared by a success.
    failing: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Relay {
    /// A relay publishing `store`'s outbox through `router`'s providers.
    pub fn new(store: Arc<dyn QueueStore>, router: Arc<QueueRouter>) -> Self {
        Relay {
            store,
            router,
            holder: format!("{}:{}", std::process::id(), crate::queue::new_delivery_id()),
            failing: Arc::default(),
        }
    }

    /// The target queues whose last publication failed, with why.
    pub fn failing(&self) -> Arc<Mutex<BTreeMap<String, String>>> {
        self.failing.clone()
    }

    /// Publish until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let written = self.store.outbox_written();
        let mut store_down = false;
        loop {
            loop {
                let rows = match self.store.claim_outbox(&self.holder, CLAIM, CLAIM_MS).await {
                    Ok(rows) => {
                        store_down = false;
                        rows
                    }
                    Err(e) => {
                        if !store_down {
                            tracing::warn!("cannot read the outbox; its follow-ups wait: {e}");
                        }
                        store_down = true;
                        break;
                    }
                };
                if rows.is_empty() {
                    break;
                }
                self.publish(rows).await;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = written.notified() => {}
                _ = tokio::time::sleep(SWEEP) => {}
            }
        }
    }

    /// Publish claimed `rows` (in key order), queue by queue; a failure keeps the rest of
    /// that queue's rows for later, in order.
    async fn publish(&self, rows: Vec<OutboxRow>) {
        let mut by_queue: BTreeMap<String, Vec<OutboxRow>> = BTreeMap::new();
        for row in rows {
            by_queue.entry(row.queue.clone()).or_default().push(row);
        }
        for (queue, rows) in by_queue {
            match self.publish_queue(&queue, &rows).await {
                Ok(()) => {
                    if self
                        .failing
                        .lock()
                        .expect("relay state")
                        .remove(&queue)
                        .is_some()
                    {
                        tracing::info!(queue = %queue, "publishing follow-ups from the outbox works again");
                    }
                }
                Err((left, error)) => {
                    let previous = self
                        .failing
                        .lock()
                        .expect("relay state")
                        .insert(queue.clone(), error.clone());
                    if previous.is_none() {
                        tracing::warn!(queue = %queue, rows = left.len(), "publishing follow-ups from the outbox failed; they wait and are tried again: {error}");
                    }
                    let attempts = left.first().map_or(1, |r| r.attempts.max(1));
                    let backoff = (500_i64 << attempts.min(10)).min(MAX_BACKOFF_MS);
                    let keys: Vec<i64> = left.iter().map(|r| r.key).collect();
                    if let Err(e) = self
                        .store
                        .outbox_failed(&keys, &error, now_ms() + backoff)
                        .await
                    {
                        tracing::debug!(queue = %queue, "could not note the failed publication (the claim expires instead): {e}");
                    }
                }
            }
        }
    }

    /// Publish one queue's rows in runs of one due date; on a failure, the rows not
    /// published and why.
    async fn publish_queue<'r>(
        &self,
        queue: &str,
        rows: &'r [OutboxRow],
    ) -> Result<(), (&'r [OutboxRow], String)> {
        let Some(route) = self.router.external_route(queue) else {
            let error = format!(
                "queue `{queue}` is not an external queue of this host's configuration any more: its {} follow-up(s) wait in the outbox until a host that has it publishes them",
                rows.len()
            );
            return Err((rows, error));
        };
        let now = now_ms();
        let mut start = 0;
        while start < rows.len() {
            let due = |r: &OutboxRow| r.due_at_ms.filter(|at| *at > now);
            let first_due = due(&rows[start]);
            let end = rows[start..]
                .iter()
                .position(|r| due(r) != first_due)
                .map_or(rows.len(), |n| start + n);
            let run = &rows[start..end];
            let envelopes: Vec<Envelope> = run
                .iter()
                .map(|r| Envelope {
                    session: r.session.clone(),
                    trace: r.trace.clone(),
                    ..Envelope::new(r.payload.clone(), Some(r.message_id.clone()), r.priority)
                })
                .collect();
            let options = PublishOptions {
                due_at_ms: first_due,
                ..route.options
            };
            if let Err(e) = route.provider.publish(queue, &envelopes, options).await {
                let error = format!("provider `{}`: {e}", route.name);
                return Err((&rows[start..], error));
            }
            let keys: Vec<i64> = run.iter().map(|r| r.key).collect();
            crate::metrics::outbox_published(queue, keys.len());
            if let Err(e) = self.store.outbox_published(&keys).await {
                // Published but still in the outbox: published again when the claim expires
                // (at least once, under the same MessageIds).
                let error = format!("deleting published outbox rows: {e}");
                return Err((&rows[end..], error));
            }
            start = end;
        }
        Ok(())
    }
}

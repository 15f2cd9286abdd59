//! One delivery of a leased message: consumer-inbox check, guest call, outcome, inbox record
//! (only after the guest succeeded), settlement. The inbox is consulted by the host, never by
//! the guest; a store failure at the check or the record is a transient failure of the
//! attempt, never a duplicate.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::Shared;
use super::outcome::{decide, transient};
use super::recorder::Recorder;
use crate::inbox::{InboxKey, InboxStore, InboxWrite};
use crate::queue::{Backoff, Disposition, InboxProbe, LeasedMessage, SettleResult, Settlement};
use crate::runtime::{LoadedHandler, Message, Outcome};

/// A queue's consumer inbox.
#[derive(Clone)]
pub struct InboxBinding {
    /// Where records live.
    pub store: Arc<dyn InboxStore>,
    /// Batches records into the store.
    pub recorder: Recorder,
    /// The endpoint the records are keyed on.
    pub endpoint: String,
    /// How long a record is kept.
    pub retention: Duration,
    /// The message source, for metrics (`sql` for the SQL queue).
    pub provider: &'static str,
    /// The store's table when it lives in the queue database
    /// ([`InboxStore::queue_database_table`], asked once).
    pub queue_table: Option<std::sync::Arc<str>>,
}

/// The inbox check of one message, done for the whole leased batch at once.
#[derive(Debug, Clone)]
pub(crate) enum Precheck {
    /// The queue has no inbox, or the message id cannot be deduplicated.
    Bypass,
    /// Checked: whether it was already processed.
    Checked(InboxKey, bool),
    /// The check failed.
    Failed(String),
}

/// Lease up to `max` messages and check them against the queue's inbox: in the lease
/// statement itself when the inbox table lives in the queue database and the store can,
/// otherwise with one `check_many` round trip for the whole batch.
pub(crate) async fn lease_and_check(
    shared: &Shared,
    max: u32,
) -> Result<(Vec<LeasedMessage>, Vec<Precheck>), crate::queue::QueueError> {
    let w = &shared.worker;
    let lease_ms = w.config.lease.as_millis() as i64;
    let probe = w.inbox.as_ref().and_then(|binding| {
        let table = binding.queue_table.clone()?;
        w.store.leases_check_inbox().then(|| InboxProbe {
            table,
            endpoint: binding.endpoint.clone(),
        })
    });
    let leased = match &probe {
        Some(probe) => {
            w.store
                .lease_checking_inbox(&w.name, max, lease_ms, probe)
                .await?
        }
        None => w.store.lease(&w.name, max, lease_ms).await?,
    };
    let checks = precheck(shared, &leased).await;
    Ok((leased, checks))
}

/// The id a delivery is checked against. A message moved in from an external provider stands
/// in for its broker delivery: it is checked against that MessageId (its source), which its
/// own success also records. Every other message — an operator resubmission too — is checked
/// against its own delivery id.
fn checked_id(m: &LeasedMessage) -> &str {
    let moved = m.headers.iter().any(|(k, _)| k == MOVED_FROM_HEADER);
    match (&m.source_delivery_id, moved) {
        (Some(source), true) => source,
        _ => &m.delivery_id,
    }
}

/// The header a message moved in from an external provider carries (the provider name).
pub const MOVED_FROM_HEADER: &str = "wharf.provider";

/// Check a leased batch against the queue's inbox: with the flags the lease statement
/// returned, or in one round trip.
async fn precheck(shared: &Shared, batch: &[LeasedMessage]) -> Vec<Precheck> {
    let w = &shared.worker;
    let Some(binding) = &w.inbox else {
        return batch.iter().map(|_| Precheck::Bypass).collect();
    };
    let keys: Vec<Option<(InboxKey, Option<bool>)>> = batch
        .iter()
        .map(|m| match InboxKey::new(&binding.endpoint, checked_id(m)) {
            // The lease statement checked the delivery id; a stand-in's source is checked here.
            Ok(key) if key.message_id == m.delivery_id => Some((key, m.inbox_processed)),
            Ok(key) => Some((key, None)),
            Err(reason) => {
                tracing::warn!(queue = %w.name, endpoint = %binding.endpoint, key = m.lease.key, "inbox bypassed: {reason}; the handler runs without deduplication");
                None
            }
        })
        .collect();
    check_keys(binding, keys).await
}

/// Resolve the inbox check of a batch: `keys` holds, per message, its key and whether it
/// was already checked (`Some(seen)`), or `None` for a message that bypasses the inbox.
/// Unchecked keys are checked in one round trip; a failure fails only those.
pub(crate) async fn check_keys(
    binding: &InboxBinding,
    keys: Vec<Option<(InboxKey, Option<bool>)>>,
) -> Vec<Precheck> {
    let unchecked: Vec<InboxKey> = keys
        .iter()
        .flatten()
        .filter(|(_, seen)| seen.is_none())
        .map(|(key, _)| key.clone())
        .collect();
    let checked = if unchecked.is_empty() {
        Ok(Vec::new())
    } else {
        binding.store.check_many(&unchecked).await
    };
    let mut found = match checked {
        Ok(found) => found.into_iter(),
        Err(e) => {
            let text = format!("inbox check failed: {e}");
            return keys
                .iter()
                .map(|k| match k {
                    Some((_, None)) => Precheck::Failed(text.clone()),
                    Some((key, Some(seen))) => Precheck::Checked(key.clone(), *seen),
                    None => Precheck::Bypass,
                })
                .collect();
        }
    };
    keys.into_iter()
        .map(|k| match k {
            Some((key, Some(seen))) => Precheck::Checked(key, seen),
            Some((key, None)) => Precheck::Checked(key, found.next().unwrap_or(false)),
            None => Precheck::Bypass,
        })
        .collect()
}

/// Process one leased message and settle it.
pub(crate) async fn process(
    shared: Arc<Shared>,
    handler: Arc<LoadedHandler>,
    leased: LeasedMessage,
    check: Precheck,
    _permit: OwnedSemaphorePermit,
) {
    let w = &shared.worker;
    let lease = leased.lease;
    let attempt = leased.attempt;
    let backoff = Backoff {
        base: w.config.backoff,
        max: w.config.max_backoff,
    };
    let failed = |error: String| transient(error, attempt, w.config.max_attempts, backoff);

    // 1. Inbox check (made for the whole batch before the guests ran).
    let inbox = match check {
        Precheck::Bypass => None,
        Precheck::Failed(error) => {
            let disposition = failed(error);
            log(&shared, lease.key, attempt, &disposition);
            settle(&shared, lease, disposition, None, None).await;
            return;
        }
        Precheck::Checked(key, true) => {
            let binding = w.inbox.as_ref().expect("checked against the queue's inbox");
            tracing::info!(
                name: "duplicate_detected", target: "wharf::inbox",
                queue = %w.name, endpoint = %binding.endpoint, provider = binding.provider,
                key = lease.key, message_id = %key.message_id, id = leased.id.as_deref().unwrap_or(""),
                "duplicate_detected: already processed on this endpoint, skipped without invoking the handler"
            );
            crate::metrics::duplicate_detected(&binding.endpoint, &w.name, binding.provider);
            settle(
                &shared,
                lease,
                Disposition::Complete,
                Some("skipped: duplicate"),
                None,
            )
            .await;
            return;
        }
        Precheck::Checked(key, false) => w.inbox.as_ref().map(|b| (b, key)),
    };

    // 2. The guest.
    let source = leased.source_delivery_id.clone();
    let own_id = leased.delivery_id.clone();
    let message = Message {
        queue: leased.queue,
        id: leased.id,
        delivery_id: leased.delivery_id,
        payload: leased.payload,
        priority: leased.priority,
        attempt,
        max_attempts: w.config.max_attempts,
        enqueued_at_ms: leased.enqueued_at_ms.max(0) as u64,
        headers: leased.headers,
    };
    let result =
        crate::runtime::invoke(&handler, message, w.config.timeout, w.enqueuer.clone()).await;
    let mut disposition = decide(&result, attempt, w.config.max_attempts, backoff);
    let outcome = match &result {
        Ok(Ok(Outcome::PendingHandoff)) => Some("pending-handoff"),
        Ok(Ok(Outcome::Completed)) => Some("completed"),
        _ => None,
    };

    // 3. Record, only after the guest succeeded, and not for a pending handoff. A resubmission
    // first records the delivery it stands in for. An inbox table in the queue's database is
    // written by the settlement's own transaction; other stores are written here.
    let mut write = None;
    if let (Some((binding, key)), Ok(Ok(Outcome::Completed))) = (&inbox, &result) {
        let source_key = source
            .as_deref()
            .and_then(|s| InboxKey::new(&binding.endpoint, s).ok());
        // The checked key is the delivery's own, or (a moved message) its source.
        let own_key = if key.message_id == own_id {
            Some(key.clone())
        } else {
            InboxKey::new(&binding.endpoint, &own_id).ok()
        };
        let mut keys: Vec<InboxKey> = source_key.into_iter().chain(own_key).collect();
        keys.dedup();
        match binding.queue_table.clone() {
            Some(table) => {
                write = Some(InboxWrite {
                    table,
                    keys,
                    retention_ms: binding.retention.as_millis() as i64,
                })
            }
            None => {
                if let Err(e) = binding.recorder.record(keys).await {
                    disposition = failed(format!(
                        "inbox record failed after the handler succeeded: {e}"
                    ));
                }
            }
        }
    }

    // 4. Settle.
    log(&shared, lease.key, attempt, &disposition);
    let outcome = if disposition == Disposition::Complete {
        outcome
    } else {
        None
    };
    let write = if disposition == Disposition::Complete {
        write
    } else {
        None
    };
    settle(&shared, lease, disposition, outcome, write).await;
}

fn log(shared: &Shared, key: i64, attempt: u32, disposition: &Disposition) {
    let queue = &shared.worker.name;
    match disposition {
        Disposition::Complete => tracing::debug!(%queue, key, attempt, "message processed"),
        Disposition::Retry {
            error: Some(error),
            at_ms,
        } => {
            tracing::warn!(%queue, key, attempt, retry_at_ms = at_ms, "attempt failed, will retry: {error}")
        }
        Disposition::Retry { error: None, at_ms } => {
            tracing::debug!(%queue, key, attempt, retry_at_ms = at_ms, "handler asked to run again later")
        }
        Disposition::Fail { error } => {
            tracing::error!(%queue, key, attempt, "message failed: {error}")
        }
        Disposition::Release => {}
    }
}

async fn settle(
    shared: &Shared,
    lease: crate::queue::Lease,
    disposition: Disposition,
    outcome: Option<&str>,
    inbox: Option<InboxWrite>,
) {
    let w = &shared.worker;
    let keep_processed = w.config.retention.count != Some(0);
    let settlement = Settlement {
        lease,
        disposition,
        keep_processed,
        outcome: outcome.map(str::to_string),
        inbox,
    };
    match w.settler.settle(settlement).await {
        Ok(SettleResult::Applied) => {}
        Ok(SettleResult::LeaseLost) => {
            tracing::warn!(queue = %w.name, key = lease.key, "lease was lost (it expired and the message was leased again): this outcome was not applied")
        }
        Err(e) => {
            tracing::debug!(queue = %w.name, key = lease.key, "not settled (the settlement task logs the outage): {e}")
        }
    }
    shared
        .in_flight
        .lock()
        .expect("in-flight set")
        .remove(&lease);
}

//! The SQL queue as a source of the pipeline: leases in batches with fencing tokens
//! (checking the inbox in the lease statement when the inbox table lives in the queue
//! database), settles through the group settler, releases on shutdown, and sweeps expired
//! leases and retention between leases. For an external queue whose provider has no native
//! delay, it also publishes the messages held back until due ([`DEFERRED_PUBLISH_HEADER`])
//! into the broker instead of running them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{InboxBinding, InboxIds, MOVED_FROM_HEADER, Settled, Settler, Source, Verdict, Work};
use crate::config::QueueConfig;
use crate::external::{Envelope, Provider, PublishOptions};
use crate::queue::{
    Disposition, InboxProbe, Lease, LeasedMessage, QueueStore, Retention, SettleResult, Settlement,
    now_ms,
};
use crate::runtime::Message;

pub use crate::headers::DEFERRED_PUBLISH as DEFERRED_PUBLISH_HEADER;

/// One queue of the SQL store.
pub struct SqlSource {
    /// Queue name.
    pub name: Arc<str>,
    /// Its configuration.
    pub config: QueueConfig,
    /// Where its messages live.
    pub store: Arc<dyn QueueStore>,
    /// Batched settlement.
    pub settler: Settler,
    /// Raised when a message is enqueued into this queue in this process.
    pub wake: Arc<Notify>,
    /// How often an idle queue looks for due messages.
    pub poll_interval: Duration,
    /// For an external queue: its provider, which receives deferred publications when due.
    pub publish_to: Option<(String, Arc<dyn Provider>, PublishOptions)>,
}

/// What settles one leased message: its lease, and its session (tended with its
/// settlement in a queue with sessions).
#[derive(Debug, Clone)]
pub struct SqlLease {
    /// The lease.
    pub lease: Lease,
    /// Its session key, in a queue with sessions.
    pub session: Option<String>,
}

/// The id a delivery is checked against. A message moved in from an external provider stands
/// in for its broker delivery: it is checked against that MessageId (its source), which its
/// own success also records. Every other message — an operator resubmission too — is checked
/// against its own delivery id.
fn inbox_ids(m: &LeasedMessage) -> InboxIds {
    let moved = m.headers.iter().any(|(k, _)| k == MOVED_FROM_HEADER);
    let check = match (&m.source_delivery_id, moved) {
        (Some(source), true) => source.clone(),
        _ => m.delivery_id.clone(),
    };
    // The lease statement checked the delivery id; a stand-in's source is checked later.
    let seen = m.inbox_processed.filter(|_| check == m.delivery_id);
    // A resubmission first records the delivery it stands in for.
    let mut record: Vec<String> = m.source_delivery_id.iter().cloned().collect();
    if !record.contains(&m.delivery_id) {
        record.push(m.delivery_id.clone());
    }
    InboxIds {
        check,
        seen,
        record,
    }
}

impl SqlSource {
    /// Publish due deferred messages into the provider, then complete them here; a failed
    /// publication is tried again shortly.
    async fn publish_deferred(&self, due: Vec<LeasedMessage>) {
        let Some((provider_name, provider, options)) = &self.publish_to else {
            return;
        };
        let envelopes: Vec<Envelope> = due
            .iter()
            .map(|m| Envelope::new(m.payload.clone(), m.id.clone(), m.priority).traced(&m.headers))
            .collect();
        let published = provider.publish(&self.name, &envelopes, *options).await;
        let disposition = match &published {
            Ok(_) => Disposition::Complete,
            Err(e) => {
                tracing::warn!(queue = %self.name, provider = %provider_name, "publishing messages that became due failed, trying again in a second: {e}");
                Disposition::Retry {
                    at_ms: now_ms() + 1000,
                    error: Some(format!("publishing into provider `{provider_name}`: {e}")),
                }
            }
        };
        // Settled together (one group round trip); a settlement that fails lets the lease
        // expire and the message is published again (at least once).
        let settlements = due.iter().map(|m| {
            let mut settlement = Settlement::new(m.lease, disposition.clone());
            settlement.keep_processed = self.config.retention.count != Some(0);
            settlement.outcome = Some(format!("published into provider `{provider_name}`"));
            self.settler.settle(settlement)
        });
        futures_util::future::join_all(settlements).await;
    }
}

#[async_trait]
impl Source for SqlSource {
    type Handle = SqlLease;

    fn provider(&self) -> &'static str {
        "sql"
    }

    async fn receive(
        &self,
        max: u32,
        inbox: Option<&InboxBinding>,
    ) -> Result<Vec<Work<SqlLease>>, String> {
        let lease_ms = self.config.lease.as_millis() as i64;
        let probe = inbox.and_then(|binding| {
            let table = binding.queue_table.clone()?;
            self.store.leases_check_inbox().then(|| InboxProbe {
                table,
                endpoint: binding.endpoint.clone(),
            })
        });
        let leased = loop {
            let leased = match &probe {
                _ if self.config.sessions => {
                    self.store
                        .lease_in_sessions(&self.name, max, lease_ms, probe.as_ref())
                        .await
                }
                Some(probe) => {
                    self.store
                        .lease_checking_inbox(&self.name, max, lease_ms, probe)
                        .await
                }
                None => self.store.lease(&self.name, max, lease_ms).await,
            }
            .map_err(|e| e.to_string())?;
            // Held back for a provider: published, not run (a queue that is no longer
            // external runs them like any other message).
            let (deferred, leased): (Vec<_>, Vec<_>) = leased.into_iter().partition(|m| {
                self.publish_to.is_some()
                    && m.headers.iter().any(|(k, _)| k == DEFERRED_PUBLISH_HEADER)
            });
            if deferred.is_empty() || !leased.is_empty() {
                if !deferred.is_empty() {
                    self.publish_deferred(deferred).await;
                }
                break leased;
            }
            // Only publications: go on while there are more (a backlog drains at once).
            let full = deferred.len() as u32 == max;
            self.publish_deferred(deferred).await;
            if !full {
                break Vec::new();
            }
        };
        let max_attempts = self.config.max_attempts;
        Ok(leased
            .into_iter()
            .map(|m| Work {
                handle: SqlLease {
                    lease: m.lease,
                    session: m.session.clone().filter(|_| self.config.sessions),
                },
                inbox: Some(inbox_ids(&m)),
                label: format!("key={}", m.lease.key),
                decided: None,
                message: Message {
                    queue: m.queue,
                    id: m.id,
                    delivery_id: m.delivery_id,
                    payload: m.payload,
                    priority: m.priority,
                    attempt: m.attempt,
                    max_attempts,
                    enqueued_at_ms: m.enqueued_at_ms.max(0) as u64,
                    headers: m.headers,
                },
            })
            .collect())
    }

    async fn wait_for_work(&self, shutdown: &CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(self.poll_interval) => {}
        }
    }

    fn records_inbox(&self, inbox: &InboxBinding) -> bool {
        inbox.queue_table.is_some()
    }

    fn settles_follow_ups(&self) -> bool {
        true
    }

    fn reads_ahead(&self) -> bool {
        true
    }

    async fn settle(&self, handle: SqlLease, verdict: Verdict) -> Settled {
        let SqlLease { lease, session } = handle;
        let disposition = verdict.disposition_in(session.is_some());
        let settlement = Settlement {
            lease,
            disposition,
            keep_processed: self.config.retention.count != Some(0),
            outcome: verdict.outcome.map(str::to_string),
            inbox: verdict.inbox,
            session: session.map(|key| (self.name.to_string(), key)),
            follow_ups: verdict.follow_ups,
            state: verdict.state,
            on_conflict: verdict.on_conflict,
        };
        let in_session = settlement.session.is_some();
        match self.settler.settle(settlement).await {
            Ok(SettleResult::Applied) => {
                // The next message of the session may be ready now: look at once.
                if in_session {
                    self.wake.notify_one();
                }
                Settled::Applied
            }
            Ok(SettleResult::StateConflict(key)) => {
                // Back to pending (or retried, counted): ready again at once.
                self.wake.notify_one();
                Settled::StateConflict(key)
            }
            Ok(SettleResult::LeaseLost) => {
                tracing::warn!(queue = %self.name, key = lease.key, "lease was lost (it expired and the message was leased again): this outcome was not applied");
                Settled::NotApplied
            }
            Err(e) => {
                tracing::debug!(queue = %self.name, key = lease.key, "not settled (the settlement task logs the outage): {e}");
                Settled::NotApplied
            }
        }
    }

    async fn release(&self, leases: Vec<SqlLease>) {
        let releases: Vec<Settlement> = leases
            .iter()
            .map(|handle| Settlement::new(handle.lease, Disposition::Release))
            .collect();
        match self.store.settle(&releases).await {
            Ok(_) => {
                tracing::info!(queue = %self.name, count = releases.len(), "released unfinished messages, their attempt not counted")
            }
            Err(e) => {
                tracing::error!(queue = %self.name, "could not release in-flight messages, their leases will expire: {e}")
            }
        }
    }

    async fn housekeeping(&self) {
        let c = &self.config;
        match self
            .store
            .expire_leases(&self.name, c.max_attempts, c.retry_abandoned)
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                crate::metrics::leases_expired(&self.name, n);
                tracing::warn!(queue = %self.name, count = n, "handled messages whose lease expired")
            }
            Err(e) => tracing::debug!(queue = %self.name, "expired-lease sweep failed: {e}"),
        }
        // After the sweep: a lease that expired into failed blocks its session.
        if c.sessions
            && let Err(e) = self.store.tend_sessions(&self.name).await
        {
            tracing::debug!(queue = %self.name, "session pass failed: {e}");
        }
        let retention = Retention {
            max_age_ms: c.retention.age.map(|d| d.as_millis() as i64),
            max_count: c.retention.count,
            history_versions: c.retention.history_versions,
        };
        for _ in 0..10 {
            match self.store.purge(&self.name, &retention, PURGE_BATCH).await {
                Ok(n) if n == u64::from(PURGE_BATCH) => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(queue = %self.name, "retention pass failed: {e}");
                    break;
                }
            }
        }
    }
}

/// Most processed messages deleted per retention statement.
const PURGE_BATCH: u32 = 1000;

//! An external queue as a source of the pipeline. Deliveries come from the provider's
//! consumer when the queue was activated (or the broker pushed them); the attempt is the
//! broker's delivery count, or the host's durable count where the broker only flags a
//! redelivery. Success acknowledges the broker message without touching SQL; every other
//! outcome (retry later, transient failure, failure, a body that is not an envelope, a
//! message that came back with no attempts left) first moves the message into the SQL queue
//! of the same name — with its envelope, provider, MessageId and attempt count — and only
//! then acknowledges it. A failed move hands the message back to the broker explicitly.

mod move_to_sql;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::acker::start_acker;
use super::attempts::{attempts_of, counting_key};
use super::{
    ActivationStore, AttemptCounter, Consumer, CountKind, Delivery, DeliveryCount, Envelope,
    Handle, Nack, ProviderHealth,
};
use crate::config::QueueConfig;
use crate::dispatch::{InboxBinding, InboxIds, Source, Verdict, Work};
use crate::queue::limits;
use crate::queue::{Disposition, QueueStore, Status, now_ms};
use crate::runtime::Message;

/// One received broker message while it is processed.
pub struct Item {
    handle: Handle,
    body: bytes::Bytes,
    envelope: Option<Envelope>,
    /// The key the host counts this message's deliveries under.
    key: String,
    /// Whether the host counted this delivery (its count is forgotten on settlement).
    counted: bool,
    /// Whether handing it back forgives one count (the broker flags or counts nothing, so
    /// the next delivery would be counted as an attempt).
    forgive: bool,
}

/// One external queue.
pub struct ExternalSource {
    name: Arc<str>,
    provider: String,
    kind: &'static str,
    counts: CountKind,
    config: QueueConfig,
    consumer: Arc<dyn Consumer>,
    activations: Arc<dyn ActivationStore>,
    attempts: Arc<dyn AttemptCounter>,
    sql: Arc<dyn QueueStore>,
    sql_wake: Arc<Notify>,
    wake: Arc<Notify>,
    poll_interval: Duration,
    health: Arc<ProviderHealth>,
    /// How the health check names this queue's consumer.
    part: String,
    acks: mpsc::Sender<(Handle, oneshot::Sender<bool>)>,
}

/// Everything an external queue's source is made of.
pub struct ExternalParts {
    /// Queue name.
    pub name: Arc<str>,
    /// The `[providers.NAME]` name.
    pub provider: String,
    /// The provider type, for metrics.
    pub kind: &'static str,
    /// How the provider counts deliveries.
    pub counts: CountKind,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// The queue's processing consumer.
    pub consumer: Arc<dyn Consumer>,
    /// Where its activations live.
    pub activations: Arc<dyn ActivationStore>,
    /// Where redeliveries are counted when the broker does not count them.
    pub attempts: Arc<dyn AttemptCounter>,
    /// The SQL queue that receives failures and other non-pending states.
    pub sql: Arc<dyn QueueStore>,
    /// Raised for the SQL queue of the same name when a message moved into it.
    pub sql_wake: Arc<Notify>,
    /// Raised when this queue was activated in this process.
    pub wake: Arc<Notify>,
    /// How often it looks for activations made by other hosts.
    pub poll_interval: Duration,
    /// The provider's readiness health, which failing receives and acknowledgements turn red.
    pub health: Arc<ProviderHealth>,
}

impl ExternalSource {
    /// Assemble the source (and start its acknowledgement task).
    pub fn new(parts: ExternalParts) -> Self {
        let acks = start_acker(
            parts.consumer.clone(),
            parts.name.to_string(),
            parts.health.clone(),
        );
        ExternalSource {
            part: format!("consumer of queue `{}`", parts.name),
            name: parts.name,
            provider: parts.provider,
            kind: parts.kind,
            counts: parts.counts,
            config: parts.config,
            consumer: parts.consumer,
            activations: parts.activations,
            attempts: parts.attempts,
            sql: parts.sql,
            sql_wake: parts.sql_wake,
            wake: parts.wake,
            poll_interval: parts.poll_interval,
            health: parts.health,
            acks,
        }
    }

    /// Acknowledge a delivery (batched with others); false when its lease or lock was lost.
    async fn ack(&self, item: &Item) -> bool {
        let (reply, rx) = oneshot::channel();
        if self.acks.send((item.handle.clone(), reply)).await.is_err() {
            return false;
        }
        let held = rx.await.unwrap_or(false);
        if held && item.counted {
            let _ = self
                .attempts
                .forget(&self.name, std::slice::from_ref(&item.key))
                .await;
        }
        held
    }
}

#[async_trait]
impl Source for ExternalSource {
    type Handle = Arc<Item>;

    fn provider(&self) -> &'static str {
        self.kind
    }

    async fn receive(
        &self,
        max: u32,
        inbox: Option<&InboxBinding>,
    ) -> Result<Vec<Work<Arc<Item>>>, String> {
        let deliveries = match self.consumer.receive(max).await {
            Ok(d) => {
                self.health.part_succeeded(&self.part);
                d
            }
            Err(e) => {
                // The pipeline logs the outage once.
                self.health.part_failed_quietly(&self.part, e.to_string());
                // Keep the queue activated so the work is picked up once the broker answers.
                let _ = self.activations.request(&[self.name.to_string()]).await;
                return Err(e.to_string());
            }
        };
        let parsed: Vec<(Delivery, Option<Envelope>, Option<String>)> = deliveries
            .into_iter()
            .map(|d| {
                let envelope = std::str::from_utf8(&d.body)
                    .map_err(|e| format!("the body is not UTF-8: {e}"))
                    .and_then(|text| Envelope::parse(text).map_err(|e| e.to_string()));
                match envelope {
                    Ok(e) => (d, Some(e), None),
                    Err(error) => (d, None, Some(error)),
                }
            })
            .collect();
        let attempts =
            attempts_of(self.attempts.as_ref(), &self.name, &self.provider, &parsed).await;
        let max_attempts = self.config.max_attempts;
        Ok(parsed
            .into_iter()
            .zip(attempts)
            .map(|((delivery, envelope, invalid), (attempt, counted))| {
                let id = envelope.as_ref().and_then(|e| e.message_id.clone());
                let label = match &id {
                    Some(id) => format!("message_id={id}"),
                    None => "message_id=(none)".to_string(),
                };
                let over_limit = envelope.as_ref().and_then(|e| {
                    limits::check(
                        &self.name,
                        e.message_id.as_deref(),
                        &e.message_json,
                        self.config.max_payload.as_u64(),
                    )
                    .err()
                });
                let decided = match (&invalid, over_limit) {
                    (Some(error), _) => {
                        tracing::error!(queue = %self.name, provider = %self.provider, "moving a message that is not a valid envelope into the SQL queue as failed: {error}");
                        Some(Disposition::Fail {
                            error: error.clone(),
                        })
                    }
                    (None, Some(limit)) => {
                        tracing::error!(queue = %self.name, provider = %self.provider, "moving a message beyond a limit into the SQL queue as failed: {limit}");
                        Some(Disposition::Fail {
                            error: limit.to_string(),
                        })
                    }
                    (None, None) if attempt > max_attempts => Some(Disposition::Fail {
                        error: format!(
                            "delivered again after attempt {} of {max_attempts} was never settled (the host stopped or lost the broker), no attempts left",
                            attempt - 1
                        ),
                    }),
                    (None, None) => None,
                };
                if inbox.is_some() && id.is_none() && invalid.is_none() {
                    tracing::warn!(queue = %self.name, provider = %self.provider, "inbox bypassed: the envelope has no MessageId; the handler runs without deduplication");
                }
                let key = counted
                    .clone()
                    .unwrap_or_else(|| counting_key(&delivery, envelope.as_ref()));
                let message = Message {
                    queue: self.name.to_string(),
                    id: id.clone(),
                    delivery_id: id.clone().unwrap_or_default(),
                    payload: envelope
                        .as_ref()
                        .map(|e| e.message_json.clone())
                        .unwrap_or_default(),
                    priority: envelope.as_ref().map_or(0, |e| e.priority),
                    attempt,
                    max_attempts,
                    enqueued_at_ms: delivery.enqueued_at_ms.unwrap_or(0).max(0) as u64,
                    headers: delivery.headers,
                };
                Work {
                    handle: Arc::new(Item {
                        key,
                        counted: counted.is_some(),
                        forgive: self.counts != CountKind::Exact,
                        handle: delivery.handle,
                        body: delivery.body,
                        envelope,
                    }),
                    message,
                    decided,
                    inbox: id.map(|id| InboxIds {
                        check: id.clone(),
                        seen: None,
                        record: vec![id],
                    }),
                    label,
                }
            })
            .collect())
    }

    async fn wait_for_work(&self, shutdown: &CancellationToken) {
        loop {
            match self.activations.claim(&self.name).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(queue = %self.name, "claiming the activation failed, retrying: {e}")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.consumer.pushed() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }

    async fn settle(&self, item: Arc<Item>, verdict: Verdict) {
        let attempt = verdict.attempt;
        match verdict.disposition {
            // External queues have no sessions: a handoff completes the broker message.
            Disposition::Complete | Disposition::HandOff => {
                if !self.ack(&item).await {
                    tracing::warn!(queue = %self.name, provider = %self.provider, "the broker message's lease or lock was lost before it was acknowledged: the broker delivers it again");
                }
            }
            Disposition::Retry { at_ms, error } => {
                // Sleeping is where the SQL queue keeps a message due later.
                self.move_and_ack(&item, None, at_ms, error, attempt).await
            }
            Disposition::Fail { error } => {
                self.move_and_ack(&item, Some(Status::Failed), now_ms(), Some(error), attempt)
                    .await
            }
            Disposition::Release => self.release(vec![item]).await,
        }
    }

    async fn stop_receiving(&self) {
        let pushed = self.consumer.stop().await;
        if pushed.is_empty() {
            return;
        }
        let items = pushed
            .into_iter()
            .map(|d| {
                let envelope = std::str::from_utf8(&d.body)
                    .ok()
                    .and_then(|text| Envelope::parse(text).ok());
                Arc::new(Item {
                    key: counting_key(&d, envelope.as_ref()),
                    counted: false,
                    // Never handed out: a redelivered one was not counted by this host, so
                    // only a first delivery's flagged return needs forgiving.
                    forgive: d.count == DeliveryCount::Redelivered(false),
                    handle: d.handle,
                    body: d.body,
                    envelope,
                })
            })
            .collect();
        self.release(items).await;
    }

    async fn finish(&self) {
        self.consumer.close().await;
    }

    async fn release(&self, items: Vec<Arc<Item>>) {
        let keys: Vec<String> = items
            .iter()
            .filter(|i| i.forgive)
            .map(|i| i.key.clone())
            .collect();
        if !keys.is_empty() {
            // The broker flags (or does not count) the next delivery: it is not an attempt.
            if let Err(e) = self.attempts.forgive(&self.name, &keys).await {
                tracing::warn!(queue = %self.name, provider = %self.provider, "could not note the hand-back; the next delivery counts as an attempt: {e}");
            }
        }
        let handles: Vec<Handle> = items.iter().map(|i| i.handle.clone()).collect();
        let nack = Nack {
            requeue: true,
            counted: false,
        };
        match self.consumer.nack(&handles, nack).await {
            Ok(()) => {
                tracing::info!(queue = %self.name, provider = %self.provider, count = handles.len(), "handed unfinished messages back to the broker")
            }
            Err(e) => {
                tracing::error!(queue = %self.name, provider = %self.provider, "could not hand messages back; the broker redelivers them when their lease or connection ends: {e}")
            }
        }
    }
}

//! Receiving from the broker: each delivery parsed as an envelope, its attempt counted where
//! the broker does not count, and what cannot run (not an envelope, beyond a limit, no
//! attempts left) decided at once, as works for the pipeline.

use std::sync::Arc;

use super::{ExternalSource, Item};
use crate::dispatch::{InboxBinding, InboxIds, Work};
use crate::external::{CountKind, Delivery, Envelope};
use crate::external::{attempts_of, counting_key};
use crate::queue::{Disposition, limits};
use crate::runtime::Message;

impl ExternalSource {
    /// Receive up to `max` deliveries from the broker, as works.
    pub(super) async fn receive_from_broker(
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
                    // The trace context the broker carried beside it stays with it, into the
                    // SQL queue if it moves there.
                    Ok(e) => {
                        let e = e.traced(&d.headers);
                        (d, Some(e), None)
                    }
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
                let session = delivery.session.clone().filter(|_| self.config.sessions);
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
                        session,
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
}

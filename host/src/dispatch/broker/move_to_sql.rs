//! Moving an external message into the SQL queue of the same name (every outcome but
//! success), then acknowledging it in the broker; a failed move hands it back instead.

use std::time::Duration;

use super::{ExternalSource, Item};
use crate::dispatch::Source;
use crate::external::{Handle, Nack};
use crate::headers::MOVED_FROM as MOVED_FROM_HEADER;
use crate::queue::{NewMessage, Status};

impl ExternalSource {
    /// Move the message into the SQL queue (`status`, due at `at_ms`, with `error`; `moved_as`
    /// names the move in metrics), then acknowledge it in the broker; true when it was moved.
    /// If the move fails, the message goes back to the broker after a pause (counted: the
    /// handler ran), followed by what waits behind it in its session.
    pub(super) async fn move_and_ack(
        &self,
        item: &Item,
        status: Option<Status>,
        at_ms: i64,
        error: Option<String>,
        attempt: u32,
        moved_as: &str,
    ) -> bool {
        if !self.consumer.holds(&item.handle) {
            tracing::warn!(queue = %self.name, provider = %self.provider, "the broker took the message back before it was moved into the SQL queue: it is delivered again instead");
            self.hand_back_waiting(item).await;
            return false;
        }
        let envelope = item.envelope.as_ref();
        let body = String::from_utf8_lossy(&item.body).into_owned();
        let payload = match envelope {
            Some(e) => e.message_json.clone(),
            // The raw body, kept as a JSON string so the SQL queue can hold it.
            None => serde_json::Value::String(body.clone()).to_string(),
        };
        // No store keeps a NUL character in text (PostgreSQL refuses it): an id with one is
        // left out (the error says why), and a raw body with one — never a valid envelope —
        // is kept only as the payload, a JSON string with the character escaped.
        let id = envelope
            .and_then(|e| e.message_id.clone())
            .filter(|id| !id.contains('\0'));
        let message = NewMessage {
            id: id.clone(),
            payload,
            priority: envelope.map_or(0, |e| e.priority),
            process_at_ms: Some(at_ms),
            headers: {
                let mut headers = vec![(MOVED_FROM_HEADER.to_string(), self.provider.clone())];
                headers.extend(envelope.map(|e| e.trace.clone()).unwrap_or_default());
                // The raw body, except for an envelope over `max_payload`: its payload is
                // kept already, and twice would double what was too large.
                if !body.contains('\0')
                    && (envelope.is_none() || body.len() as u64 <= self.config.max_payload.as_u64())
                {
                    headers.push(("wharf.envelope".to_string(), body));
                }
                headers
            },
            status,
            last_error: error,
            source_delivery_id: id,
            attempts: attempt,
            session: item.session.clone(),
        };
        match self.sql.enqueue(&self.name, message, false).await {
            Ok(_) => {
                crate::metrics::moved_into_sql(&self.name, &self.provider, moved_as);
                self.sql_wake.notify_one();
                self.ack(item).await;
                true
            }
            Err(e) => {
                tracing::error!(queue = %self.name, provider = %self.provider, "could not move a message into the SQL queue; handing it back to the broker: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                // What waits behind it in its session follows it, in order, in one hand-back.
                let waiting = match &item.session {
                    Some(session) => self.gate.give_up(session),
                    None => Vec::new(),
                };
                self.forgive(&waiting).await;
                let handles: Vec<Handle> = std::iter::once(item.handle.clone())
                    .chain(waiting.iter().map(|w| w.handle.clone()))
                    .collect();
                let nack = Nack {
                    requeue: true,
                    counted: true,
                };
                if let Err(e) = self.consumer.nack(&handles, nack).await {
                    tracing::error!(queue = %self.name, provider = %self.provider, "could not hand the message back either; the broker redelivers it when its lease or connection ends: {e}");
                }
                false
            }
        }
    }

    /// In a queue with sessions: hand back what waits behind `item` in its session (it went
    /// back to the broker, so they follow it there, in order).
    async fn hand_back_waiting(&self, item: &Item) {
        let Some(session) = &item.session else {
            return;
        };
        let waiting = self.gate.give_up(session);
        if !waiting.is_empty() {
            self.release(waiting).await;
        }
    }
}

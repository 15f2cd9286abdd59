//! The decoded message a handler receives.

use crate::HandlerError;
use crate::bindings::wharf::handler::types;

/// One delivery of a message, with its payload deserialized into `T`.
#[derive(Debug, Clone)]
pub struct Message<T> {
    /// The deserialized payload.
    pub payload: T,
    /// The payload JSON exactly as it was enqueued.
    pub raw_payload: String,
    /// The queue the message came from.
    pub queue: String,
    /// The message identity, if the producer set one.
    pub id: Option<String>,
    /// Unique per enqueue; the same for redeliveries of one delivery.
    pub delivery_id: String,
    /// Higher runs first.
    pub priority: i32,
    /// 1 on the first delivery.
    pub attempt: u32,
    /// The most attempts the queue makes before failing the message.
    pub max_attempts: u32,
    /// When the message was enqueued, in Unix milliseconds.
    pub enqueued_at_ms: u64,
    /// Producer-supplied metadata.
    pub headers: Vec<(String, String)>,
}

impl<T> Message<T> {
    /// The value of the first header with this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// True when this is the last attempt the queue will make.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }
}

impl<T: serde::de::DeserializeOwned> Message<T> {
    pub(crate) fn decode(raw: types::Message) -> Result<Self, HandlerError> {
        let payload = serde_json::from_str(&raw.payload).map_err(|e| {
            HandlerError::permanent(format!(
                "payload does not match {}: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        Ok(Message {
            payload,
            raw_payload: raw.payload,
            queue: raw.queue,
            id: raw.id,
            delivery_id: raw.delivery_id,
            priority: raw.priority,
            attempt: raw.attempt,
            max_attempts: raw.max_attempts,
            enqueued_at_ms: raw.enqueued_at_ms,
            headers: raw.headers,
        })
    }
}

//! Enqueueing follow-up messages through the host: staged, and sent only if the handler call
//! succeeds, unless [`EnqueueOptions::send_now`] is set.

use crate::bindings::wharf::handler::{host, types};

pub use types::EnqueueStatus;

/// Options for [`enqueue_with`]. `Default` gives an immediate message without identity.
#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    /// Message identity: an existing message with this id is updated instead of duplicated.
    pub id: Option<String>,
    /// Higher runs first; 0 when absent.
    pub priority: Option<i32>,
    /// Delay before the message becomes ready, in milliseconds.
    pub delay_ms: Option<u64>,
    /// Metadata passed to the target queue's handler.
    pub headers: Vec<(String, String)>,
    /// Session key: in a target queue with `sessions = true`, messages with the same key run
    /// one at a time, in enqueue order. Sent as the reserved header `wharf.session`.
    pub session: Option<String>,
    /// Send at once, even if this handler call then fails (a progress event): outside the
    /// guarantee that follow-ups exist only for a successful attempt. Sent as the reserved
    /// header `wharf.send-now`, which the host removes.
    pub send_now: bool,
}

/// Enqueue `payload` (serialized to JSON) into `queue`.
pub fn enqueue<T: serde::Serialize>(queue: &str, payload: &T) -> Result<EnqueueStatus, String> {
    enqueue_with(queue, payload, EnqueueOptions::default())
}

/// Enqueue `payload` (serialized to JSON) into `queue` with options.
pub fn enqueue_with<T: serde::Serialize>(
    queue: &str,
    payload: &T,
    options: EnqueueOptions,
) -> Result<EnqueueStatus, String> {
    let json = serde_json::to_string(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    enqueue_json(queue, &json, options)
}

/// Enqueue a payload that is already JSON text.
pub fn enqueue_json(
    queue: &str,
    json: &str,
    options: EnqueueOptions,
) -> Result<EnqueueStatus, String> {
    let mut headers = options.headers;
    if let Some(session) = options.session {
        headers.retain(|(name, _)| name != "wharf.session");
        headers.push(("wharf.session".to_string(), session));
    }
    if options.send_now {
        headers.push(("wharf.send-now".to_string(), "true".to_string()));
    }
    let options = types::EnqueueOptions {
        id: options.id,
        priority: options.priority,
        delay_ms: options.delay_ms,
        headers,
    };
    host::enqueue(queue, json, &options)
}

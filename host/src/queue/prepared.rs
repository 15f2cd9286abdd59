//! A message made ready to be written ([`Prepared`]): the values every enqueue statement of
//! either dialect binds, computed once.

use super::rows::encode_headers;
use super::{NewMessage, Status, canonical_hash, destination, new_delivery_id};

/// A message ready to be written: the values every statement binds, computed once.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The message as given.
    pub message: NewMessage,
    /// Its new delivery id.
    pub delivery_id: String,
    /// Canonical hash of its payload.
    pub hash: String,
    /// Its headers, encoded for the `headers` column.
    pub headers: String,
    /// Its processing date.
    pub at: i64,
    /// The status it takes when it is stored as the live version.
    pub status: Status,
}

impl Prepared {
    /// Prepare `message` for an enqueue at `now`.
    pub fn new(message: NewMessage, now: i64) -> Self {
        let at = message.process_at_ms.unwrap_or(now);
        Prepared {
            delivery_id: new_delivery_id(),
            hash: canonical_hash(&message.payload),
            headers: encode_headers(&message.headers),
            status: destination(message.status.as_ref(), at, now),
            at,
            message,
        }
    }

    /// The custom status to take on release (for a deferred version).
    pub fn custom_status(&self) -> Option<String> {
        self.message.status.as_ref().map(|s| s.as_str().to_string())
    }
}

//! The port through which a guest's `host.enqueue` — and everything else that enqueues by
//! queue name (the CLI, the admin API, replays) — reaches the queues. The runtime owns the
//! trait; `enqueue::QueueRouter` implements it, so the runtime never depends on where a
//! queue keeps its messages. A handler's follow-ups are staged through it ([`Enqueuer::stage`])
//! and committed with the outcome of the message being processed.

use async_trait::async_trait;

use crate::queue::limits::LimitError;
use crate::queue::{Enqueued, FollowUp, NewMessage, QueueError};

/// Why a message was not enqueued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// No such queue in the configuration.
    #[error("unknown queue `{queue}` (configured queues: {known})")]
    UnknownQueue {
        /// The requested queue.
        queue: String,
        /// The configured ones, comma-separated.
        known: String,
    },
    /// The payload is not JSON.
    #[error("payload for queue `{queue}` is not valid JSON: {reason}")]
    InvalidPayload {
        /// The target queue.
        queue: String,
        /// The parser's message.
        reason: String,
    },
    /// The message is beyond a limit (id length, payload size).
    #[error("cannot enqueue into `{queue}`: {limit}")]
    Limit {
        /// The target queue.
        queue: String,
        /// Which limit.
        limit: LimitError,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] QueueError),
    /// A handler call staged more follow-ups than one call may.
    #[error(
        "a handler call may stage at most {max_count} follow-up messages and {max_bytes} bytes of payload; this one would stage {count} ({bytes} bytes): split the work across several messages"
    )]
    FollowUpLimit {
        /// Follow-ups the call would stage.
        count: usize,
        /// Their payload bytes.
        bytes: usize,
        /// The most per call.
        max_count: usize,
        /// The most payload bytes per call.
        max_bytes: usize,
    },
    /// The external provider of the queue failed.
    #[error("enqueueing into external queue `{queue}` failed: {reason}")]
    External {
        /// The target queue.
        queue: String,
        /// The provider's error.
        reason: String,
    },
}

/// What [`Enqueuer::stage`] made of a handler's follow-up.
#[derive(Debug)]
pub enum Staged {
    /// Checked, and written into the SQL store with the outcome of the message being
    /// processed.
    Store(FollowUp),
    /// It does not go into the SQL store (an external queue's broker): enqueue it now.
    Now(NewMessage),
}

/// Something that can enqueue messages by queue name.
#[async_trait]
pub trait Enqueuer: Send + Sync + 'static {
    /// Check `message` for `queue` as [`Enqueuer::enqueue`] would, and when it would be
    /// written into the SQL store, return it ready to be written later, with the settlement of
    /// the message whose handler enqueued it. Enqueuers that keep nothing hand it back.
    fn stage(&self, queue: &str, message: NewMessage) -> Result<Staged, EnqueueError> {
        let _ = queue;
        Ok(Staged::Now(message))
    }

    /// A message of `queue` became ready in this process (a follow-up was committed).
    fn ready(&self, queue: &str) {
        let _ = queue;
    }

    /// Where the pending messages of `queue` live, as a span's `messaging.system`: `wharf`
    /// for the SQL queue, else the broker's provider type.
    fn system(&self, queue: &str) -> &'static str {
        let _ = queue;
        crate::telemetry::SQL_SYSTEM
    }

    /// Enqueue one message into `queue`.
    async fn enqueue(&self, queue: &str, message: NewMessage) -> Result<Enqueued, EnqueueError>;

    /// Enqueue many messages into `queue`, in order (the same id twice is applied twice, in
    /// that order). Results are in input order.
    async fn enqueue_many(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>, EnqueueError> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            results.push(self.enqueue(queue, message).await?);
        }
        Ok(results)
    }
}

//! The port through which a guest's `host.enqueue` — and everything else that enqueues by
//! queue name (the CLI, the admin API, replays) — reaches the queues. The runtime owns the
//! trait; `enqueue::QueueRouter` implements it, so the runtime never depends on where a
//! queue keeps its messages.

use async_trait::async_trait;

use crate::queue::limits::LimitError;
use crate::queue::{Enqueued, NewMessage, QueueError};

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
    /// The external provider of the queue failed.
    #[error("enqueueing into external queue `{queue}` failed: {reason}")]
    External {
        /// The target queue.
        queue: String,
        /// The provider's error.
        reason: String,
    },
}

/// Something that can enqueue messages by queue name.
#[async_trait]
pub trait Enqueuer: Send + Sync + 'static {
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

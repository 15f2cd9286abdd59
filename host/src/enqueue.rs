//! The host's enqueue path, shared by the CLI and the guest `enqueue` import: checks the
//! target queue and the payload, routes the message to the queue's storage, and wakes the
//! queue's processors in this process.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::config::Config;
use crate::queue::{Enqueued, NewMessage, QueueError, QueueStore};

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
    /// The store failed.
    #[error(transparent)]
    Store(#[from] QueueError),
}

/// Something that can enqueue messages by queue name.
#[async_trait]
pub trait Enqueuer: Send + Sync + 'static {
    /// Enqueue one message into `queue`.
    async fn enqueue(&self, queue: &str, message: NewMessage) -> Result<Enqueued, EnqueueError>;
}

/// Routes messages to the storage of each configured queue.
pub struct QueueRouter {
    store: Arc<dyn QueueStore>,
    queues: BTreeMap<String, Route>,
}

struct Route {
    wake: Arc<Notify>,
    idempotent: bool,
}

impl QueueRouter {
    /// A router for the queues of `config`, storing into `store`.
    pub fn new(store: Arc<dyn QueueStore>, config: &Config) -> Self {
        let queues = config
            .queues
            .iter()
            .map(|(name, q)| {
                (
                    name.clone(),
                    Route {
                        wake: Arc::new(Notify::new()),
                        idempotent: q.idempotent,
                    },
                )
            })
            .collect();
        QueueRouter { store, queues }
    }

    /// The signal raised when a message of `queue` becomes ready.
    pub fn wake_signal(&self, queue: &str) -> Option<Arc<Notify>> {
        self.queues.get(queue).map(|r| r.wake.clone())
    }

    /// Wake the processors of `queue` (of every queue for `None`).
    pub fn wake(&self, queue: Option<&str>) {
        match queue {
            Some(q) => {
                if let Some(route) = self.queues.get(q) {
                    route.wake.notify_one();
                }
            }
            None => self.queues.values().for_each(|r| r.wake.notify_one()),
        }
    }

    /// The store behind the queues.
    pub fn store(&self) -> &Arc<dyn QueueStore> {
        &self.store
    }
}

#[async_trait]
impl Enqueuer for QueueRouter {
    async fn enqueue(&self, queue: &str, message: NewMessage) -> Result<Enqueued, EnqueueError> {
        let Some(route) = self.queues.get(queue) else {
            return Err(EnqueueError::UnknownQueue {
                queue: queue.to_string(),
                known: self.queues.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&message.payload) {
            return Err(EnqueueError::InvalidPayload {
                queue: queue.to_string(),
                reason: e.to_string(),
            });
        }
        let done = self.store.enqueue(queue, message, route.idempotent).await?;
        if done.status != crate::queue::EnqueueStatus::Discarded {
            route.wake.notify_one();
        }
        Ok(done)
    }
}

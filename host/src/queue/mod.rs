//! The SQL queue: message statuses, identity, leases with fencing tokens, retries and
//! scheduling. [`QueueStore`] is the seam every store (SQLite now, PostgreSQL next)
//! implements; the dispatch loop and the CLI only speak to it.
//!
//! Order of leasing within a queue: higher `priority` first; among equal priorities the
//! earliest processing date first; then first enqueued first.

mod backoff;
mod sqlite;
mod status;
mod types;

use async_trait::async_trait;

pub use backoff::Backoff;
pub use sqlite::SqliteStore;
pub use status::Status;
pub use types::{
    Disposition, EnqueueStatus, Enqueued, Lease, LeasedMessage, MessageFilter, NewMessage,
    SettleResult, Settlement, StoredMessage,
};

/// A failure of the queue store.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The database could not be reached or refused the statement.
    #[error("queue storage: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("queue storage migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value could not be decoded.
    #[error("queue storage holds a corrupt value in {what}: {reason}")]
    Corrupt {
        /// Which column.
        what: &'static str,
        /// Why it could not be read.
        reason: String,
    },
}

/// Milliseconds since the Unix epoch, the time unit of every stored timestamp.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Storage of queue messages. Every method is safe to call from several processes at once.
#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// Add a message, or update the message with the same id in that queue.
    async fn enqueue(&self, queue: &str, message: NewMessage) -> Result<Enqueued, QueueError>;

    /// Lease up to `max` ready messages of `queue`, each until `lease_ms` from now, in
    /// priority order. Every lease carries a new fencing token.
    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<LeasedMessage>, QueueError>;

    /// Apply the outcomes of several leases in one round trip. A lease that expired and was
    /// taken over elsewhere is not applied ([`SettleResult::LeaseLost`]).
    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError>;

    /// Return messages whose lease expired to pending (or to failed when they used their
    /// last attempt). Returns how many were returned.
    async fn expire_leases(&self, queue: &str, max_attempts: u32) -> Result<u64, QueueError>;

    /// One message by its key.
    async fn get(&self, key: i64) -> Result<Option<StoredMessage>, QueueError>;

    /// Messages matching a filter, newest first.
    async fn list(&self, filter: &MessageFilter) -> Result<Vec<StoredMessage>, QueueError>;

    /// Number of messages per status in a queue.
    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError>;

    /// Check the store answers.
    async fn ping(&self) -> Result<(), QueueError>;
}

/// Open the store a storage URL names, creating and migrating its schema.
pub async fn open(
    url: &str,
    max_connections: u32,
) -> Result<std::sync::Arc<dyn QueueStore>, QueueError> {
    Ok(std::sync::Arc::new(
        SqliteStore::open(url, max_connections).await?,
    ))
}

//! The SQL queue: message statuses, identity, leases with fencing tokens, retries and
//! scheduling. [`QueueStore`] is the seam the dispatch loop and the CLI speak to;
//! [`SqlStore`] implements it once for SQLite and PostgreSQL over the dialect layer
//! ([`crate::sql`]).
//!
//! Order of leasing within a queue: higher `priority` first; among equal priorities the
//! earliest processing date first; then first enqueued first.

mod backoff;
mod commit_marks;
mod effects;
pub(crate) mod enqueue;
mod follow_ups;
mod handler_versions;
mod inbox_records;
pub mod limits;
mod manage;
mod notify;
mod outbox;
mod payload;
mod plan;
mod postgres;
mod prepared;
mod rate_limits;
mod rows;
mod schedules;
pub mod sessions;
mod settle;
mod sqlite;
mod state;
mod state_reads;
mod statements;
mod status;
mod store;
mod types;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub use backoff::Backoff;
pub use commit_marks::{CommitMark, MARK_RETENTION_MS};
pub use effects::{CommitResult, EffectsCommit};
pub use follow_ups::FollowUp;
pub use handler_versions::{
    CurrentVersion, HANDLERS_CHANNEL, HandlerVersion, ServedVersion, VersionChange,
};
pub(crate) use inbox_records::inbox_writes;
pub use inbox_records::{InboxRow, InboxWrite, inbox_hash, record};
pub use outbox::{OutboxBacklog, OutboxEntry, OutboxRow};
pub use payload::canonical_hash;
pub use plan::{Existing, Plan, destination, plan};
pub use postgres::VACUUM_AFTER_LEASES;
pub use schedules::{Claim, HostRow, ScheduleRow};
pub(crate) use sqlite::sqlite_options;
pub use state::{Committed, StateChange, StateWrite, counter_bytes, counter_value};
pub use status::Status;
pub use store::SqlStore;
pub use types::{
    BlockedSession, Disposition, EnqueueStatus, Enqueued, HistoryEntry, Lease, LeasedMessage,
    MessageFilter, NewMessage, NextVersion, Retention, Selector, SettleResult, Settlement,
    StoredMessage,
};

/// A failure of the queue store.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The database could not be reached or refused the statement. (The text is printed,
    /// not chained as a source, so an error report shows it once.)
    #[error("queue storage: {0}")]
    Database(sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("queue storage migration: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    /// The lock that makes processes opening one SQLite database take turns could not be taken.
    #[error("queue storage: cannot lock {}", path.display())]
    Lock {
        /// The lock file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A concurrent change kept the operation from completing.
    #[error("queue storage: {0}")]
    Conflict(String),
    /// A stored value could not be decoded.
    #[error("queue storage holds a corrupt value in {what}: {reason}")]
    Corrupt {
        /// Which column.
        what: &'static str,
        /// Why it could not be read.
        reason: String,
    },
    /// A key the handler read and then set or deleted was changed by another call before
    /// the commit (`BUCKET/KEY`): nothing of the attempt was committed.
    #[error("state conflict on {0}")]
    StateConflict(String),
    /// A read batched with others failed (its error's text, given to each caller).
    #[error("queue storage: {0}")]
    Read(String),
    /// This store does not offer the operation.
    #[error("queue storage does not support {0}")]
    Unsupported(&'static str),
    /// What was asked for is not there (the text says what to do).
    #[error("{0}")]
    NotFound(String),
}

impl From<sqlx::Error> for QueueError {
    fn from(e: sqlx::Error) -> Self {
        QueueError::Database(e)
    }
}

impl From<sqlx::migrate::MigrateError> for QueueError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        QueueError::Migrate(e)
    }
}

pub use crate::clock::now_ms;

/// A new random delivery id (128 bits, hex).
pub fn new_delivery_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Storage of queue messages. Every method is safe to call from several processes at once.
#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// Add a message, or apply it to the message with the same id in that queue: replace it,
    /// defer it behind the current lease (AwaitingRelease), or — in an `idempotent` queue,
    /// when the values are equal — discard it.
    async fn enqueue(
        &self,
        queue: &str,
        message: NewMessage,
        idempotent: bool,
    ) -> Result<Enqueued, QueueError>;

    /// [`QueueStore::enqueue`] for many messages, applied in order (the same id twice is
    /// applied twice, in that order), in as few statements as the store can: one
    /// transaction per thousand messages (or 16 MiB of payload). Results are in input order.
    async fn enqueue_many(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, QueueError> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            results.push(self.enqueue(queue, message, idempotent).await?);
        }
        Ok(results)
    }

    /// Lease up to `max` ready messages of `queue`, each until `lease_ms` from now, in
    /// priority order. Every lease carries a new fencing token.
    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<LeasedMessage>, QueueError>;

    /// Whether [`QueueStore::lease_checking_inbox`] is supported.
    fn leases_check_inbox(&self) -> bool {
        false
    }

    /// Lease like [`QueueStore::lease`] and, in the same statement, check every delivery id
    /// against the inbox table `inbox.table` (in this database) for `inbox.endpoint`: each
    /// message's [`LeasedMessage::inbox_processed`] is set. Only called when
    /// [`QueueStore::leases_check_inbox`] is true.
    async fn lease_checking_inbox(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: &InboxProbe,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let _ = (queue, max, lease_ms, inbox);
        Err(QueueError::Unsupported("checking the inbox while leasing"))
    }

    /// Lease like [`QueueStore::lease`] (checking the inbox like
    /// [`QueueStore::lease_checking_inbox`] when `inbox` is given and the store supports it),
    /// but only the head of each session: a message with a session key is leased only when
    /// nothing of its session is in flight, blocking it, or waiting ahead of it (see
    /// [`sessions`]).
    async fn lease_in_sessions(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&InboxProbe>,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let _ = (queue, max, lease_ms, inbox);
        Err(QueueError::Unsupported("sessions"))
    }

    /// Park and drain every session of `queue` that has a blocker or parked messages: what
    /// the transactions that change a blocker already do, again (housekeeping).
    async fn tend_sessions(&self, queue: &str) -> Result<(), QueueError> {
        let _ = queue;
        Ok(())
    }

    /// Settle a `handed-off` message as completed (`failure` = `None`) or failed with that
    /// error; either way its session is unblocked and drained. Returns whether it was
    /// handed off.
    async fn settle_handoff(&self, key: i64, failure: Option<&str>) -> Result<bool, QueueError> {
        let _ = (key, failure);
        Err(QueueError::Unsupported("sessions"))
    }

    /// Which of `sessions` of `queue` have a message that still matters for their order
    /// (waiting, in flight or blocking): an external queue's consumer moves a delivery of
    /// such a session into the SQL queue behind them instead of running it.
    async fn sessions_in_use(
        &self,
        queue: &str,
        sessions: &[String],
    ) -> Result<Vec<String>, QueueError> {
        let _ = (queue, sessions);
        Err(QueueError::Unsupported("sessions"))
    }

    /// Which of the MessageIds `ids` name a session message the SQL queue holds for `queue`,
    /// in any status: an external queue's consumer drops a broker copy of one as a
    /// redelivery (it was moved into the SQL queue before a crash or a lost acknowledgement).
    async fn session_ids_held(
        &self,
        queue: &str,
        ids: &[String],
    ) -> Result<Vec<String>, QueueError> {
        let _ = (queue, ids);
        Err(QueueError::Unsupported("sessions"))
    }

    /// Blocked sessions (of one queue, or all), oldest block first, at most `limit`.
    async fn blocked_sessions(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BlockedSession>, QueueError> {
        let _ = (queue, limit);
        Ok(Vec::new())
    }

    /// Apply the outcomes of several leases in one round trip. A lease that expired and was
    /// taken over elsewhere is not applied ([`SettleResult::LeaseLost`]). A message that was
    /// re-enqueued while leased takes its newer version instead of this outcome.
    /// A completion's [`Settlement::follow_ups`] are written in the same transaction, only
    /// when it is applied (never again when a retried batch finds it applied already).
    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError>;

    /// Commit the effects of successful deliveries that are settled elsewhere (broker
    /// messages, acknowledged after this returns), together in one transaction: each one's
    /// inbox records (a table of this database), follow-ups and key-value changes. One per
    /// commit: `Ok(true)` committed; `Ok(false)` its mark existed (committed before: nothing
    /// again); `Err(StateConflict)` a key it read and then set was changed meanwhile (nothing
    /// of it committed). `Err` of the whole: none was committed.
    async fn commit_effects(
        &self,
        commits: &[EffectsCommit],
    ) -> Result<Vec<CommitResult>, QueueError>;

    /// Handle messages whose lease expired: with `retry_abandoned`, back to pending (failed
    /// when they used their last attempt), otherwise failed. A newer version waiting for
    /// release is applied. Returns how many were handled.
    async fn expire_leases(
        &self,
        queue: &str,
        max_attempts: u32,
        retry_abandoned: bool,
    ) -> Result<u64, QueueError>;

    /// Delete processed messages beyond the retention (at most `batch` per call; identified
    /// ones are recorded in history first) and prune history. Returns how many were deleted.
    async fn purge(
        &self,
        queue: &str,
        retention: &Retention,
        batch: u32,
    ) -> Result<u64, QueueError>;

    /// One message by its key.
    async fn get(&self, key: i64) -> Result<Option<StoredMessage>, QueueError>;

    /// Messages matching a filter, newest first.
    async fn list(&self, filter: &MessageFilter) -> Result<Vec<StoredMessage>, QueueError>;

    /// Previous versions of the identified message `id` in `queue`, oldest first.
    async fn history(&self, queue: &str, id: &str) -> Result<Vec<HistoryEntry>, QueueError>;

    /// Number of messages per status in a queue.
    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError>;

    /// When the oldest message of `queue` that is ready now became ready (Unix ms; its
    /// `process_at_ms`); `None` when none is ready. An autoscaling signal: how long work waits.
    async fn oldest_ready(&self, queue: &str) -> Result<Option<i64>, QueueError>;

    /// Make selected messages ready now, attempts reset, as a new delivery. Messages being
    /// processed are skipped. Returns how many were changed.
    async fn retry(&self, selector: &Selector) -> Result<u64, QueueError>;

    /// Move a message that is not being processed to `status`. Returns whether it moved.
    async fn move_to(&self, key: i64, status: &Status) -> Result<bool, QueueError>;

    /// Delete a message that is not being processed. Returns whether it was deleted.
    async fn delete(&self, key: i64) -> Result<bool, QueueError>;

    /// Check the store answers.
    async fn ping(&self) -> Result<(), QueueError>;

    /// Raised when this process committed outbox rows (its relay publishes them at once).
    fn outbox_written(&self) -> std::sync::Arc<tokio::sync::Notify>;

    /// Claim up to `max` outbox rows for `holder` for `lease_ms`: the oldest, of target
    /// queues no other holder has rows of, in commit order.
    async fn claim_outbox(
        &self,
        holder: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, QueueError>;

    /// Delete outbox rows their broker took.
    async fn outbox_published(&self, keys: &[i64]) -> Result<(), QueueError>;

    /// Keep outbox rows whose publication failed with `error`, to be claimed again at
    /// `retry_at_ms`.
    async fn outbox_failed(
        &self,
        keys: &[i64],
        error: &str,
        retry_at_ms: i64,
    ) -> Result<(), QueueError>;

    /// The outbox rows not published yet, per target queue.
    async fn outbox_backlog(&self) -> Result<Vec<OutboxBacklog>, QueueError>;

    /// The committed value and revision of a key of handlers' key-value state.
    async fn state_read(&self, bucket: &str, key: &str) -> Result<Option<Committed>, QueueError>;

    /// `limit` keys of `bucket` in key order, from position `offset`.
    async fn state_keys(
        &self,
        bucket: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<String>, QueueError>;

    /// `limit` keys of `bucket` in key order, from position `offset`, with their committed
    /// values and revisions.
    async fn state_entries(
        &self,
        bucket: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<(String, Committed)>, QueueError>;

    /// Every bucket of handlers' key-value state that holds a key, with its number of keys.
    async fn state_buckets(&self) -> Result<Vec<(String, u64)>, QueueError>;

    /// Delete a key of handlers' key-value state; returns whether it existed.
    async fn state_delete(&self, bucket: &str, key: &str) -> Result<bool, QueueError>;

    /// The row of schedule `name`, made (its last tick `now_ms`) when it has none.
    async fn schedule_begin(&self, name: &str, now_ms: i64) -> Result<ScheduleRow, QueueError>;

    /// Claim ticks of a schedule and write their messages in one transaction; `false` when
    /// another host claimed first (nothing was written).
    async fn schedule_claim(&self, claim: &Claim<'_>) -> Result<bool, QueueError>;

    /// Every schedule's row, by name.
    async fn schedules(&self) -> Result<Vec<ScheduleRow>, QueueError>;

    /// Record that host `id` (started at `started_at_ms`) is alive now, or stopped now.
    async fn host_beat(
        &self,
        id: &str,
        started_at_ms: i64,
        stopped: bool,
    ) -> Result<(), QueueError>;

    /// Every host that used this store, by id.
    async fn hosts(&self) -> Result<Vec<HostRow>, QueueError>;

    /// Take budget for up to `wanted` messages of rate-limited `queue`, shared by every host
    /// using this store.
    async fn rate_take(
        &self,
        queue: &str,
        limit: crate::rate_limit::Limit,
        wanted: u32,
    ) -> Result<crate::rate_limit::Taken, QueueError>;

    /// Return budget of `queue` taken for `unused` messages that were not there to lease.
    async fn rate_give_back(
        &self,
        queue: &str,
        limit: crate::rate_limit::Limit,
        unused: u32,
    ) -> Result<(), QueueError>;

    /// Store `component` (content `sha256`) as the next version of handler `name` and make it
    /// current; every host in handlers-from-the-store mode then serves it.
    async fn handler_deploy(
        &self,
        name: &str,
        component: &[u8],
        sha256: &str,
    ) -> Result<VersionChange, QueueError>;

    /// Make version `to` of handler `name` current (`None`: the one before the current).
    async fn handler_rollback(
        &self,
        name: &str,
        to: Option<i64>,
    ) -> Result<VersionChange, QueueError>;

    /// The current version of every handler in the store.
    async fn handler_current(&self) -> Result<Vec<CurrentVersion>, QueueError>;

    /// The component of a stored handler version.
    async fn handler_component(&self, name: &str, version: i64) -> Result<Vec<u8>, QueueError>;

    /// Every stored version of handler `name`, oldest first.
    async fn handler_versions(&self, name: &str) -> Result<Vec<HandlerVersion>, QueueError>;

    /// Record in the deploy log what a host did with a handler version.
    async fn handler_record(&self, served: &ServedVersion) -> Result<(), QueueError>;

    /// The deploy log of handler `name` (`None`: every handler), oldest first.
    async fn handler_served(&self, name: Option<&str>) -> Result<Vec<ServedVersion>, QueueError>;

    /// Call `changed()` whenever a handler's current version changes in the store, until
    /// `shutdown` (and once after each reconnect). Stores without notifications return
    /// `None`: the host polls.
    fn listen_handlers(
        &self,
        changed: WakeFn,
        shutdown: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let _ = (changed, shutdown);
        None
    }

    /// Call `wake(Some(queue))` whenever a message of that queue becomes ready in any
    /// process (`wake(None)`: possibly any queue), until `shutdown`. Stores without
    /// notifications return `None` and processors rely on polling.
    fn listen(
        &self,
        wake: WakeFn,
        shutdown: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let _ = (wake, shutdown);
        None
    }
}

/// The callback [`QueueStore::listen`] calls.
pub type WakeFn = std::sync::Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// Open the store a storage URL names (`sqlite://…` or `postgres://…`), creating and
/// migrating its schema. (Boxed here for the reason [`crate::start_with`] is.)
#[inline(never)]
pub fn open<'a>(
    url: &'a str,
    schema: Option<&'a str>,
    max_connections: u32,
) -> futures_util::future::BoxFuture<'a, Result<std::sync::Arc<dyn QueueStore>, QueueError>> {
    Box::pin(open_store(url, schema, max_connections))
}

async fn open_store(
    url: &str,
    schema: Option<&str>,
    max_connections: u32,
) -> Result<std::sync::Arc<dyn QueueStore>, QueueError> {
    let store = match crate::sql::Dialect::of_url(url) {
        crate::sql::Dialect::Postgres => {
            SqlStore::open_postgres(url, schema, max_connections).await?
        }
        crate::sql::Dialect::Sqlite => SqlStore::open_sqlite(url, max_connections).await?,
    };
    Ok(std::sync::Arc::new(store))
}

/// The inbox a lease checks its deliveries against.
#[derive(Debug, Clone)]
pub struct InboxProbe {
    /// The inbox table in the queue database.
    pub table: std::sync::Arc<str>,
    /// The endpoint the records are keyed on.
    pub endpoint: String,
}

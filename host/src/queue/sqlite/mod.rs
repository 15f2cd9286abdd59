//! [`QueueStore`] on embedded SQLite (WAL mode), the default store. SQLite serialises
//! writers, so every transaction here starts with a write and holds the lock it decides under;
//! identity is still enforced by the unique index on (queue, message_id).

mod checkpoint;
mod engine;
mod enqueue;
mod inbox_key;
mod manage;
mod open_turn;
mod sessions;
mod settle;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use self::checkpoint::Checkpointer;
pub(crate) use self::engine::options as sqlite_options;
use self::enqueue::SqliteEnqueue;
use self::open_turn::OpenTurn;
use self::settle::SqliteSettle;
use self::statements::*;
use super::enqueue::{Prepared, apply as apply_batch, transactions};
use super::rows::{decode_headers, fetch_lease, leased_in_order, stored_from_row};
use super::{
    Enqueued, HistoryEntry, Lease, LeasedMessage, MessageFilter, NewMessage, NextVersion,
    QueueError, QueueStore, Retention, Selector, SettleResult, Settlement, Status, StoredMessage,
    now_ms,
};

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The one connection every write goes through. SQLite takes one writer at a time; with
    /// one connection the writers of this process queue here instead of in SQLite's busy
    /// handler, which sleeps a millisecond or more per conflict.
    pool: SqlitePool,
    /// Connections for reads (operator listings, counts), beside the writer (WAL).
    readers: SqlitePool,
    /// Checkpoints the log off the writer's path (none for an in-memory database).
    _checkpointer: Option<Arc<Checkpointer>>,
}

impl SqliteStore {
    /// Open (creating if missing) the database at a `sqlite://PATH` URL and migrate it.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, QueueError> {
        let options = sqlite_options(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            // A statement's rollback journal inside a transaction stays in memory instead
            // of a temporary file written for every multi-statement settlement.
            .pragma("temp_store", "memory")
            .busy_timeout(Duration::from_secs(30));
        let writer = options.clone().pragma(
            "wal_autocheckpoint",
            checkpoint::WRITER_BACKSTOP_PAGES.to_string(),
        );
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        // Until the schema is current and every connection is open, other processes opening
        // this database wait.
        let turn = OpenTurn::take(options.get_filename(), in_memory).await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            // The writer's leases check the inbox with `wharf_inbox_key`.
            .after_connect(|conn, _| Box::pin(inbox_key::register(conn)))
            .connect_with(writer)
            .await?;
        turn.migrate(&pool).await?;
        let (readers, checkpointer) = if in_memory {
            (pool.clone(), None) // another connection would open another database
        } else {
            let readers = SqlitePoolOptions::new()
                .max_connections(max_connections.max(1))
                .connect_with(options.clone())
                .await?;
            (
                readers,
                Some(Arc::new(Checkpointer::start(&options).await?)),
            )
        };
        drop(turn);
        Ok(SqliteStore {
            pool,
            readers,
            _checkpointer: checkpointer,
        })
    }

    /// Lease session heads (`sessions`) or any ready messages, checking each delivery against
    /// the inbox table of `inbox` when given (see
    /// [`crate::queue::QueueStore::lease_checking_inbox`] and
    /// [`crate::queue::QueueStore::lease_in_sessions`]).
    async fn lease_now(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&super::InboxProbe>,
        sessions: bool,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let rows = fetch_lease!(
            &self.pool,
            lease,
            lease_checking_inbox,
            queue,
            max,
            lease_ms,
            inbox,
            sessions
        );
        Ok(leased_in_order!(rows))
    }

    /// The connections reads go through.
    pub(super) fn readers(&self) -> &SqlitePool {
        &self.readers
    }
}

fn stored(row: &SqliteRow) -> Result<StoredMessage, QueueError> {
    stored_from_row!(row)
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn enqueue(
        &self,
        queue: &str,
        message: NewMessage,
        idempotent: bool,
    ) -> Result<Enqueued, QueueError> {
        let mut done = self.enqueue_many(queue, vec![message], idempotent).await?;
        done.pop()
            .ok_or_else(|| QueueError::Conflict("the enqueue returned no result".into()))
    }

    async fn enqueue_many(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
        idempotent: bool,
    ) -> Result<Vec<Enqueued>, QueueError> {
        let now = now_ms();
        let prepared: Vec<Prepared> = messages
            .into_iter()
            .map(|m| Prepared::new(m, now))
            .collect();
        let mut results = Vec::with_capacity(prepared.len());
        for chunk in transactions(&prepared) {
            let applied = if chunk.iter().all(|m| m.message.id.is_none()) {
                // Nothing to collide with: one insert statement, atomic on its own.
                let mut conn = self.pool.acquire().await?;
                apply_batch(
                    &mut SqliteEnqueue { conn: &mut conn },
                    queue,
                    chunk,
                    idempotent,
                    now,
                )
                .await?
            } else {
                let mut tx = self.pool.begin().await?;
                let applied = apply_batch(
                    &mut SqliteEnqueue { conn: &mut tx },
                    queue,
                    chunk,
                    idempotent,
                    now,
                )
                .await?;
                tx.commit().await?;
                applied
            };
            results.extend(applied.results);
        }
        Ok(results)
    }

    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        self.lease_now(queue, max, lease_ms, None, false).await
    }

    fn leases_check_inbox(&self) -> bool {
        true
    }

    async fn lease_checking_inbox(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: &super::InboxProbe,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        self.lease_now(queue, max, lease_ms, Some(inbox), false)
            .await
    }

    async fn lease_in_sessions(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&super::InboxProbe>,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        self.lease_now(queue, max, lease_ms, inbox, true).await
    }

    async fn tend_sessions(&self, queue: &str) -> Result<(), QueueError> {
        self.tend_queue(queue).await
    }

    async fn settle_handoff(&self, key: i64, failure: Option<&str>) -> Result<bool, QueueError> {
        self.settle_handoff_now(key, failure).await
    }

    async fn sessions_in_use(
        &self,
        queue: &str,
        sessions: &[String],
    ) -> Result<Vec<String>, QueueError> {
        self.live_now(queue, sessions).await
    }

    async fn session_ids_held(
        &self,
        queue: &str,
        ids: &[String],
    ) -> Result<Vec<String>, QueueError> {
        self.held_now(queue, ids).await
    }

    async fn blocked_sessions(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> Result<Vec<super::BlockedSession>, QueueError> {
        self.blocked_now(queue, limit).await
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError> {
        let mut tx = self.pool.begin().await?;
        let results =
            super::settle::settle(&mut SqliteSettle { conn: &mut tx }, settlements, now_ms())
                .await?;
        tx.commit().await?;
        Ok(results)
    }

    async fn expire_leases(
        &self,
        queue: &str,
        max_attempts: u32,
        retry_abandoned: bool,
    ) -> Result<u64, QueueError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let (status, error) = if retry_abandoned {
            (None, None)
        } else {
            (Some("failed"), Some(ABANDONED))
        };
        let next = sqlx::query(APPLY_NEXT)
            .bind(now)
            .bind(status)
            .bind(error)
            .bind(None::<i64>)
            .bind(None::<i64>)
            .bind(queue)
            .execute(&mut *tx)
            .await?;
        let plain = sqlx::query(EXPIRE)
            .bind(now)
            .bind(queue)
            .bind(max_attempts as i64)
            .bind(retry_abandoned)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(next.rows_affected() + plain.rows_affected())
    }

    async fn purge(
        &self,
        queue: &str,
        retention: &Retention,
        batch: u32,
    ) -> Result<u64, QueueError> {
        self.purge_now(queue, retention, batch).await
    }

    async fn get(&self, key: i64) -> Result<Option<StoredMessage>, QueueError> {
        self.get_now(key).await
    }

    async fn list(&self, filter: &MessageFilter) -> Result<Vec<StoredMessage>, QueueError> {
        self.list_now(filter).await
    }

    async fn history(&self, queue: &str, id: &str) -> Result<Vec<HistoryEntry>, QueueError> {
        self.history_now(queue, id).await
    }

    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError> {
        self.counts_now(queue).await
    }

    async fn retry(&self, selector: &Selector) -> Result<u64, QueueError> {
        self.retry_now(selector).await
    }

    async fn move_to(&self, key: i64, status: &Status) -> Result<bool, QueueError> {
        self.move_to_now(key, status).await
    }

    async fn delete(&self, key: i64) -> Result<bool, QueueError> {
        self.delete_now(key).await
    }

    async fn ping(&self) -> Result<(), QueueError> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }
}

/// A store in a fresh database file of `dir` holding `count` messages in queue `orders`.
#[cfg(test)]
pub(super) async fn store_with_orders(dir: &std::path::Path, count: u32) -> SqliteStore {
    let url = format!("sqlite://{}", dir.join("queue.db").display());
    let store = SqliteStore::open(&url, 2).await.unwrap();
    let messages = (0..count)
        .map(|n| NewMessage {
            payload: format!("{{\"n\":{n}}}"),
            ..NewMessage::default()
        })
        .collect();
    store.enqueue_many("orders", messages, false).await.unwrap();
    store
}

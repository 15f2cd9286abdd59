//! [`QueueStore`] on PostgreSQL, for production and for several hosts sharing queues.
//! Leases take ready rows with `FOR UPDATE SKIP LOCKED` in batches, completions are applied
//! in one statement per batch, and enqueues `NOTIFY wharf_ready` (throttled, see
//! [`super::notify`]), so processors in every process wake on enqueue instead of polling.

mod enqueue;
mod listen;
mod manage;
mod sessions;
mod settle;
mod statements;
mod upkeep;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;

use self::statements::*;
pub use self::upkeep::VACUUM_AFTER_LEASES;
use super::rows::{decode_headers, fetch_lease, leased_in_order, stored_from_row};
use super::{
    Enqueued, HistoryEntry, Lease, LeasedMessage, MessageFilter, NewMessage, NextVersion,
    QueueError, QueueStore, Retention, Selector, SettleResult, Settlement, Status, StoredMessage,
    WakeFn, now_ms,
};

use super::enqueue::{Prepared, transactions};
use super::notify::Notifier;

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Connections for leasing, with `synchronous_commit = off`: a lease lost in a database
    /// crash only returns its message to pending (exactly what an expired lease does), so
    /// leases need not wait for the WAL flush that enqueues and settlements wait for.
    lease_pool: PgPool,
    /// Connections reserved for settlements, so a burst of enqueues waiting for connections
    /// never starves the processors.
    settle_pool: PgPool,
    notifier: Arc<Notifier>,
    /// Vacuums `messages` as leases leave dead entries in the ready index.
    upkeep: Arc<upkeep::Upkeep>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

impl PostgresStore {
    /// Connect to `url`, using tables in `schema` (created if missing; `None`: the
    /// connection's default search path), and migrate.
    pub async fn open_in_schema(
        url: &str,
        schema: Option<&str>,
        max_connections: u32,
    ) -> Result<Self, QueueError> {
        let mut options = PgConnectOptions::from_str(url)?;
        options = options.application_name(&match schema {
            Some(schema) => format!("wharf:{schema}"),
            None => "wharf".to_string(),
        });
        if let Some(schema) = schema {
            let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
            let bootstrap = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(options.clone())
                .await?;
            crate::schema_lock::create_serialized(
                &bootstrap,
                &[format!("CREATE SCHEMA IF NOT EXISTS {quoted}")],
            )
            .await?;
            bootstrap.close().await;
            options = options.options([("search_path", quoted.as_str())]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        MIGRATOR.run(&pool).await?;
        let small = |n: u32| {
            PgPoolOptions::new()
                .max_connections(n)
                .acquire_timeout(Duration::from_secs(10))
        };
        let settle_pool = small(2).connect_with(options.clone()).await?;
        let lease_pool = small(2)
            .connect_with(options.options([("synchronous_commit", "off")]))
            .await?;
        Ok(PostgresStore {
            upkeep: upkeep::Upkeep::new(pool.clone()),
            pool,
            lease_pool,
            settle_pool,
            notifier: Arc::default(),
        })
    }

    /// Connect to `url` and migrate (tables in the connection's default schema).
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, QueueError> {
        Self::open_in_schema(url, None, max_connections).await
    }
}

fn stored(row: &PgRow) -> Result<StoredMessage, QueueError> {
    stored_from_row!(row)
}

async fn record_history(
    conn: &mut PgConnection,
    now: i64,
    status: Option<&str>,
    error: Option<&str>,
    key: i64,
    token: Option<i64>,
    only_in: Option<&str>,
) -> Result<(), QueueError> {
    sqlx::query(RECORD_HISTORY)
        .bind(now)
        .bind(status)
        .bind(error)
        .bind(key)
        .bind(token)
        .bind(only_in)
        .execute(conn)
        .await?;
    Ok(())
}

impl PostgresStore {
    /// Lease session heads (`sessions`) or any ready messages, checking each delivery against
    /// the inbox table of `inbox` when given (see
    /// [`crate::queue::QueueStore::lease_checking_inbox`] and
    /// [`crate::queue::QueueStore::lease_in_sessions`]).
    pub(super) async fn lease_now(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&super::InboxProbe>,
        sessions: bool,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let rows = fetch_lease!(
            &self.lease_pool,
            lease,
            lease_checking_inbox,
            queue,
            max,
            lease_ms,
            inbox,
            sessions
        );
        self.upkeep.leased(rows.len());
        Ok(leased_in_order!(rows))
    }

    /// The connections reads go through (the same pool as writes).
    pub(super) fn readers(&self) -> &PgPool {
        &self.pool
    }
}

#[async_trait]
impl QueueStore for PostgresStore {
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
        let mut ready = false;
        let mut failed = None;
        for chunk in transactions(&prepared) {
            match self.enqueue_chunk(queue, chunk, idempotent, now).await {
                Ok(applied) => {
                    ready |= applied.ready;
                    results.extend(applied.results);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // The transactions that committed before a failure still wake the processors.
        if ready {
            self.notifier.ready(&self.pool, queue).await;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(results),
        }
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
        settle::settle_batch(&self.settle_pool, settlements, now_ms()).await
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
            .bind(max_attempts as i32)
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
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn listen(
        &self,
        wake: WakeFn,
        shutdown: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let pool = self.pool.clone();
        Some(tokio::spawn(listen::listen_for_ready(pool, wake, shutdown)))
    }
}

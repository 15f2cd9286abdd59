//! [`SqlStore`]: the [`QueueStore`] on SQLite or PostgreSQL, written once over the dialect
//! layer ([`crate::sql`]). What a database needs of its own — how it is opened, SQLite's
//! checkpoints, PostgreSQL's notifications, vacuums and one-statement settlements — lives in
//! `sqlite/` and `postgres/`.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::enqueue::{Applied, apply, transactions};
use super::prepared::Prepared;
use super::rows::leased_in_order;
use super::state_reads::StateReads;
use super::statements::{self, ABANDONED, APPLY_NEXT, EXPIRE};
use super::{
    BlockedSession, Claim, CommitResult, Committed, CurrentVersion, EffectsCommit, Enqueued,
    HandlerVersion, HistoryEntry, HostRow, InboxProbe, LeasedMessage, MessageFilter, NewMessage,
    OutboxBacklog, OutboxRow, QueueError, QueueStore, Retention, ScheduleRow, Selector,
    ServedVersion, SettleResult, Settlement, Status, StoredMessage, VersionChange, WakeFn, effects,
    follow_ups, handler_versions, manage, now_ms, outbox, postgres, rate_limits, schedules,
    sessions, settle, sqlite, state,
};
use crate::rate_limit::{Limit, Taken};
use crate::sql::{Dialect, Pool};

/// The SQL queue store.
#[derive(Debug, Clone)]
pub struct SqlStore {
    /// Writes. On SQLite the one connection every write goes through: SQLite takes one writer
    /// at a time, and with one connection the writers of this process queue here instead of
    /// in SQLite's busy handler, which sleeps a millisecond or more per conflict.
    pub(super) pool: Pool,
    /// Reads (operator listings, counts): SQLite's reader connections beside the writer
    /// (WAL); PostgreSQL's main pool.
    pub(super) readers: Pool,
    /// Leases: SQLite's writer; on PostgreSQL connections with `synchronous_commit = off` (a
    /// lease lost in a database crash only returns its message to pending, exactly what an
    /// expired lease does, so leases need not wait for the WAL flush).
    pub(super) leases: Pool,
    /// Settlements: SQLite's writer; on PostgreSQL connections reserved for them, so a burst
    /// of enqueues waiting for connections never starves the processors.
    pub(super) settlements: Pool,
    /// What one database needs of its own.
    pub(super) engine: Engine,
    /// Raised when this process committed outbox rows.
    pub(super) outbox_written: Arc<Notify>,
    /// Handler calls' reads of committed key-value state, coalesced.
    pub(super) state_reads: StateReads,
}

/// The parts of a store only one database has.
#[derive(Debug, Clone)]
pub(super) enum Engine {
    /// SQLite: checkpoints the log off the writer's path (none for an in-memory database).
    Sqlite {
        _checkpointer: Option<Arc<sqlite::Checkpointer>>,
    },
    /// PostgreSQL: wakes processors in every process on enqueue (`NOTIFY`), and vacuums
    /// `messages` as leases leave dead entries in the ready index.
    Postgres {
        pool: PgPool,
        notifier: Arc<super::notify::Notifier>,
        upkeep: Arc<postgres::Upkeep>,
    },
}

impl SqlStore {
    /// Open (creating if missing) the SQLite database at a `sqlite://PATH` URL and migrate it.
    pub async fn open_sqlite(url: &str, max_connections: u32) -> Result<Self, QueueError> {
        let connected = sqlite::connect(url, max_connections).await?;
        let writer = Pool::Sqlite(connected.writer);
        let readers = Pool::Sqlite(connected.readers);
        Ok(SqlStore {
            state_reads: StateReads::new(readers.clone()),
            readers,
            leases: writer.clone(),
            settlements: writer.clone(),
            pool: writer,
            engine: Engine::Sqlite {
                _checkpointer: connected.checkpointer,
            },
            outbox_written: Arc::default(),
        })
    }

    /// Connect to the PostgreSQL database at `url`, using tables in `schema` (created if
    /// missing; `None`: the connection's default search path), and migrate.
    pub async fn open_postgres(
        url: &str,
        schema: Option<&str>,
        max_connections: u32,
    ) -> Result<Self, QueueError> {
        let connected = postgres::connect(url, schema, max_connections).await?;
        let pool = connected.pool;
        Ok(SqlStore {
            pool: Pool::Postgres(pool.clone()),
            readers: Pool::Postgres(pool.clone()),
            state_reads: StateReads::new(Pool::Postgres(pool.clone())),
            leases: Pool::Postgres(connected.leases),
            settlements: Pool::Postgres(connected.settlements),
            engine: Engine::Postgres {
                upkeep: postgres::Upkeep::new(pool.clone()),
                notifier: Arc::default(),
                pool,
            },
            outbox_written: Arc::default(),
        })
    }

    /// After a commit that wrote follow-ups: wake the processors of their queues in every
    /// process (PostgreSQL's `NOTIFY`; in this process the caller wakes them), and this
    /// process's outbox relay.
    pub(super) async fn committed(&self, written: &follow_ups::Written) {
        if written.outbox {
            self.outbox_written.notify_one();
        }
        if let Engine::Postgres { pool, notifier, .. } = &self.engine {
            for queue in &written.ready {
                notifier.ready(pool, queue).await;
            }
        }
    }

    /// Its dialect.
    pub fn dialect(&self) -> Dialect {
        self.pool.dialect()
    }

    /// Lease session heads (`sessions`) or any ready messages, checking each delivery against
    /// the inbox table of `inbox` when given (see [`QueueStore::lease_checking_inbox`] and
    /// [`QueueStore::lease_in_sessions`]).
    async fn lease_now(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&InboxProbe>,
        sessions: bool,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let now = now_ms();
        let dialect = self.dialect();
        let query = match inbox {
            Some(probe) => self.leases.query(statements::lease_checking_inbox(
                dialect,
                &probe.table,
                sessions,
            )),
            None => self.leases.query(statements::lease(dialect, sessions)),
        };
        let query = query
            .bind(now + lease_ms)
            .bind(now)
            .bind(queue)
            .bind(max as i64);
        let rows = match inbox {
            Some(probe) => query.bind(probe.endpoint.as_str()),
            None => query,
        }
        .fetch_all()
        .await?;
        if let Engine::Postgres { upkeep, .. } = &self.engine {
            upkeep.leased(rows.len());
        }
        leased_in_order(&rows)
    }

    /// Apply one chunk of an enqueue (see [`transactions`]) in one transaction, again when
    /// PostgreSQL chose it as a deadlock victim (two batches taking the same ids in another
    /// order).
    async fn enqueue_chunk(
        &self,
        queue: &str,
        chunk: &[Prepared],
        idempotent: bool,
        now: i64,
    ) -> Result<Applied, QueueError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = if chunk.iter().all(|m| m.message.id.is_none()) {
                // Nothing to collide with: one insert statement, atomic on its own.
                let mut conn = self.pool.acquire().await?;
                apply(&mut conn.conn(), queue, chunk, idempotent, now).await
            } else {
                let mut tx = self.pool.begin().await?;
                match apply(&mut tx.conn(), queue, chunk, idempotent, now).await {
                    Ok(applied) => tx.commit().await.map(|()| applied).map_err(Into::into),
                    Err(e) => Err(e),
                }
            };
            match result {
                Err(QueueError::Database(sqlx::Error::Database(e)))
                    if attempt < 4 && matches!(e.code().as_deref(), Some("40P01" | "40001")) =>
                {
                    tracing::debug!(
                        queue,
                        attempt,
                        "enqueue batch retried after a deadlock: {e}"
                    );
                }
                other => return other,
            }
        }
    }
}

#[async_trait]
impl QueueStore for SqlStore {
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
        if let (true, Engine::Postgres { pool, notifier, .. }) = (ready, &self.engine) {
            notifier.ready(pool, queue).await;
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
        inbox: &InboxProbe,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        self.lease_now(queue, max, lease_ms, Some(inbox), false)
            .await
    }

    async fn lease_in_sessions(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&InboxProbe>,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        self.lease_now(queue, max, lease_ms, inbox, true).await
    }

    async fn tend_sessions(&self, queue: &str) -> Result<(), QueueError> {
        sessions::tend_queue(&self.pool, queue).await
    }

    async fn settle_handoff(&self, key: i64, failure: Option<&str>) -> Result<bool, QueueError> {
        sessions::settle_handoff(&self.pool, key, failure).await
    }

    async fn sessions_in_use(
        &self,
        queue: &str,
        sessions: &[String],
    ) -> Result<Vec<String>, QueueError> {
        sessions::sessions_in_use(&self.readers, queue, sessions).await
    }

    async fn session_ids_held(
        &self,
        queue: &str,
        ids: &[String],
    ) -> Result<Vec<String>, QueueError> {
        sessions::session_ids_held(&self.readers, queue, ids).await
    }

    async fn blocked_sessions(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BlockedSession>, QueueError> {
        sessions::blocked_sessions(&self.readers, queue, limit).await
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError> {
        let settled = settle::settle_batch(&self.settlements, settlements, now_ms()).await?;
        self.committed(&settled.follow_ups).await;
        Ok(settled.results)
    }

    async fn commit_effects(
        &self,
        commits: &[EffectsCommit],
    ) -> Result<Vec<CommitResult>, QueueError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let now = now_ms();
            let mut tx = self.settlements.begin().await?;
            match effects::commit_many(&mut tx.conn(), commits, now).await {
                // A key written by another transaction since it was found absent.
                Err(QueueError::Conflict(_)) if tries < settle::STATE_TRIES => continue,
                done => {
                    let (results, written) = done?;
                    tx.commit().await?;
                    self.committed(&written).await;
                    return Ok(results);
                }
            }
        }
    }

    fn outbox_written(&self) -> Arc<Notify> {
        self.outbox_written.clone()
    }

    async fn claim_outbox(
        &self,
        holder: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, QueueError> {
        outbox::claim(&self.pool, holder, max, lease_ms, now_ms()).await
    }

    async fn outbox_published(&self, keys: &[i64]) -> Result<(), QueueError> {
        outbox::published(&self.pool, keys).await
    }

    async fn outbox_failed(
        &self,
        keys: &[i64],
        error: &str,
        retry_at_ms: i64,
    ) -> Result<(), QueueError> {
        outbox::failed(&self.pool, keys, error, retry_at_ms).await
    }

    async fn outbox_backlog(&self) -> Result<Vec<OutboxBacklog>, QueueError> {
        outbox::backlog(&self.readers).await
    }

    async fn state_read(&self, bucket: &str, key: &str) -> Result<Option<Committed>, QueueError> {
        self.state_reads.read(bucket, key).await
    }

    async fn state_keys(
        &self,
        bucket: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<String>, QueueError> {
        state::keys(&self.readers, bucket, offset, limit).await
    }

    async fn state_entries(
        &self,
        bucket: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<(String, Committed)>, QueueError> {
        state::entries(&self.readers, bucket, offset, limit).await
    }

    async fn state_buckets(&self) -> Result<Vec<(String, u64)>, QueueError> {
        state::buckets(&self.readers).await
    }

    async fn state_delete(&self, bucket: &str, key: &str) -> Result<bool, QueueError> {
        state::delete(&self.pool, bucket, key).await
    }

    async fn schedule_begin(&self, name: &str, now_ms: i64) -> Result<ScheduleRow, QueueError> {
        schedules::begin(&self.pool, name, now_ms).await
    }

    async fn schedule_claim(&self, claim: &Claim<'_>) -> Result<bool, QueueError> {
        schedules::claim(self, claim, now_ms()).await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, QueueError> {
        schedules::list(&self.readers).await
    }

    async fn host_beat(
        &self,
        id: &str,
        started_at_ms: i64,
        stopped: bool,
    ) -> Result<(), QueueError> {
        schedules::beat(&self.pool, id, started_at_ms, now_ms(), stopped).await
    }

    async fn hosts(&self) -> Result<Vec<HostRow>, QueueError> {
        schedules::hosts(&self.readers).await
    }

    async fn rate_take(&self, queue: &str, limit: Limit, wanted: u32) -> Result<Taken, QueueError> {
        rate_limits::take(self, queue, limit, wanted).await
    }

    async fn rate_give_back(
        &self,
        queue: &str,
        limit: Limit,
        unused: u32,
    ) -> Result<(), QueueError> {
        rate_limits::give_back(self, queue, limit, unused).await
    }

    async fn expire_leases(
        &self,
        queue: &str,
        max_attempts: u32,
        retry_abandoned: bool,
    ) -> Result<u64, QueueError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let mut conn = tx.conn();
        let (status, error) = if retry_abandoned {
            (None, None)
        } else {
            (Some("failed"), Some(ABANDONED))
        };
        let next = conn
            .query(&APPLY_NEXT)
            .bind(now)
            .bind(status)
            .bind(error)
            .bind(None::<i64>)
            .bind(None::<i64>)
            .bind(queue)
            .execute()
            .await?;
        let plain = conn
            .query(&EXPIRE)
            .bind(now)
            .bind(queue)
            .bind(max_attempts as i32)
            .bind(retry_abandoned)
            .execute()
            .await?;
        tx.commit().await?;
        Ok(next + plain)
    }

    async fn purge(
        &self,
        queue: &str,
        retention: &Retention,
        batch: u32,
    ) -> Result<u64, QueueError> {
        manage::purge(&self.pool, queue, retention, batch).await
    }

    async fn get(&self, key: i64) -> Result<Option<StoredMessage>, QueueError> {
        manage::get(&self.readers, key).await
    }

    async fn list(&self, filter: &MessageFilter) -> Result<Vec<StoredMessage>, QueueError> {
        manage::list(&self.readers, filter).await
    }

    async fn history(&self, queue: &str, id: &str) -> Result<Vec<HistoryEntry>, QueueError> {
        manage::history(&self.readers, queue, id).await
    }

    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError> {
        manage::counts(&self.readers, queue).await
    }

    async fn oldest_ready(&self, queue: &str) -> Result<Option<i64>, QueueError> {
        manage::oldest_ready(&self.readers, queue, now_ms()).await
    }

    async fn retry(&self, selector: &Selector) -> Result<u64, QueueError> {
        manage::retry(&self.pool, selector).await
    }

    async fn move_to(&self, key: i64, status: &Status) -> Result<bool, QueueError> {
        manage::move_to(&self.pool, key, status).await
    }

    async fn delete(&self, key: i64) -> Result<bool, QueueError> {
        manage::delete(&self.pool, key).await
    }

    async fn ping(&self) -> Result<(), QueueError> {
        self.readers.query("SELECT 1").execute().await?;
        Ok(())
    }

    async fn handler_deploy(
        &self,
        name: &str,
        component: &[u8],
        sha256: &str,
    ) -> Result<VersionChange, QueueError> {
        handler_versions::deploy(&self.pool, name, component, sha256, now_ms()).await
    }

    async fn handler_rollback(
        &self,
        name: &str,
        to: Option<i64>,
    ) -> Result<VersionChange, QueueError> {
        handler_versions::rollback(&self.pool, name, to, now_ms()).await
    }

    async fn handler_current(&self) -> Result<Vec<CurrentVersion>, QueueError> {
        handler_versions::current(&self.readers).await
    }

    async fn handler_component(&self, name: &str, version: i64) -> Result<Vec<u8>, QueueError> {
        handler_versions::component(&self.readers, name, version).await
    }

    async fn handler_versions(&self, name: &str) -> Result<Vec<HandlerVersion>, QueueError> {
        handler_versions::versions(&self.readers, name).await
    }

    async fn handler_record(&self, served: &ServedVersion) -> Result<(), QueueError> {
        handler_versions::record(&self.pool, served).await
    }

    async fn handler_served(&self, name: Option<&str>) -> Result<Vec<ServedVersion>, QueueError> {
        handler_versions::served(&self.readers, name).await
    }

    fn listen_handlers(
        &self,
        changed: WakeFn,
        shutdown: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let Engine::Postgres { pool, .. } = &self.engine else {
            return None;
        };
        Some(tokio::spawn(postgres::listen_on(
            pool.clone(),
            super::HANDLERS_CHANNEL,
            changed,
            shutdown,
        )))
    }

    fn listen(
        &self,
        wake: WakeFn,
        shutdown: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let Engine::Postgres { pool, .. } = &self.engine else {
            return None;
        };
        Some(tokio::spawn(postgres::listen_on(
            pool.clone(),
            super::notify::READY_CHANNEL,
            wake,
            shutdown,
        )))
    }
}

//! [`QueueStore`] on embedded SQLite (WAL mode), the default store. Writers are serialised
//! by SQLite; leases and settlements are batched to keep round trips few.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};

use super::{
    Disposition, EnqueueStatus, Enqueued, Lease, LeasedMessage, MessageFilter, NewMessage,
    QueueError, QueueStore, SettleResult, Settlement, Status, StoredMessage, now_ms,
};

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

impl SqliteStore {
    /// Open (creating if missing) the database at a `sqlite://PATH` URL and migrate it.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, QueueError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore { pool })
    }
}

/// A new random delivery id (128 bits, hex).
pub(crate) fn new_delivery_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn encode_headers(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "[]".into())
}

fn decode_headers(text: &str) -> Result<Vec<(String, String)>, QueueError> {
    serde_json::from_str(text).map_err(|e| QueueError::Corrupt {
        what: "headers",
        reason: e.to_string(),
    })
}

fn stored(row: &SqliteRow) -> Result<StoredMessage, QueueError> {
    Ok(StoredMessage {
        key: row.try_get("key")?,
        queue: row.try_get("queue")?,
        id: row.try_get("message_id")?,
        delivery_id: row.try_get("delivery_id")?,
        status: Status::parse(row.try_get::<&str, _>("status")?),
        payload: row.try_get("payload")?,
        headers: decode_headers(row.try_get("headers")?)?,
        priority: row.try_get("priority")?,
        attempts: row.try_get::<i64, _>("attempts")? as u32,
        process_at_ms: row.try_get("process_at_ms")?,
        created_at_ms: row.try_get("created_at_ms")?,
        enqueued_at_ms: row.try_get("enqueued_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
        processed_at_ms: row.try_get("processed_at_ms")?,
        lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
        last_error: row.try_get("last_error")?,
    })
}

const UPSERT: &str = "
INSERT INTO messages (queue, message_id, delivery_id, payload, headers, priority, status,
                      process_at_ms, created_at_ms, enqueued_at_ms, updated_at_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?9)
ON CONFLICT (queue, message_id) WHERE message_id IS NOT NULL DO UPDATE SET
    delivery_id = excluded.delivery_id, payload = excluded.payload, headers = excluded.headers,
    priority = excluded.priority, status = excluded.status, process_at_ms = excluded.process_at_ms,
    enqueued_at_ms = excluded.enqueued_at_ms, updated_at_ms = excluded.updated_at_ms,
    attempts = 0, last_error = NULL, processed_at_ms = NULL, version = version + 1
RETURNING key, version";

const LEASE: &str = "
UPDATE messages
SET status = 'processing', attempts = attempts + 1, lease_token = lease_token + 1,
    lease_expires_at_ms = ?1, updated_at_ms = ?2
WHERE key IN (
    SELECT key FROM messages
    WHERE queue = ?3 AND status IN ('pending', 'sleeping') AND process_at_ms <= ?2
    ORDER BY priority DESC, process_at_ms, key
    LIMIT ?4)
RETURNING key, queue, message_id, delivery_id, payload, headers, priority, attempts,
          lease_token, enqueued_at_ms, process_at_ms";

const COMPLETE: &str = "
UPDATE messages SET status = 'processed', processed_at_ms = ?1, updated_at_ms = ?1,
                    lease_expires_at_ms = NULL
WHERE key = ?2 AND lease_token = ?3 AND status = 'processing'";

const RETRY: &str = "
UPDATE messages SET status = CASE WHEN ?2 <= ?1 THEN 'pending' ELSE 'sleeping' END,
                    process_at_ms = ?2, last_error = COALESCE(?3, last_error),
                    updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?4 AND lease_token = ?5 AND status = 'processing'";

const FAIL: &str = "
UPDATE messages SET status = 'failed', last_error = ?2, updated_at_ms = ?1,
                    lease_expires_at_ms = NULL
WHERE key = ?3 AND lease_token = ?4 AND status = 'processing'";

const RELEASE: &str = "
UPDATE messages SET status = 'pending', attempts = MAX(attempts - 1, 0), updated_at_ms = ?1,
                    lease_expires_at_ms = NULL
WHERE key = ?2 AND lease_token = ?3 AND status = 'processing'";

const EXPIRE: &str = "
UPDATE messages
SET status = CASE WHEN attempts >= ?3 THEN 'failed' ELSE 'pending' END,
    last_error = 'lease expired before the message was settled (attempt ' || attempts || ')',
    lease_expires_at_ms = NULL, updated_at_ms = ?1
WHERE queue = ?2 AND status = 'processing' AND lease_expires_at_ms <= ?1";

#[async_trait]
impl QueueStore for SqliteStore {
    async fn enqueue(&self, queue: &str, message: NewMessage) -> Result<Enqueued, QueueError> {
        let now = now_ms();
        let at = message.process_at_ms.unwrap_or(now);
        let status = if at > now {
            Status::Sleeping
        } else {
            Status::Pending
        };
        let row = sqlx::query(UPSERT)
            .bind(queue)
            .bind(&message.id)
            .bind(new_delivery_id())
            .bind(&message.payload)
            .bind(encode_headers(&message.headers))
            .bind(message.priority)
            .bind(status.as_str())
            .bind(at)
            .bind(now)
            .fetch_one(&self.pool)
            .await?;
        let version: i64 = row.try_get("version")?;
        Ok(Enqueued {
            key: row.try_get("key")?,
            status: if version == 1 {
                EnqueueStatus::Added
            } else {
                EnqueueStatus::Updated
            },
        })
    }

    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let now = now_ms();
        let rows = sqlx::query(LEASE)
            .bind(now + lease_ms)
            .bind(now)
            .bind(queue)
            .bind(max as i64)
            .fetch_all(&self.pool)
            .await?;
        let mut leased = Vec::with_capacity(rows.len());
        let mut order = Vec::with_capacity(rows.len());
        for row in &rows {
            order.push((
                -row.try_get::<i32, _>("priority")?,
                row.try_get::<i64, _>("process_at_ms")?,
                row.try_get::<i64, _>("key")?,
            ));
            leased.push(LeasedMessage {
                lease: Lease {
                    key: row.try_get("key")?,
                    token: row.try_get("lease_token")?,
                },
                queue: row.try_get("queue")?,
                id: row.try_get("message_id")?,
                delivery_id: row.try_get("delivery_id")?,
                payload: row.try_get("payload")?,
                priority: row.try_get("priority")?,
                attempt: row.try_get::<i64, _>("attempts")? as u32,
                enqueued_at_ms: row.try_get("enqueued_at_ms")?,
                headers: decode_headers(row.try_get("headers")?)?,
            });
        }
        // RETURNING does not keep the sub-select's order: restore lease order.
        let mut paired: Vec<_> = order.into_iter().zip(leased).collect();
        paired.sort_by_key(|p| p.0);
        Ok(paired.into_iter().map(|(_, m)| m).collect())
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let mut results = Vec::with_capacity(settlements.len());
        for s in settlements {
            let Lease { key, token } = s.lease;
            let query = match &s.disposition {
                Disposition::Complete => sqlx::query(COMPLETE).bind(now).bind(key).bind(token),
                Disposition::Retry { at_ms, error } => sqlx::query(RETRY)
                    .bind(now)
                    .bind(*at_ms)
                    .bind(error.clone())
                    .bind(key)
                    .bind(token),
                Disposition::Fail { error } => sqlx::query(FAIL)
                    .bind(now)
                    .bind(error.clone())
                    .bind(key)
                    .bind(token),
                Disposition::Release => sqlx::query(RELEASE).bind(now).bind(key).bind(token),
            };
            let done = query.execute(&mut *tx).await?;
            results.push(if done.rows_affected() == 1 {
                SettleResult::Applied
            } else {
                SettleResult::LeaseLost
            });
        }
        tx.commit().await?;
        Ok(results)
    }

    async fn expire_leases(&self, queue: &str, max_attempts: u32) -> Result<u64, QueueError> {
        let done = sqlx::query(EXPIRE)
            .bind(now_ms())
            .bind(queue)
            .bind(max_attempts as i64)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn get(&self, key: i64) -> Result<Option<StoredMessage>, QueueError> {
        let row = sqlx::query("SELECT * FROM messages WHERE key = ?1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored).transpose()
    }

    async fn list(&self, filter: &MessageFilter) -> Result<Vec<StoredMessage>, QueueError> {
        let rows = sqlx::query(
            "SELECT * FROM messages
             WHERE (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR status = ?2)
             ORDER BY key DESC LIMIT ?3",
        )
        .bind(&filter.queue)
        .bind(filter.status.as_ref().map(|s| s.as_str().to_string()))
        .bind(filter.limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored).collect()
    }

    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError> {
        let rows = sqlx::query(
            "SELECT status, COUNT(*) AS n FROM messages WHERE queue = ?1 GROUP BY status",
        )
        .bind(queue)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    Status::parse(r.try_get::<&str, _>("status")?),
                    r.try_get::<i64, _>("n")? as u64,
                ))
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), QueueError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

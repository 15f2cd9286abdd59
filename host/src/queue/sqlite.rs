//! [`QueueStore`] on embedded SQLite (WAL mode), the default store. SQLite serialises
//! writers, so every transaction here starts with a write and holds the lock it decides under;
//! identity is still enforced by the unique index on (queue, message_id).

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use super::{
    Disposition, EnqueueStatus, Enqueued, Existing, HistoryEntry, Lease, LeasedMessage,
    MessageFilter, NewMessage, NextVersion, Plan, QueueError, QueueStore, Retention, Selector,
    SettleResult, Settlement, Status, StoredMessage, canonical_hash, destination, new_delivery_id,
    now_ms, plan,
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

pub(crate) fn encode_headers(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn decode_headers(text: &str) -> Result<Vec<(String, String)>, QueueError> {
    serde_json::from_str(text).map_err(|e| QueueError::Corrupt {
        what: "headers",
        reason: e.to_string(),
    })
}

/// Read a full `messages` row (works for SQLite and PostgreSQL rows alike).
macro_rules! stored_from_row {
    ($row:expr) => {{
        let row = $row;
        let next = match row.try_get::<Option<String>, _>("next_payload")? {
            Some(payload) => Some(NextVersion {
                payload,
                priority: row.try_get::<Option<i32>, _>("next_priority")?.unwrap_or(0),
                process_at_ms: row
                    .try_get::<Option<i64>, _>("next_process_at_ms")?
                    .unwrap_or(0),
                status: row.try_get("next_status")?,
            }),
            None => None,
        };
        Ok::<_, QueueError>(StoredMessage {
            key: row.try_get("key")?,
            queue: row.try_get("queue")?,
            id: row.try_get("message_id")?,
            delivery_id: row.try_get("delivery_id")?,
            status: Status::parse(&row.try_get::<String, _>("status")?),
            payload: row.try_get("payload")?,
            headers: decode_headers(&row.try_get::<String, _>("headers")?)?,
            priority: row.try_get("priority")?,
            attempts: row.try_get::<i32, _>("attempts")? as u32,
            process_at_ms: row.try_get("process_at_ms")?,
            created_at_ms: row.try_get("created_at_ms")?,
            enqueued_at_ms: row.try_get("enqueued_at_ms")?,
            updated_at_ms: row.try_get("updated_at_ms")?,
            processed_at_ms: row.try_get("processed_at_ms")?,
            lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
            last_error: row.try_get("last_error")?,
            version: row.try_get("version")?,
            outcome: row.try_get("outcome")?,
            source_delivery_id: row.try_get("source_delivery_id")?,
            next,
        })
    }};
}

/// Read a `message_history` row (SQLite and PostgreSQL alike).
macro_rules! history_from_row {
    ($row:expr) => {{
        let row = $row;
        Ok::<_, QueueError>(HistoryEntry {
            queue: row.try_get("queue")?,
            id: row.try_get("message_id")?,
            message_key: row.try_get("message_key")?,
            version: row.try_get("version")?,
            delivery_id: row.try_get("delivery_id")?,
            payload: row.try_get("payload")?,
            headers: decode_headers(&row.try_get::<String, _>("headers")?)?,
            priority: row.try_get("priority")?,
            status: Status::parse(&row.try_get::<String, _>("status")?),
            attempts: row.try_get::<i32, _>("attempts")? as u32,
            last_error: row.try_get("last_error")?,
            enqueued_at_ms: row.try_get("enqueued_at_ms")?,
            processed_at_ms: row.try_get("processed_at_ms")?,
            recorded_at_ms: row.try_get("recorded_at_ms")?,
        })
    }};
}
pub(crate) use {history_from_row, stored_from_row};

fn stored(row: &SqliteRow) -> Result<StoredMessage, QueueError> {
    stored_from_row!(row)
}

const INSERT: &str = "
INSERT INTO messages (queue, message_id, delivery_id, payload, payload_hash, headers, priority, status,
                      process_at_ms, created_at_ms, enqueued_at_ms, updated_at_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?10)
ON CONFLICT (queue, message_id) WHERE message_id IS NOT NULL DO NOTHING
RETURNING key";

const DEFER: &str = "
UPDATE messages SET next_delivery_id = ?1, next_payload = ?2, next_payload_hash = ?3, next_headers = ?4,
    next_priority = ?5, next_process_at_ms = ?6, next_status = ?7, next_enqueued_at_ms = ?8,
    status = 'awaiting-release', version = version + 1, updated_at_ms = ?8
WHERE key = ?9";

/// Copy the live version of the selected rows into history, with `status` (?2) when given.
const RECORD_HISTORY: &str = "
INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers, priority,
                             status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
SELECT queue, message_id, key, version, delivery_id, payload, headers, priority,
       COALESCE(?2, status), attempts, COALESCE(?3, last_error), enqueued_at_ms,
       CASE WHEN ?2 = 'processed' THEN ?1 ELSE processed_at_ms END, ?1
FROM messages WHERE key = ?4 AND message_id IS NOT NULL AND (?5 IS NULL OR lease_token = ?5)
  AND (?6 IS NULL OR status = ?6)";

const REPLACE: &str = "
UPDATE messages SET delivery_id = ?1, payload = ?2, payload_hash = ?3, headers = ?4, priority = ?5,
    status = ?6, process_at_ms = ?7, enqueued_at_ms = ?8, updated_at_ms = ?8, attempts = 0, last_error = NULL,
    processed_at_ms = NULL, lease_expires_at_ms = NULL, version = version + 1,
    source_delivery_id = NULL, outcome = NULL
WHERE key = ?9";

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
          lease_token, enqueued_at_ms, process_at_ms, source_delivery_id";

const COMPLETE: &str = "
UPDATE messages SET status = 'processed', processed_at_ms = ?1, updated_at_ms = ?1, lease_expires_at_ms = NULL,
                    outcome = ?4
WHERE key = ?2 AND lease_token = ?3 AND status = 'processing'";

const DELETE_LEASED: &str =
    "DELETE FROM messages WHERE key = ?1 AND lease_token = ?2 AND status = 'processing'";

const RETRY: &str = "
UPDATE messages SET status = CASE WHEN ?2 <= ?1 THEN 'pending' ELSE 'sleeping' END,
                    process_at_ms = ?2, last_error = COALESCE(?3, last_error),
                    updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?4 AND lease_token = ?5 AND status = 'processing'";

const FAIL: &str = "
UPDATE messages SET status = 'failed', last_error = ?2, updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?3 AND lease_token = ?4 AND status = 'processing'";

const RELEASE: &str = "
UPDATE messages SET status = 'pending', attempts = MAX(attempts - 1, 0), updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?2 AND lease_token = ?3 AND status = 'processing'";

/// The version waiting for release becomes the live one; ?2 forces a status (abandonment
/// without retry), ?3 sets the last error. Rows: ?4 = key and ?5 = token, or every expired
/// row of queue ?6.
const APPLY_NEXT: &str = "
UPDATE messages SET delivery_id = next_delivery_id, payload = next_payload, payload_hash = next_payload_hash,
    headers = next_headers, priority = next_priority, process_at_ms = next_process_at_ms,
    enqueued_at_ms = next_enqueued_at_ms,
    status = COALESCE(?2, next_status, CASE WHEN next_process_at_ms > ?1 THEN 'sleeping' ELSE 'pending' END),
    attempts = 0, last_error = ?3, processed_at_ms = NULL, lease_expires_at_ms = NULL, updated_at_ms = ?1,
    next_delivery_id = NULL, next_payload = NULL, next_payload_hash = NULL, next_headers = NULL,
    next_priority = NULL, next_process_at_ms = NULL, next_status = NULL, next_enqueued_at_ms = NULL,
    source_delivery_id = NULL, outcome = NULL
WHERE status = 'awaiting-release'
  AND ((?4 IS NOT NULL AND key = ?4 AND lease_token = ?5)
       OR (?6 IS NOT NULL AND queue = ?6 AND lease_expires_at_ms <= ?1))";

const EXPIRE: &str = "
UPDATE messages
SET status = CASE WHEN ?4 = 0 OR attempts >= ?3 THEN 'failed' ELSE 'pending' END,
    last_error = 'lease expired before the message was settled (attempt ' || attempts || ')',
    lease_expires_at_ms = NULL, updated_at_ms = ?1
WHERE queue = ?2 AND status = 'processing' AND lease_expires_at_ms <= ?1";

const ABANDONED: &str = "lease expired before the message was settled; retry_abandoned = false";

impl SqliteStore {
    async fn settle_one(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        s: &Settlement,
        now: i64,
    ) -> Result<bool, QueueError> {
        let Lease { key, token } = s.lease;
        let fast = match &s.disposition {
            Disposition::Complete if s.keep_processed => sqlx::query(COMPLETE)
                .bind(now)
                .bind(key)
                .bind(token)
                .bind(s.outcome.clone()),
            Disposition::Complete => {
                sqlx::query(RECORD_HISTORY)
                    .bind(now)
                    .bind("processed")
                    .bind(None::<String>)
                    .bind(key)
                    .bind(token)
                    .bind("processing")
                    .execute(&mut **tx)
                    .await?;
                sqlx::query(DELETE_LEASED).bind(key).bind(token)
            }
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
        if fast.execute(&mut **tx).await?.rows_affected() == 1 {
            return Ok(true);
        }
        // Re-enqueued while leased: record what this processor did, then the newer version
        // takes over (the older outcome never overwrites it).
        let outcome = match &s.disposition {
            Disposition::Complete => Some(("processed", None)),
            Disposition::Fail { error } => Some(("failed", Some(error.clone()))),
            _ => None,
        };
        if let Some((status, error)) = outcome {
            sqlx::query(RECORD_HISTORY)
                .bind(now)
                .bind(status)
                .bind(error)
                .bind(key)
                .bind(token)
                .bind("awaiting-release")
                .execute(&mut **tx)
                .await?;
        }
        let applied = sqlx::query(APPLY_NEXT)
            .bind(now)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(key)
            .bind(token)
            .bind(None::<String>)
            .execute(&mut **tx)
            .await?;
        Ok(applied.rows_affected() == 1)
    }
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn enqueue(
        &self,
        queue: &str,
        message: NewMessage,
        idempotent: bool,
    ) -> Result<Enqueued, QueueError> {
        let now = now_ms();
        let at = message.process_at_ms.unwrap_or(now);
        let status = destination(message.status.as_ref(), at, now);
        let hash = canonical_hash(&message.payload);
        let headers = encode_headers(&message.headers);
        let delivery_id = new_delivery_id();
        if message.id.is_none() {
            // Nothing to collide with: one statement, no transaction.
            let key: i64 = sqlx::query_scalar(INSERT)
                .bind(queue)
                .bind(None::<String>)
                .bind(&delivery_id)
                .bind(&message.payload)
                .bind(&hash)
                .bind(&headers)
                .bind(message.priority)
                .bind(status.as_str())
                .bind(at)
                .bind(now)
                .fetch_one(&self.pool)
                .await?;
            return Ok(Enqueued {
                key,
                status: EnqueueStatus::Added,
            });
        }
        let mut tx = self.pool.begin().await?;
        let inserted: Option<i64> = sqlx::query_scalar(INSERT)
            .bind(queue)
            .bind(&message.id)
            .bind(&delivery_id)
            .bind(&message.payload)
            .bind(&hash)
            .bind(&headers)
            .bind(message.priority)
            .bind(status.as_str())
            .bind(at)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(key) = inserted {
            tx.commit().await?;
            return Ok(Enqueued {
                key,
                status: EnqueueStatus::Added,
            });
        }
        let row = sqlx::query("SELECT key, status, payload_hash, next_payload_hash FROM messages WHERE queue = ?1 AND message_id = ?2")
            .bind(queue)
            .bind(&message.id)
            .fetch_one(&mut *tx)
            .await?;
        let key: i64 = row.try_get("key")?;
        let existing = Existing {
            status: Status::parse(row.try_get::<&str, _>("status")?),
            payload_hash: row.try_get("payload_hash")?,
            next_payload_hash: row.try_get("next_payload_hash")?,
        };
        let custom = message.status.as_ref().map(|s| s.as_str().to_string());
        let result = match plan(&existing, &hash, idempotent) {
            Plan::Discard => EnqueueStatus::Discarded,
            Plan::Defer => {
                sqlx::query(DEFER)
                    .bind(&delivery_id)
                    .bind(&message.payload)
                    .bind(&hash)
                    .bind(&headers)
                    .bind(message.priority)
                    .bind(at)
                    .bind(custom)
                    .bind(now)
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
                EnqueueStatus::Updated
            }
            Plan::Replace => {
                sqlx::query(RECORD_HISTORY)
                    .bind(now)
                    .bind(None::<String>)
                    .bind(None::<String>)
                    .bind(key)
                    .bind(None::<i64>)
                    .bind(None::<String>)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(REPLACE)
                    .bind(&delivery_id)
                    .bind(&message.payload)
                    .bind(&hash)
                    .bind(&headers)
                    .bind(message.priority)
                    .bind(status.as_str())
                    .bind(at)
                    .bind(now)
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
                EnqueueStatus::Updated
            }
        };
        tx.commit().await?;
        Ok(Enqueued {
            key,
            status: result,
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
        for row in &rows {
            let order = (
                -row.try_get::<i32, _>("priority")?,
                row.try_get::<i64, _>("process_at_ms")?,
                row.try_get::<i64, _>("key")?,
            );
            leased.push((
                order,
                LeasedMessage {
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
                    source_delivery_id: row.try_get("source_delivery_id")?,
                },
            ));
        }
        // RETURNING does not keep the sub-select's order: restore lease order.
        leased.sort_by_key(|(order, _)| *order);
        Ok(leased.into_iter().map(|(_, m)| m).collect())
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let mut results = Vec::with_capacity(settlements.len());
        for s in settlements {
            let applied = self.settle_one(&mut tx, s, now).await?;
            results.push(if applied {
                SettleResult::Applied
            } else {
                SettleResult::LeaseLost
            });
        }
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
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        // Start with a write so the transaction holds the lock it decides under.
        let pruned = sqlx::query(
            "DELETE FROM message_history WHERE history_key IN (
                 SELECT history_key FROM (
                     SELECT history_key, ROW_NUMBER() OVER (PARTITION BY message_id ORDER BY history_key DESC) AS rn
                     FROM message_history WHERE queue = ?1)
                 WHERE rn > ?2 LIMIT ?3)",
        )
        .bind(queue)
        .bind(retention.history_versions as i64)
        .bind(batch as i64)
        .execute(&mut *tx)
        .await?;
        let mut keys: Vec<i64> = Vec::new();
        if let Some(age) = retention.max_age_ms {
            keys = sqlx::query_scalar(
                "SELECT key FROM messages WHERE queue = ?1 AND status = 'processed' AND processed_at_ms < ?2 LIMIT ?3",
            )
            .bind(queue)
            .bind(now - age)
            .bind(batch as i64)
            .fetch_all(&mut *tx)
            .await?;
        }
        if let Some(count) = retention.max_count
            && (keys.len() as u32) < batch
        {
            let extra: Vec<i64> = sqlx::query_scalar(
                "SELECT key FROM (SELECT key FROM messages WHERE queue = ?1 AND status = 'processed'
                                  ORDER BY processed_at_ms DESC, key DESC LIMIT -1 OFFSET ?2)
                 LIMIT ?3",
            )
            .bind(queue)
            .bind(count as i64)
            .bind((batch as usize - keys.len()) as i64)
            .fetch_all(&mut *tx)
            .await?;
            keys.extend(extra);
            keys.sort_unstable();
            keys.dedup();
        }
        if !keys.is_empty() {
            let list = serde_json::to_string(&keys).expect("keys serialize");
            sqlx::query(
                "INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers,
                     priority, status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
                 SELECT queue, message_id, key, version, delivery_id, payload, headers, priority, status, attempts,
                        last_error, enqueued_at_ms, processed_at_ms, ?2
                 FROM messages WHERE key IN (SELECT value FROM json_each(?1)) AND message_id IS NOT NULL",
            )
            .bind(&list)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM messages WHERE key IN (SELECT value FROM json_each(?1))")
                .bind(&list)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        let _ = pruned;
        Ok(keys.len() as u64)
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

    async fn history(&self, queue: &str, id: &str) -> Result<Vec<HistoryEntry>, QueueError> {
        let rows = sqlx::query("SELECT * FROM message_history WHERE queue = ?1 AND message_id = ?2 ORDER BY history_key")
            .bind(queue)
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| history_from_row!(r)).collect()
    }

    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM messages WHERE queue = ?1 GROUP BY status ORDER BY status")
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

    async fn retry(&self, selector: &Selector) -> Result<u64, QueueError> {
        let (key, queue, status) = match selector {
            Selector::Key(key) => (Some(*key), None, None),
            Selector::QueueStatus { queue, status } => {
                (None, Some(queue.as_str()), Some(status.as_str()))
            }
        };
        let done = sqlx::query(
            "UPDATE messages SET status = 'pending', process_at_ms = ?1, attempts = 0, updated_at_ms = ?1,
                 source_delivery_id = COALESCE(source_delivery_id, delivery_id),
                 delivery_id = lower(hex(randomblob(16))), processed_at_ms = NULL, outcome = NULL
             WHERE status NOT IN ('processing', 'awaiting-release')
               AND (?2 IS NULL OR key = ?2) AND (?3 IS NULL OR (queue = ?3 AND status = ?4))",
        )
        .bind(now_ms())
        .bind(key)
        .bind(queue)
        .bind(status)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn move_to(&self, key: i64, status: &Status) -> Result<bool, QueueError> {
        let done = sqlx::query(
            "UPDATE messages SET status = ?1, updated_at_ms = ?2,
                 process_at_ms = CASE WHEN ?1 = 'pending' THEN ?2 ELSE process_at_ms END
             WHERE key = ?3 AND status NOT IN ('processing', 'awaiting-release')",
        )
        .bind(status.as_str())
        .bind(now_ms())
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete(&self, key: i64) -> Result<bool, QueueError> {
        let done = sqlx::query("DELETE FROM messages WHERE key = ?1 AND status NOT IN ('processing', 'awaiting-release')")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn ping(&self) -> Result<(), QueueError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

//! [`QueueStore`] on PostgreSQL, for production and for several hosts sharing queues.
//! Leases take ready rows with `FOR UPDATE SKIP LOCKED` in batches, completions are applied
//! in one statement per batch, and enqueues `NOTIFY wharf_ready` (throttled, see
//! [`super::notify`]), so processors in every process wake on enqueue instead of polling.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, Row, Transaction};
use tokio_util::sync::CancellationToken;

use super::sqlite::{decode_headers, encode_headers, history_from_row, stored_from_row};
use super::{
    Disposition, EnqueueStatus, Enqueued, Existing, HistoryEntry, Lease, LeasedMessage,
    MessageFilter, NewMessage, NextVersion, Plan, QueueError, QueueStore, Retention, Selector,
    SettleResult, Settlement, Status, StoredMessage, WakeFn, canonical_hash, destination,
    new_delivery_id, now_ms, plan,
};

use super::notify::{Notifier, READY_CHANNEL};

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
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {quoted}"
            )))
            .execute(&bootstrap)
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

const INSERT: &str = "
INSERT INTO messages (queue, message_id, delivery_id, payload, payload_hash, headers, priority, status,
                      process_at_ms, created_at_ms, enqueued_at_ms, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $10)
ON CONFLICT (queue, message_id) WHERE message_id IS NOT NULL DO NOTHING
RETURNING key";

const DEFER: &str = "
UPDATE messages SET next_delivery_id = $1, next_payload = $2, next_payload_hash = $3, next_headers = $4,
    next_priority = $5, next_process_at_ms = $6, next_status = $7, next_enqueued_at_ms = $8,
    status = 'awaiting-release', version = version + 1, updated_at_ms = $8
WHERE key = $9";

const RECORD_HISTORY: &str = "
INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers, priority,
                             status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
SELECT queue, message_id, key, version, delivery_id, payload, headers, priority,
       COALESCE($2::text, status), attempts, COALESCE($3::text, last_error), enqueued_at_ms,
       CASE WHEN $2::text = 'processed' THEN $1 ELSE processed_at_ms END, $1
FROM messages WHERE key = $4 AND message_id IS NOT NULL AND ($5::bigint IS NULL OR lease_token = $5)
  AND ($6::text IS NULL OR status = $6)";

const REPLACE: &str = "
UPDATE messages SET delivery_id = $1, payload = $2, payload_hash = $3, headers = $4, priority = $5,
    status = $6, process_at_ms = $7, enqueued_at_ms = $8, updated_at_ms = $8, attempts = 0, last_error = NULL,
    processed_at_ms = NULL, lease_expires_at_ms = NULL, version = version + 1,
    source_delivery_id = NULL, outcome = NULL
WHERE key = $9";

const LEASE: &str = "
UPDATE messages m
SET status = 'processing', attempts = m.attempts + 1, lease_token = m.lease_token + 1,
    lease_expires_at_ms = $1, updated_at_ms = $2
FROM (SELECT key FROM messages
      WHERE queue = $3 AND status IN ('pending', 'sleeping') AND process_at_ms <= $2
      ORDER BY priority DESC, process_at_ms, key
      LIMIT $4
      FOR UPDATE SKIP LOCKED) ready
WHERE m.key = ready.key
RETURNING m.key, m.queue, m.message_id, m.delivery_id, m.payload, m.headers, m.priority, m.attempts,
          m.lease_token, m.enqueued_at_ms, m.process_at_ms, m.source_delivery_id";

const COMPLETE_MANY: &str = "
UPDATE messages m SET status = 'processed', processed_at_ms = $1, updated_at_ms = $1, lease_expires_at_ms = NULL,
                      outcome = done.outcome
FROM UNNEST($2::bigint[], $3::bigint[], $4::text[]) AS done(key, token, outcome)
WHERE m.key = done.key AND m.lease_token = done.token AND m.status = 'processing'
RETURNING m.key";

const DELETE_LEASED: &str =
    "DELETE FROM messages WHERE key = $1 AND lease_token = $2 AND status = 'processing'";

const RETRY: &str = "
UPDATE messages SET status = CASE WHEN $2 <= $1 THEN 'pending' ELSE 'sleeping' END,
                    process_at_ms = $2, last_error = COALESCE($3, last_error),
                    updated_at_ms = $1, lease_expires_at_ms = NULL
WHERE key = $4 AND lease_token = $5 AND status = 'processing'";

const FAIL: &str = "
UPDATE messages SET status = 'failed', last_error = $2, updated_at_ms = $1, lease_expires_at_ms = NULL
WHERE key = $3 AND lease_token = $4 AND status = 'processing'";

const RELEASE: &str = "
UPDATE messages SET status = 'pending', attempts = GREATEST(attempts - 1, 0), updated_at_ms = $1,
                    lease_expires_at_ms = NULL
WHERE key = $2 AND lease_token = $3 AND status = 'processing'";

const APPLY_NEXT: &str = "
UPDATE messages SET delivery_id = next_delivery_id, payload = next_payload, payload_hash = next_payload_hash,
    headers = next_headers, priority = next_priority, process_at_ms = next_process_at_ms,
    enqueued_at_ms = next_enqueued_at_ms,
    status = COALESCE($2::text, next_status, CASE WHEN next_process_at_ms > $1 THEN 'sleeping' ELSE 'pending' END),
    attempts = 0, last_error = $3::text, processed_at_ms = NULL, lease_expires_at_ms = NULL, updated_at_ms = $1,
    next_delivery_id = NULL, next_payload = NULL, next_payload_hash = NULL, next_headers = NULL,
    next_priority = NULL, next_process_at_ms = NULL, next_status = NULL, next_enqueued_at_ms = NULL,
    source_delivery_id = NULL, outcome = NULL
WHERE status = 'awaiting-release'
  AND (($4::bigint IS NOT NULL AND key = $4 AND lease_token = $5::bigint)
       OR ($6::text IS NOT NULL AND queue = $6 AND lease_expires_at_ms <= $1))";

const EXPIRE: &str = "
UPDATE messages
SET status = CASE WHEN NOT $4 OR attempts >= $3 THEN 'failed' ELSE 'pending' END,
    last_error = 'lease expired before the message was settled (attempt ' || attempts || ')',
    lease_expires_at_ms = NULL, updated_at_ms = $1
WHERE queue = $2 AND status = 'processing' AND lease_expires_at_ms <= $1";

const ABANDONED: &str = "lease expired before the message was settled; retry_abandoned = false";

impl PostgresStore {
    async fn settle_one(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        s: &Settlement,
        now: i64,
    ) -> Result<bool, QueueError> {
        let Lease { key, token } = s.lease;
        let fast = match &s.disposition {
            Disposition::Complete if s.keep_processed => None,
            Disposition::Complete => {
                record_history(
                    tx,
                    now,
                    Some("processed"),
                    None,
                    key,
                    Some(token),
                    Some("processing"),
                )
                .await?;
                Some(sqlx::query(DELETE_LEASED).bind(key).bind(token))
            }
            Disposition::Retry { at_ms, error } => Some(
                sqlx::query(RETRY)
                    .bind(now)
                    .bind(*at_ms)
                    .bind(error.clone())
                    .bind(key)
                    .bind(token),
            ),
            Disposition::Fail { error } => Some(
                sqlx::query(FAIL)
                    .bind(now)
                    .bind(error.clone())
                    .bind(key)
                    .bind(token),
            ),
            Disposition::Release => Some(sqlx::query(RELEASE).bind(now).bind(key).bind(token)),
        };
        if let Some(fast) = fast
            && fast.execute(&mut **tx).await?.rows_affected() == 1
        {
            return Ok(true);
        }
        let outcome = match &s.disposition {
            Disposition::Complete => Some(("processed", None)),
            Disposition::Fail { error } => Some(("failed", Some(error.as_str()))),
            _ => None,
        };
        if let Some((status, error)) = outcome {
            record_history(
                tx,
                now,
                Some(status),
                error,
                key,
                Some(token),
                Some("awaiting-release"),
            )
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

async fn record_history(
    tx: &mut Transaction<'_, Postgres>,
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
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl PostgresStore {
    /// Apply an enqueue; also returns the status the message is in afterwards when it is
    /// now ready to lease (pending), for the wake-up notification.
    async fn enqueue_row(
        &self,
        queue: &str,
        message: NewMessage,
        idempotent: bool,
    ) -> Result<(Enqueued, Status), QueueError> {
        let now = now_ms();
        let at = message.process_at_ms.unwrap_or(now);
        let status = destination(message.status.as_ref(), at, now);
        let hash = canonical_hash(&message.payload);
        let headers = encode_headers(&message.headers);
        let delivery_id = new_delivery_id();
        let custom = message.status.as_ref().map(|s| s.as_str().to_string());
        // The insert relies on the unique index; on conflict the existing row is locked and
        // updated. A row deleted in between (retention) is retried as an insert.
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
            return Ok((
                Enqueued {
                    key,
                    status: EnqueueStatus::Added,
                },
                status,
            ));
        }
        for _ in 0..3 {
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
                return Ok((
                    Enqueued {
                        key,
                        status: EnqueueStatus::Added,
                    },
                    status,
                ));
            }
            let Some(row) = sqlx::query(
                "SELECT key, status, payload_hash, next_payload_hash FROM messages
                 WHERE queue = $1 AND message_id = $2 FOR UPDATE",
            )
            .bind(queue)
            .bind(&message.id)
            .fetch_optional(&mut *tx)
            .await?
            else {
                continue;
            };
            let key: i64 = row.try_get("key")?;
            let existing = Existing {
                status: Status::parse(row.try_get::<&str, _>("status")?),
                payload_hash: row.try_get("payload_hash")?,
                next_payload_hash: row.try_get("next_payload_hash")?,
            };
            let decision = plan(&existing, &hash, idempotent);
            let result = match decision {
                Plan::Discard => EnqueueStatus::Discarded,
                Plan::Defer => {
                    sqlx::query(DEFER)
                        .bind(&delivery_id)
                        .bind(&message.payload)
                        .bind(&hash)
                        .bind(&headers)
                        .bind(message.priority)
                        .bind(at)
                        .bind(custom.clone())
                        .bind(now)
                        .bind(key)
                        .execute(&mut *tx)
                        .await?;
                    EnqueueStatus::Updated
                }
                Plan::Replace => {
                    record_history(&mut tx, now, None, None, key, None, None).await?;
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
            // Only a replaced message became ready; a deferred or discarded one did not.
            let after = match decision {
                Plan::Replace => status.clone(),
                _ => Status::AwaitingRelease,
            };
            return Ok((
                Enqueued {
                    key,
                    status: result,
                },
                after,
            ));
        }
        Err(QueueError::Conflict(format!(
            "message `{}` in queue `{queue}` kept changing; try again",
            message.id.unwrap_or_default()
        )))
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
        let (done, status) = self.enqueue_row(queue, message, idempotent).await?;
        if status == Status::Pending {
            self.notifier.ready(&self.pool, queue).await;
        }
        Ok(done)
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
            .fetch_all(&self.lease_pool)
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
                    attempt: row.try_get::<i32, _>("attempts")? as u32,
                    enqueued_at_ms: row.try_get("enqueued_at_ms")?,
                    headers: decode_headers(row.try_get("headers")?)?,
                    source_delivery_id: row.try_get("source_delivery_id")?,
                },
            ));
        }
        leased.sort_by_key(|(order, _)| *order);
        Ok(leased.into_iter().map(|(_, m)| m).collect())
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<SettleResult>, QueueError> {
        let now = now_ms();
        let mut tx = self.settle_pool.begin().await?;
        // The common case, completions that keep the message, in one statement.
        let completes: Vec<&Settlement> = settlements
            .iter()
            .filter(|s| s.disposition == Disposition::Complete && s.keep_processed)
            .collect();
        let keys: Vec<i64> = completes.iter().map(|s| s.lease.key).collect();
        let tokens: Vec<i64> = completes.iter().map(|s| s.lease.token).collect();
        let outcomes: Vec<Option<String>> = completes.iter().map(|s| s.outcome.clone()).collect();
        let completed: std::collections::HashSet<i64> = if keys.is_empty() {
            Default::default()
        } else {
            sqlx::query_scalar::<_, i64>(COMPLETE_MANY)
                .bind(now)
                .bind(&keys)
                .bind(&tokens)
                .bind(&outcomes)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect()
        };
        let mut results = Vec::with_capacity(settlements.len());
        for s in settlements {
            let applied =
                completed.contains(&s.lease.key) || self.settle_one(&mut tx, s, now).await?;
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
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "DELETE FROM message_history WHERE history_key IN (
                 SELECT history_key FROM (
                     SELECT history_key, ROW_NUMBER() OVER (PARTITION BY message_id ORDER BY history_key DESC) AS rn
                     FROM message_history WHERE queue = $1) ranked
                 WHERE rn > $2 LIMIT $3)",
        )
        .bind(queue)
        .bind(retention.history_versions as i64)
        .bind(batch as i64)
        .execute(&mut *tx)
        .await?;
        let mut keys: Vec<i64> = Vec::new();
        if let Some(age) = retention.max_age_ms {
            keys = sqlx::query_scalar(
                "SELECT key FROM messages WHERE queue = $1 AND status = 'processed' AND processed_at_ms < $2
                 LIMIT $3 FOR UPDATE SKIP LOCKED",
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
                "SELECT key FROM (SELECT key FROM messages WHERE queue = $1 AND status = 'processed'
                                  ORDER BY processed_at_ms DESC, key DESC OFFSET $2) old
                 LIMIT $3",
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
            sqlx::query(
                "INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers,
                     priority, status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
                 SELECT queue, message_id, key, version, delivery_id, payload, headers, priority, status, attempts,
                        last_error, enqueued_at_ms, processed_at_ms, $2
                 FROM messages WHERE key = ANY($1) AND message_id IS NOT NULL AND status = 'processed'",
            )
            .bind(&keys)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM messages WHERE key = ANY($1) AND status = 'processed'")
                .bind(&keys)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(keys.len() as u64)
    }

    async fn get(&self, key: i64) -> Result<Option<StoredMessage>, QueueError> {
        let row = sqlx::query("SELECT * FROM messages WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored).transpose()
    }

    async fn list(&self, filter: &MessageFilter) -> Result<Vec<StoredMessage>, QueueError> {
        let rows = sqlx::query(
            "SELECT * FROM messages
             WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR status = $2)
             ORDER BY key DESC LIMIT $3",
        )
        .bind(&filter.queue)
        .bind(filter.status.as_ref().map(|s| s.as_str().to_string()))
        .bind(filter.limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored).collect()
    }

    async fn history(&self, queue: &str, id: &str) -> Result<Vec<HistoryEntry>, QueueError> {
        let rows = sqlx::query("SELECT * FROM message_history WHERE queue = $1 AND message_id = $2 ORDER BY history_key")
            .bind(queue)
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| history_from_row!(r)).collect()
    }

    async fn counts(&self, queue: &str) -> Result<Vec<(Status, u64)>, QueueError> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM messages WHERE queue = $1 GROUP BY status ORDER BY status")
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
            "UPDATE messages SET status = 'pending', process_at_ms = $1, attempts = 0, updated_at_ms = $1,
                 source_delivery_id = COALESCE(source_delivery_id, delivery_id),
                 delivery_id = replace(gen_random_uuid()::text, '-', ''), processed_at_ms = NULL, outcome = NULL
             WHERE status NOT IN ('processing', 'awaiting-release')
               AND ($2::bigint IS NULL OR key = $2) AND ($3::text IS NULL OR (queue = $3 AND status = $4::text))",
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
            "UPDATE messages SET status = $1, updated_at_ms = $2,
                 process_at_ms = CASE WHEN $1 = 'pending' THEN $2 ELSE process_at_ms END
             WHERE key = $3 AND status NOT IN ('processing', 'awaiting-release')",
        )
        .bind(status.as_str())
        .bind(now_ms())
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete(&self, key: i64) -> Result<bool, QueueError> {
        let done = sqlx::query("DELETE FROM messages WHERE key = $1 AND status NOT IN ('processing', 'awaiting-release')")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
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
        Some(tokio::spawn(listen_for_ready(pool, wake, shutdown)))
    }
}

/// Forward `wharf_ready` notifications to `wake` until shutdown, reconnecting after
/// connection loss (logged once per outage).
async fn listen_for_ready(pool: PgPool, wake: WakeFn, shutdown: CancellationToken) {
    let mut failing = false;
    while !shutdown.is_cancelled() {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(READY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(l) => l,
            Err(e) => {
                if !failing {
                    tracing::error!(
                        "cannot listen for enqueue notifications (falling back to polling, retrying): {e}"
                    );
                    failing = true;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        if std::mem::take(&mut failing) {
            tracing::info!("listening for enqueue notifications again");
        }
        // Notifications may have been missed while disconnected: wake everyone once.
        wake(None);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                received = listener.try_recv() => match received {
                    Ok(Some(note)) => wake(Some(note.payload())),
                    Ok(None) => { wake(None); }
                    Err(e) => {
                        tracing::error!("enqueue notifications interrupted, reconnecting: {e}");
                        failing = true;
                        break;
                    }
                }
            }
        }
    }
}

//! Host-side delivery counting for brokers that only flag a redelivery (RabbitMQ classic
//! queues: redeliveries are counted) or tell nothing (every delivery is counted): in the
//! `external_attempts` table of the `[storage]` database, keyed by queue and MessageId (or
//! the body's SHA-256 when it has none), so a message that keeps coming back — even across
//! host restarts — ends failed after `max_attempts`. The row is removed when the message is
//! settled; a message the host hands back itself is forgiven one count.

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use sqlx::{PgPool, SqlitePool};

use super::SqlActivations;
use crate::queue::now_ms;

/// Durable redelivery counts of external messages.
#[async_trait]
pub trait AttemptCounter: Send + Sync + 'static {
    /// Count one more (re)delivery of each of `keys` in `queue`; returns each key's count so
    /// far, this one included.
    async fn redelivered(&self, queue: &str, keys: &[String]) -> Result<Vec<u32>, sqlx::Error>;
    /// Forget `keys` (their messages were settled).
    async fn forget(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error>;
    /// The next redelivery of each of `keys` is not an attempt (the host handed the message
    /// back itself, at shutdown).
    async fn forgive(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error>;
    /// Delete counts untouched since `before_ms` (messages settled elsewhere, or gone).
    /// Returns how many.
    async fn purge(&self, before_ms: i64) -> Result<u64, sqlx::Error>;
}

/// Delete counts untouched for `max_age`, every `interval`, until `shutdown`.
pub async fn run_purge(
    counter: std::sync::Arc<dyn AttemptCounter>,
    max_age: std::time::Duration,
    interval: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match counter.purge(now_ms() - max_age.as_millis() as i64).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "deleted stale delivery counts"),
            Err(e) => tracing::debug!("deleting stale delivery counts failed: {e}"),
        }
    }
}

/// The key a message is counted under: its MessageId, or the SHA-256 of its body.
pub fn attempt_key(message_id: Option<&str>, body: &[u8]) -> String {
    match message_id {
        Some(id) => format!("id:{id}"),
        None => format!("sha256:{}", hex::encode(Sha256::digest(body))),
    }
}

/// The `external_attempts` table, on the activation store's connections.
pub enum SqlAttempts {
    /// SQLite.
    Sqlite(SqlitePool),
    /// PostgreSQL.
    Postgres(PgPool),
}

impl SqlAttempts {
    /// The counter in the same database as `activations`.
    pub fn beside(activations: &SqlActivations) -> Self {
        match activations {
            SqlActivations::Sqlite(pool) => SqlAttempts::Sqlite(pool.clone()),
            SqlActivations::Postgres(pool) => SqlAttempts::Postgres(pool.clone()),
        }
    }
}

#[async_trait]
impl AttemptCounter for SqlAttempts {
    async fn redelivered(&self, queue: &str, keys: &[String]) -> Result<Vec<u32>, sqlx::Error> {
        let now = now_ms();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let n: i64 = match self {
                SqlAttempts::Sqlite(pool) => {
                    sqlx::query_scalar(
                        "INSERT INTO external_attempts (queue, message_key, redeliveries, updated_at_ms)
                         VALUES (?1, ?2, 1, ?3)
                         ON CONFLICT (queue, message_key) DO UPDATE
                         SET redeliveries = redeliveries + 1, updated_at_ms = ?3
                         RETURNING redeliveries",
                    )
                    .bind(queue)
                    .bind(key)
                    .bind(now)
                    .fetch_one(pool)
                    .await?
                }
                SqlAttempts::Postgres(pool) => {
                    let n: i32 = sqlx::query_scalar(
                        "INSERT INTO external_attempts (queue, message_key, redeliveries, updated_at_ms)
                         VALUES ($1, $2, 1, $3)
                         ON CONFLICT (queue, message_key) DO UPDATE
                         SET redeliveries = external_attempts.redeliveries + 1, updated_at_ms = $3
                         RETURNING redeliveries",
                    )
                    .bind(queue)
                    .bind(key)
                    .bind(now)
                    .fetch_one(pool)
                    .await?;
                    i64::from(n)
                }
            };
            out.push(n.max(0) as u32);
        }
        Ok(out)
    }

    async fn forgive(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error> {
        let now = now_ms();
        for key in keys {
            match self {
                SqlAttempts::Sqlite(pool) => {
                    sqlx::query(
                        "INSERT INTO external_attempts (queue, message_key, redeliveries, updated_at_ms)
                         VALUES (?1, ?2, -1, ?3)
                         ON CONFLICT (queue, message_key) DO UPDATE
                         SET redeliveries = redeliveries - 1, updated_at_ms = ?3",
                    )
                    .bind(queue)
                    .bind(key)
                    .bind(now)
                    .execute(pool)
                    .await?;
                }
                SqlAttempts::Postgres(pool) => {
                    sqlx::query(
                        "INSERT INTO external_attempts (queue, message_key, redeliveries, updated_at_ms)
                         VALUES ($1, $2, -1, $3)
                         ON CONFLICT (queue, message_key) DO UPDATE
                         SET redeliveries = external_attempts.redeliveries - 1, updated_at_ms = $3",
                    )
                    .bind(queue)
                    .bind(key)
                    .bind(now)
                    .execute(pool)
                    .await?;
                }
            }
        }
        Ok(())
    }

    async fn purge(&self, before_ms: i64) -> Result<u64, sqlx::Error> {
        let done = match self {
            SqlAttempts::Sqlite(pool) => {
                sqlx::query("DELETE FROM external_attempts WHERE updated_at_ms < ?1")
                    .bind(before_ms)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
            SqlAttempts::Postgres(pool) => {
                sqlx::query("DELETE FROM external_attempts WHERE updated_at_ms < $1")
                    .bind(before_ms)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
        };
        Ok(done)
    }

    async fn forget(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error> {
        for key in keys {
            match self {
                SqlAttempts::Sqlite(pool) => {
                    sqlx::query(
                        "DELETE FROM external_attempts WHERE queue = ?1 AND message_key = ?2",
                    )
                    .bind(queue)
                    .bind(key)
                    .execute(pool)
                    .await?;
                }
                SqlAttempts::Postgres(pool) => {
                    sqlx::query(
                        "DELETE FROM external_attempts WHERE queue = $1 AND message_key = $2",
                    )
                    .bind(queue)
                    .bind(key)
                    .execute(pool)
                    .await?;
                }
            }
        }
        Ok(())
    }
}

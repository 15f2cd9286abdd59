//! The PostgreSQL statements of an enqueue ([`EnqueueStatements`]): new messages arrive as
//! one `INSERT … SELECT FROM UNNEST(arrays)` per round, so a batch of a thousand costs one
//! statement, not a thousand. A chunk of an enqueue runs in one transaction, again after a
//! deadlock ([`PostgresStore::enqueue_chunk`]).

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::statements::{DEFER, INSERT_MANY, LOCK_IDS, REPLACE, SELECT_EXISTING};
use super::{PostgresStore, record_history};
use crate::queue::enqueue::{
    Applied, EnqueueStatements, Prepared, apply as apply_batch, keys_by_position,
};
use crate::queue::{Existing, QueueError, Status};

/// The statements of an enqueue on one PostgreSQL connection (in a transaction when the
/// batch holds ids).
pub(super) struct PgEnqueue<'c> {
    pub conn: &'c mut PgConnection,
}

#[async_trait]
impl EnqueueStatements for PgEnqueue<'_> {
    async fn lock_ids(&mut self, queue: &str, ids: Vec<&str>) -> Result<(), QueueError> {
        sqlx::query(LOCK_IDS)
            .bind(queue)
            .bind(ids)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn insert_new(
        &mut self,
        queue: &str,
        round: &[&Prepared],
        now: i64,
    ) -> Result<Vec<Option<i64>>, QueueError> {
        let column = |f: fn(&Prepared) -> Option<String>| -> Vec<Option<String>> {
            round.iter().map(|m| f(m)).collect()
        };
        let rows = sqlx::query(INSERT_MANY)
            .bind(queue)
            .bind(now)
            .bind(column(|m| m.message.id.clone()))
            .bind(column(|m| Some(m.delivery_id.clone())))
            .bind(column(|m| Some(m.message.payload.clone())))
            .bind(column(|m| Some(m.hash.clone())))
            .bind(column(|m| Some(m.headers.clone())))
            .bind(
                round
                    .iter()
                    .map(|m| m.message.priority)
                    .collect::<Vec<i32>>(),
            )
            .bind(column(|m| Some(m.status.as_str().to_string())))
            .bind(round.iter().map(|m| m.at).collect::<Vec<i64>>())
            .bind(column(|m| m.message.last_error.clone()))
            .bind(column(|m| m.message.source_delivery_id.clone()))
            .bind(
                round
                    .iter()
                    .map(|m| m.message.attempts as i32)
                    .collect::<Vec<i32>>(),
            )
            .bind(column(|m| m.message.session.clone()))
            .fetch_all(&mut *self.conn)
            .await?;
        let returned = rows
            .iter()
            .map(|r| Ok((r.try_get("key")?, r.try_get("delivery_id")?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(keys_by_position(round, returned))
    }

    async fn existing(
        &mut self,
        queue: &str,
        id: &str,
    ) -> Result<Option<(i64, Existing)>, QueueError> {
        let Some(row) = sqlx::query(SELECT_EXISTING)
            .bind(queue)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await?
        else {
            return Ok(None);
        };
        let existing = Existing {
            status: Status::parse(row.try_get::<&str, _>("status")?),
            payload_hash: row.try_get("payload_hash")?,
            next_payload_hash: row.try_get("next_payload_hash")?,
        };
        Ok(Some((row.try_get("key")?, existing)))
    }

    async fn defer(&mut self, key: i64, m: &Prepared, now: i64) -> Result<(), QueueError> {
        sqlx::query(DEFER)
            .bind(&m.delivery_id)
            .bind(&m.message.payload)
            .bind(&m.hash)
            .bind(&m.headers)
            .bind(m.message.priority)
            .bind(m.at)
            .bind(m.custom_status())
            .bind(now)
            .bind(key)
            .bind(m.message.attempts as i32)
            .bind(&m.message.last_error)
            .bind(&m.message.source_delivery_id)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn replace(&mut self, key: i64, m: &Prepared, now: i64) -> Result<(), QueueError> {
        record_history(&mut *self.conn, now, None, None, key, None, None).await?;
        sqlx::query(REPLACE)
            .bind(&m.delivery_id)
            .bind(&m.message.payload)
            .bind(&m.hash)
            .bind(&m.headers)
            .bind(m.message.priority)
            .bind(m.status.as_str())
            .bind(m.at)
            .bind(now)
            .bind(key)
            .bind(&m.message.last_error)
            .bind(&m.message.source_delivery_id)
            .bind(m.message.attempts as i32)
            .bind(&m.message.session)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn tend_sessions(
        &mut self,
        queue: &str,
        sessions: &str,
        now: i64,
    ) -> Result<(), QueueError> {
        super::sessions::park(&mut *self.conn, queue, sessions, now).await
    }
}

impl PostgresStore {
    /// Apply one chunk of an enqueue (see [`crate::queue::enqueue::transactions`]) in one
    /// transaction, again when PostgreSQL chose it as a deadlock victim (two batches taking
    /// the same ids in another order).
    pub(super) async fn enqueue_chunk(
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
                apply_batch(
                    &mut PgEnqueue { conn: &mut conn },
                    queue,
                    chunk,
                    idempotent,
                    now,
                )
                .await
            } else {
                let mut tx = self.pool.begin().await?;
                match apply_batch(
                    &mut PgEnqueue { conn: &mut tx },
                    queue,
                    chunk,
                    idempotent,
                    now,
                )
                .await
                {
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

//! The SQLite statements of an enqueue ([`EnqueueStatements`]): new messages arrive as one
//! multi-row `INSERT … VALUES (…), (…)` per round.

use async_trait::async_trait;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

use super::statements::{DEFER, RECORD_HISTORY, REPLACE};
use crate::queue::enqueue::{EnqueueStatements, Prepared, keys_by_position};
use crate::queue::{Existing, QueueError, Status};

/// The statements of an enqueue on one SQLite connection (in a transaction when the batch
/// holds ids).
pub(super) struct SqliteEnqueue<'c> {
    pub conn: &'c mut SqliteConnection,
}

#[async_trait]
impl EnqueueStatements for SqliteEnqueue<'_> {
    async fn insert_new(
        &mut self,
        queue: &str,
        round: &[&Prepared],
        now: i64,
    ) -> Result<Vec<Option<i64>>, QueueError> {
        let mut insert = QueryBuilder::<Sqlite>::new(
            "INSERT INTO messages (queue, message_id, delivery_id, payload, payload_hash, headers,
                priority, status, process_at_ms, created_at_ms, enqueued_at_ms, updated_at_ms,
                last_error, source_delivery_id, attempts, session_key) ",
        );
        insert.push_values(round, |mut row, m| {
            row.push_bind(queue)
                .push_bind(m.message.id.as_deref())
                .push_bind(m.delivery_id.as_str())
                .push_bind(m.message.payload.as_str())
                .push_bind(m.hash.as_str())
                .push_bind(m.headers.as_str())
                .push_bind(m.message.priority)
                .push_bind(m.status.as_str())
                .push_bind(m.at)
                .push_bind(now)
                .push_bind(now)
                .push_bind(now)
                .push_bind(m.message.last_error.as_deref())
                .push_bind(m.message.source_delivery_id.as_deref())
                .push_bind(m.message.attempts as i64)
                .push_bind(m.message.session.as_deref());
        });
        insert.push(
            " ON CONFLICT (queue, message_id) WHERE message_id IS NOT NULL DO NOTHING
              RETURNING key, delivery_id",
        );
        let rows = insert.build().fetch_all(&mut *self.conn).await?;
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
        // The transaction began with a write, so it already holds the database's write lock.
        let Some(row) = sqlx::query(
            "SELECT key, status, payload_hash, next_payload_hash FROM messages
             WHERE queue = ?1 AND message_id = ?2",
        )
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
            .bind(m.message.attempts as i64)
            .bind(&m.message.last_error)
            .bind(&m.message.source_delivery_id)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn replace(&mut self, key: i64, m: &Prepared, now: i64) -> Result<(), QueueError> {
        sqlx::query(RECORD_HISTORY)
            .bind(now)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(key)
            .bind(None::<i64>)
            .bind(None::<String>)
            .execute(&mut *self.conn)
            .await?;
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
            .bind(m.message.attempts as i64)
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

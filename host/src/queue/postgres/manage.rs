//! Retention and operator commands of the PostgreSQL queue store: purge, history, retry,
//! move and delete.

use sqlx::Row;

use super::PostgresStore;
use crate::queue::rows::{decode_headers, history_from_row};
use crate::queue::{HistoryEntry, QueueError, Retention, Selector, Status, now_ms};

impl PostgresStore {
    pub(super) async fn purge_now(
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

    pub(super) async fn history_now(
        &self,
        queue: &str,
        id: &str,
    ) -> Result<Vec<HistoryEntry>, QueueError> {
        let rows = sqlx::query("SELECT * FROM message_history WHERE queue = $1 AND wharf_id_hash(message_id) = wharf_id_hash($2) AND message_id = $2 ORDER BY history_key")
            .bind(queue)
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| history_from_row!(r)).collect()
    }

    pub(super) async fn retry_now(&self, selector: &Selector) -> Result<u64, QueueError> {
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

    pub(super) async fn move_to_now(&self, key: i64, status: &Status) -> Result<bool, QueueError> {
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

    pub(super) async fn delete_now(&self, key: i64) -> Result<bool, QueueError> {
        let done = sqlx::query("DELETE FROM messages WHERE key = $1 AND status NOT IN ('processing', 'awaiting-release')")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

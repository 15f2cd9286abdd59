//! Retention and the operator commands (purge, get, list, counts, history, retry, move,
//! delete), written once for every SQL dialect. Each store instantiates them with
//! [`operator_commands!`] on its own pool; the statements that differ between dialects come
//! from the store's [`ManageSql`], the others are shared here (`$N` placeholders work on both).

/// The operator statements whose text differs between dialects.
pub(crate) struct ManageSql {
    /// Keys of processed messages older than `$2` in queue `$1`, at most `$3`.
    pub expired_keys: &'static str,
    /// Keys of processed messages of queue `$1` beyond the newest `$2`, at most `$3`.
    pub overflow_keys: &'static str,
    /// Copy the processed messages whose keys are in the JSON array `$1` into history (`$2` now).
    pub archive_keys: &'static str,
    /// Delete the processed messages whose keys are in the JSON array `$1`.
    pub delete_keys: &'static str,
    /// History of id `$2` in queue `$1`, oldest first.
    pub history: &'static str,
    /// Messages matching queue `$1`, status `$2`, id `$4`, key below `$5`, session `$6`;
    /// newest first, `$3`.
    pub list: &'static str,
    /// Make messages ready again (`$1` now): key `$2`, or queue `$3` in status `$4`; returns
    /// the queue and session of each.
    pub retry: &'static str,
}

/// Keep the newest `$2` history versions of each id of queue `$1`; delete at most `$3`.
pub(crate) const PRUNE_HISTORY: &str = "
DELETE FROM message_history WHERE history_key IN (
    SELECT history_key FROM (
        SELECT history_key, ROW_NUMBER() OVER (PARTITION BY message_id ORDER BY history_key DESC) AS rn
        FROM message_history WHERE queue = $1) ranked
    WHERE rn > $2 LIMIT $3)";

/// Move message `$3` to status `$1` (`$2` now) unless it is leased or awaiting release; a
/// move to any status but processed clears how it was completed. Returns its queue and
/// session.
pub(crate) const MOVE_TO: &str = "
UPDATE messages SET status = $1, updated_at_ms = $2,
    process_at_ms = CASE WHEN $1 = 'pending' THEN $2 ELSE process_at_ms END,
    outcome = CASE WHEN $1 = 'processed' THEN outcome ELSE NULL END
WHERE key = $3 AND status NOT IN ('processing', 'awaiting-release')
RETURNING queue, session_key";

/// Delete message `$1` unless it is leased or awaiting release. Returns its queue and session.
pub(crate) const DELETE: &str =
    "DELETE FROM messages WHERE key = $1 AND status NOT IN ('processing', 'awaiting-release')
     RETURNING queue, session_key";

/// One message by key.
pub(crate) const GET: &str = "SELECT * FROM messages WHERE key = $1";

/// The number of messages of queue `$1` per status.
pub(crate) const COUNTS: &str = "SELECT status, COUNT(*) AS n FROM messages WHERE queue = $1
GROUP BY status ORDER BY status";

/// Implement the operator commands as inherent `*_now` methods of a store type with a `pool`
/// field (writes) and a `readers()` method (reads), using `$sql` (a [`ManageSql`]) and a
/// `stored(&Row)` decoder in scope.
macro_rules! operator_commands {
    ($store:ty, $sql:expr) => {
        impl $store {
            pub(super) async fn purge_now(
                &self,
                queue: &str,
                retention: &$crate::queue::Retention,
                batch: u32,
            ) -> Result<u64, $crate::queue::QueueError> {
                use $crate::queue::manage::PRUNE_HISTORY;
                let sql: &$crate::queue::manage::ManageSql = &$sql;
                let now = $crate::queue::now_ms();
                let mut tx = self.pool.begin().await?;
                // A write first, so the transaction holds the lock it decides under (SQLite).
                sqlx::query(PRUNE_HISTORY)
                    .bind(queue)
                    .bind(retention.history_versions as i64)
                    .bind(batch as i64)
                    .execute(&mut *tx)
                    .await?;
                let mut keys: Vec<i64> = Vec::new();
                if let Some(age) = retention.max_age_ms {
                    keys = sqlx::query_scalar(sql.expired_keys)
                        .bind(queue)
                        .bind(now - age)
                        .bind(batch as i64)
                        .fetch_all(&mut *tx)
                        .await?;
                }
                if let Some(count) = retention.max_count
                    && (keys.len() as u32) < batch
                {
                    let extra: Vec<i64> = sqlx::query_scalar(sql.overflow_keys)
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
                    sqlx::query(sql.archive_keys)
                        .bind(&list)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(sql.delete_keys)
                        .bind(&list)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(keys.len() as u64)
            }

            pub(super) async fn get_now(
                &self,
                key: i64,
            ) -> Result<Option<$crate::queue::StoredMessage>, $crate::queue::QueueError> {
                let row = sqlx::query($crate::queue::manage::GET)
                    .bind(key)
                    .fetch_optional(self.readers())
                    .await?;
                row.as_ref().map(stored).transpose()
            }

            pub(super) async fn list_now(
                &self,
                filter: &$crate::queue::MessageFilter,
            ) -> Result<Vec<$crate::queue::StoredMessage>, $crate::queue::QueueError> {
                let sql: &$crate::queue::manage::ManageSql = &$sql;
                let rows = sqlx::query(sql.list)
                    .bind(&filter.queue)
                    .bind(filter.status.as_ref().map(|s| s.as_str().to_string()))
                    .bind(filter.limit as i64)
                    .bind(&filter.id)
                    .bind(filter.before_key)
                    .bind(&filter.session)
                    .fetch_all(self.readers())
                    .await?;
                rows.iter().map(stored).collect()
            }

            pub(super) async fn counts_now(
                &self,
                queue: &str,
            ) -> Result<Vec<($crate::queue::Status, u64)>, $crate::queue::QueueError> {
                use sqlx::Row;
                let rows = sqlx::query($crate::queue::manage::COUNTS)
                    .bind(queue)
                    .fetch_all(self.readers())
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok((
                            $crate::queue::Status::parse(r.try_get::<&str, _>("status")?),
                            r.try_get::<i64, _>("n")? as u64,
                        ))
                    })
                    .collect()
            }

            pub(super) async fn history_now(
                &self,
                queue: &str,
                id: &str,
            ) -> Result<Vec<$crate::queue::HistoryEntry>, $crate::queue::QueueError> {
                use sqlx::Row;
                use $crate::queue::rows::{decode_headers, history_from_row};
                use $crate::queue::{HistoryEntry, QueueError, Status};
                let sql: &$crate::queue::manage::ManageSql = &$sql;
                let rows = sqlx::query(sql.history)
                    .bind(queue)
                    .bind(id)
                    .fetch_all(self.readers())
                    .await?;
                rows.iter().map(|r| history_from_row!(r)).collect()
            }

            pub(super) async fn retry_now(
                &self,
                selector: &$crate::queue::Selector,
            ) -> Result<u64, $crate::queue::QueueError> {
                use $crate::queue::Selector;
                let sql: &$crate::queue::manage::ManageSql = &$sql;
                let (key, queue, status) = match selector {
                    Selector::Key(key) => (Some(*key), None, None),
                    Selector::QueueStatus { queue, status } => {
                        (None, Some(queue.as_str()), Some(status.as_str()))
                    }
                };
                let now = $crate::queue::now_ms();
                let mut tx = self.pool.begin().await?;
                let touched: Vec<(String, Option<String>)> = sqlx::query_as(sql.retry)
                    .bind(now)
                    .bind(key)
                    .bind(queue)
                    .bind(status)
                    .fetch_all(&mut *tx)
                    .await?;
                super::sessions::tend_touched(&mut tx, &touched, now).await?;
                tx.commit().await?;
                Ok(touched.len() as u64)
            }

            pub(super) async fn move_to_now(
                &self,
                key: i64,
                status: &$crate::queue::Status,
            ) -> Result<bool, $crate::queue::QueueError> {
                let now = $crate::queue::now_ms();
                let mut tx = self.pool.begin().await?;
                let touched: Vec<(String, Option<String>)> =
                    sqlx::query_as($crate::queue::manage::MOVE_TO)
                        .bind(status.as_str())
                        .bind(now)
                        .bind(key)
                        .fetch_all(&mut *tx)
                        .await?;
                super::sessions::tend_touched(&mut tx, &touched, now).await?;
                tx.commit().await?;
                Ok(!touched.is_empty())
            }

            pub(super) async fn delete_now(
                &self,
                key: i64,
            ) -> Result<bool, $crate::queue::QueueError> {
                let now = $crate::queue::now_ms();
                let mut tx = self.pool.begin().await?;
                let touched: Vec<(String, Option<String>)> =
                    sqlx::query_as($crate::queue::manage::DELETE)
                        .bind(key)
                        .fetch_all(&mut *tx)
                        .await?;
                super::sessions::tend_touched(&mut tx, &touched, now).await?;
                tx.commit().await?;
                Ok(!touched.is_empty())
            }
        }
    };
}
pub(crate) use operator_commands;

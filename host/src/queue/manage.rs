//! Retention and the operator commands (purge, get, list, counts, history, retry, move,
//! delete) of the SQL queue, written once for both dialects; where their statements differ,
//! each dialect's words are below.

use super::rows::{self, stored};
use super::sessions::change_and_tend;
use super::{
    HistoryEntry, MessageFilter, QueueError, Retention, Selector, Status, StoredMessage, now_ms,
};
use crate::sql::{Pool, Sql};

/// Keep the newest `$2` history versions of each id of queue `$1`; delete at most `$3`.
static PRUNE_HISTORY: Sql = Sql::both("
DELETE FROM message_history WHERE history_key IN (
    SELECT history_key FROM (
        SELECT history_key, ROW_NUMBER() OVER (PARTITION BY message_id ORDER BY history_key DESC) AS rn
        FROM message_history WHERE queue = $1) ranked
    WHERE rn > $2 LIMIT $3)");

/// Move message `$3` to status `$1` (`$2` now) unless it is leased or awaiting release; a
/// move to any status but processed clears how it was completed. Returns its queue and
/// session.
static MOVE_TO: Sql = Sql::both(
    "
UPDATE messages SET status = $1, updated_at_ms = $2,
    process_at_ms = CASE WHEN $1 = 'pending' THEN $2 ELSE process_at_ms END,
    outcome = CASE WHEN $1 = 'processed' THEN outcome ELSE NULL END
WHERE key = $3 AND status NOT IN ('processing', 'awaiting-release')
RETURNING queue, session_key",
);

/// Delete message `$1` unless it is leased or awaiting release. Returns its queue and session.
static DELETE: Sql = Sql::both(
    "DELETE FROM messages WHERE key = $1 AND status NOT IN ('processing', 'awaiting-release')
     RETURNING queue, session_key",
);

/// One message by key.
static GET: Sql = Sql::both("SELECT * FROM messages WHERE key = $1");

/// The number of messages of queue `$1` per status.
static COUNTS: Sql = Sql::both(
    "SELECT status, COUNT(*) AS n FROM messages WHERE queue = $1
GROUP BY status ORDER BY status",
);

/// When the oldest message of queue `$1` ready at `$2` became ready (its `process_at_ms`).
static OLDEST_READY: Sql = Sql::both(
    "SELECT MIN(process_at_ms) FROM messages WHERE queue = $1 AND status = 'pending' AND process_at_ms <= $2",
);

/// Keys of processed messages older than `$2` in queue `$1`, at most `$3`.
static EXPIRED_KEYS: Sql = Sql::each(
    // SQLite
    "SELECT key FROM messages WHERE queue = $1 AND status = 'processed' AND processed_at_ms < $2
                   LIMIT $3",
    // PostgreSQL (ids found through their hash index)
    "SELECT key FROM messages WHERE queue = $1 AND status = 'processed' AND processed_at_ms < $2
                   LIMIT $3 FOR UPDATE SKIP LOCKED",
);

/// Keys of processed messages of queue `$1` beyond the newest `$2`, at most `$3`.
static OVERFLOW_KEYS: Sql = Sql::each(
    // SQLite
    "SELECT key FROM (SELECT key FROM messages WHERE queue = $1 AND status = 'processed'
                                     ORDER BY processed_at_ms DESC, key DESC LIMIT -1 OFFSET $2)
                    LIMIT $3",
    // PostgreSQL (ids found through their hash index)
    "SELECT key FROM (SELECT key FROM messages WHERE queue = $1 AND status = 'processed'
                                     ORDER BY processed_at_ms DESC, key DESC OFFSET $2) old
                    LIMIT $3",
);

/// Copy the processed messages whose keys are in the JSON array `$1` into history (`$2` now).
static ARCHIVE_KEYS: Sql = Sql::each(
    // SQLite
    "INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload,
                       headers, priority, status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
                   SELECT queue, message_id, key, version, delivery_id, payload, headers, priority, status, attempts,
                          last_error, enqueued_at_ms, processed_at_ms, $2
                   FROM messages WHERE key IN (SELECT value FROM json_each($1))
                     AND message_id IS NOT NULL AND status = 'processed'",
    // PostgreSQL (ids found through their hash index)
    "INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload,
                       headers, priority, status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
                   SELECT queue, message_id, key, version, delivery_id, payload, headers, priority, status, attempts,
                          last_error, enqueued_at_ms, processed_at_ms, $2
                   FROM messages WHERE key IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb))
                     AND message_id IS NOT NULL AND status = 'processed'",
);

/// Delete the processed messages whose keys are in the JSON array `$1`.
static DELETE_KEYS: Sql = Sql::each(
    // SQLite
    "DELETE FROM messages WHERE key IN (SELECT value FROM json_each($1)) AND status = 'processed'",
    // PostgreSQL (ids found through their hash index)
    "DELETE FROM messages
                  WHERE key IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb))
                    AND status = 'processed'",
);

/// History of id `$2` in queue `$1`, oldest first.
static HISTORY: Sql = Sql::each(
    // SQLite
    "SELECT * FROM message_history WHERE queue = $1 AND message_id = $2 ORDER BY history_key",
    // PostgreSQL (ids found through their hash index)
    "SELECT * FROM message_history
              WHERE queue = $1 AND wharf_id_hash(message_id) = wharf_id_hash($2) AND message_id = $2
              ORDER BY history_key",
);

/// Messages matching queue `$1`, status `$2`, id `$4`, key below `$5`, session `$6`;
/// newest first, `$3`.
static LIST: Sql = Sql::each(
    // SQLite
    "SELECT * FROM messages
           WHERE ($1 IS NULL OR queue = $1) AND ($2 IS NULL OR status = $2)
             AND ($4 IS NULL OR message_id = $4) AND ($5 IS NULL OR key < $5)
             AND ($6 IS NULL OR session_key = $6)
           ORDER BY key DESC LIMIT $3",
    // PostgreSQL (ids found through their hash index)
    "SELECT * FROM messages
           WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR status = $2)
             AND ($4::text IS NULL OR (wharf_id_hash(message_id) = wharf_id_hash($4) AND message_id = $4))
             AND ($5::bigint IS NULL OR key < $5)
             AND ($6::text IS NULL OR session_key = $6)
           ORDER BY key DESC LIMIT $3",
);

/// Make messages ready again (`$1` now): key `$2`, or queue `$3` in status `$4`; returns
/// the queue and session of each.
static RETRY: Sql = Sql::each(
    // SQLite
    "UPDATE messages SET status = 'pending', process_at_ms = $1, attempts = 0, updated_at_ms = $1,
                source_delivery_id = COALESCE(source_delivery_id, delivery_id),
                delivery_id = lower(hex(randomblob(16))), processed_at_ms = NULL, outcome = NULL
            WHERE status NOT IN ('processing', 'awaiting-release')
              AND ($2 IS NULL OR key = $2) AND ($3 IS NULL OR (queue = $3 AND status = $4))
            RETURNING queue, session_key",
    // PostgreSQL (ids found through their hash index)
    "UPDATE messages SET status = 'pending', process_at_ms = $1, attempts = 0, updated_at_ms = $1,
                source_delivery_id = COALESCE(source_delivery_id, delivery_id),
                delivery_id = replace(gen_random_uuid()::text, '-', ''), processed_at_ms = NULL, outcome = NULL
            WHERE status NOT IN ('processing', 'awaiting-release')
              AND ($2::bigint IS NULL OR key = $2) AND ($3::text IS NULL OR (queue = $3 AND status = $4::text))
            RETURNING queue, session_key",
);

/// See [`crate::queue::QueueStore::purge`].
pub(super) async fn purge(
    pool: &Pool,
    queue: &str,
    retention: &Retention,
    batch: u32,
) -> Result<u64, QueueError> {
    let now = now_ms();
    let mut tx = pool.begin().await?;
    let mut conn = tx.conn();
    // A write first, so the transaction holds the lock it decides under (SQLite).
    conn.query(&PRUNE_HISTORY)
        .bind(queue)
        .bind(retention.history_versions as i64)
        .bind(batch as i64)
        .execute()
        .await?;
    let mut keys: Vec<i64> = Vec::new();
    if let Some(age) = retention.max_age_ms {
        keys = conn
            .query(&EXPIRED_KEYS)
            .bind(queue)
            .bind(now - age)
            .bind(batch as i64)
            .fetch_column()
            .await?;
    }
    if let Some(count) = retention.max_count
        && (keys.len() as u32) < batch
    {
        let extra: Vec<i64> = conn
            .query(&OVERFLOW_KEYS)
            .bind(queue)
            .bind(count as i64)
            .bind((batch as usize - keys.len()) as i64)
            .fetch_column()
            .await?;
        keys.extend(extra);
        keys.sort_unstable();
        keys.dedup();
    }
    if !keys.is_empty() {
        let list = serde_json::to_string(&keys).expect("keys serialize");
        conn.query(&ARCHIVE_KEYS)
            .bind(list.as_str())
            .bind(now)
            .execute()
            .await?;
        conn.query(&DELETE_KEYS)
            .bind(list.as_str())
            .execute()
            .await?;
    }
    tx.commit().await?;
    Ok(keys.len() as u64)
}

/// See [`crate::queue::QueueStore::get`].
pub(super) async fn get(readers: &Pool, key: i64) -> Result<Option<StoredMessage>, QueueError> {
    let row = readers.query(&GET).bind(key).fetch_optional().await?;
    row.as_ref().map(stored).transpose()
}

/// See [`crate::queue::QueueStore::list`].
pub(super) async fn list(
    readers: &Pool,
    filter: &MessageFilter,
) -> Result<Vec<StoredMessage>, QueueError> {
    let rows = readers
        .query(&LIST)
        .bind(filter.queue.as_deref())
        .bind(filter.status.as_ref().map(|s| s.as_str()))
        .bind(filter.limit as i64)
        .bind(filter.id.as_deref())
        .bind(filter.before_key)
        .bind(filter.session.as_deref())
        .fetch_all()
        .await?;
    rows.iter().map(stored).collect()
}

/// See [`crate::queue::QueueStore::oldest_ready`].
pub(super) async fn oldest_ready(
    readers: &Pool,
    queue: &str,
    now: i64,
) -> Result<Option<i64>, QueueError> {
    let row = readers
        .query(&OLDEST_READY)
        .bind(queue)
        .bind(now)
        .fetch_one()
        .await?;
    Ok(row.get(0)?)
}

/// See [`crate::queue::QueueStore::counts`].
pub(super) async fn counts(readers: &Pool, queue: &str) -> Result<Vec<(Status, u64)>, QueueError> {
    let rows = readers.query(&COUNTS).bind(queue).fetch_all().await?;
    rows.iter()
        .map(|r| {
            Ok((
                Status::parse(r.get::<&str, _>("status")?),
                r.get::<i64, _>("n")? as u64,
            ))
        })
        .collect()
}

/// See [`crate::queue::QueueStore::history`].
pub(super) async fn history(
    readers: &Pool,
    queue: &str,
    id: &str,
) -> Result<Vec<HistoryEntry>, QueueError> {
    let rows = readers
        .query(&HISTORY)
        .bind(queue)
        .bind(id)
        .fetch_all()
        .await?;
    rows.iter().map(rows::history).collect()
}

/// See [`crate::queue::QueueStore::retry`].
pub(super) async fn retry(pool: &Pool, selector: &Selector) -> Result<u64, QueueError> {
    let (key, queue, status) = match selector {
        Selector::Key(key) => (Some(*key), None, None),
        Selector::QueueStatus { queue, status } => {
            (None, Some(queue.as_str()), Some(status.as_str()))
        }
    };
    let now = now_ms();
    let changed = change_and_tend(pool, &RETRY, now, |q| {
        q.bind(now).bind(key).bind(queue).bind(status)
    });
    Ok(changed.await? as u64)
}

/// See [`crate::queue::QueueStore::move_to`].
pub(super) async fn move_to(pool: &Pool, key: i64, status: &Status) -> Result<bool, QueueError> {
    let now = now_ms();
    let changed = change_and_tend(pool, &MOVE_TO, now, |q| {
        q.bind(status.as_str()).bind(now).bind(key)
    });
    Ok(changed.await? > 0)
}

/// See [`crate::queue::QueueStore::delete`].
pub(super) async fn delete(pool: &Pool, key: i64) -> Result<bool, QueueError> {
    let changed = change_and_tend(pool, &DELETE, now_ms(), |q| q.bind(key));
    Ok(changed.await? > 0)
}

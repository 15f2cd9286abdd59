//! The SQL statements of the SQLite queue store.

use std::sync::LazyLock;

use crate::queue::sessions::{self, TendSql};

/// How SQLite reads the session keys of a JSON array `$3`.
pub(super) static TEND: LazyLock<TendSql> =
    LazyLock::new(|| TendSql::new("SELECT value FROM json_each($3)"));

pub(super) const DEFER: &str = "
UPDATE messages SET next_delivery_id = ?1, next_payload = ?2, next_payload_hash = ?3, next_headers = ?4,
    next_priority = ?5, next_process_at_ms = ?6, next_status = ?7, next_enqueued_at_ms = ?8,
    next_attempts = ?10, next_last_error = ?11, next_source_delivery_id = ?12,
    status = 'awaiting-release', updated_at_ms = ?8
WHERE key = ?9";

/// Copy the live version of the selected rows into history, with `status` (?2) when given.
pub(super) const RECORD_HISTORY: &str = "
INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers, priority,
                             status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
SELECT queue, message_id, key, version, delivery_id, payload, headers, priority,
       COALESCE(?2, status), attempts, COALESCE(?3, last_error), enqueued_at_ms,
       CASE WHEN ?2 = 'processed' THEN ?1 ELSE processed_at_ms END, ?1
FROM messages WHERE key = ?4 AND message_id IS NOT NULL AND (?5 IS NULL OR lease_token = ?5)
  AND (?6 IS NULL OR status = ?6)";

pub(super) const REPLACE: &str = "
UPDATE messages SET delivery_id = ?1, payload = ?2, payload_hash = ?3, headers = ?4, priority = ?5,
    status = ?6, process_at_ms = ?7, enqueued_at_ms = ?8, updated_at_ms = ?8, attempts = ?12, last_error = ?10,
    processed_at_ms = NULL, lease_expires_at_ms = NULL, version = version + 1,
    source_delivery_id = ?11, outcome = NULL, session_key = ?13
WHERE key = ?9";

/// Lease up to `?4` ready messages of queue `?3` (`?2` now, until `?1`); `guard` adds a
/// condition on each candidate row (`messages`), `returning` columns to the rows returned.
///
/// The limit is an expression, not a bare parameter: SQLite plans a bare `LIMIT ?` with its
/// bound value as a constant, so binding it — on every lease, even to the same value — made
/// SQLite parse and plan the whole statement again.
fn lease_with(guard: &str, returning: &str) -> String {
    format!(
        "
UPDATE messages
SET status = 'processing', attempts = attempts + 1, lease_token = lease_token + 1,
    lease_expires_at_ms = ?1, updated_at_ms = ?2
WHERE key IN (
    SELECT key FROM messages
    WHERE queue = ?3 AND status IN ('pending', 'sleeping') AND process_at_ms <= ?2 {guard}
    ORDER BY priority DESC, process_at_ms, key
    LIMIT CAST(?4 AS INTEGER))
RETURNING key, queue, message_id, delivery_id, payload, headers, priority, attempts,
          lease_token, enqueued_at_ms, process_at_ms, source_delivery_id, session_key{returning}"
    )
}

static LEASE: LazyLock<String> = LazyLock::new(|| lease_with("", ""));
static LEASE_IN_SESSIONS: LazyLock<String> = LazyLock::new(|| lease_with(&session_heads(), ""));

fn session_heads() -> String {
    format!("AND {}", sessions::head_guard())
}

/// The lease statement: plain, or leasing only the heads of sessions.
pub(super) fn lease(sessions: bool) -> &'static str {
    if sessions {
        LEASE_IN_SESSIONS.as_str()
    } else {
        LEASE.as_str()
    }
}

/// [`lease`] with each delivery checked against the inbox table `{inbox_table}` (endpoint
/// `?5`) in the same statement, on the key `wharf_inbox_key` computes (see [`super::inbox_key`]).
pub(super) fn lease_checking_inbox(inbox_table: &str, sessions: bool) -> String {
    let guard = if sessions {
        session_heads()
    } else {
        String::new()
    };
    lease_with(
        &guard,
        &format!(
            ",
          EXISTS (SELECT 1 FROM {inbox_table} i
                  WHERE i.id_hash = {key}(?5, delivery_id) AND i.expires_at_ms > ?2) AS inbox_processed",
            key = super::inbox_key::name()
        ),
    )
}

/// Complete the leases of the JSON array `?2` (`[[key, token, outcome], …]`) kept as
/// processed, in one statement; returns the leases it completed.
pub(super) const COMPLETE_MANY: &str = "
UPDATE messages SET status = 'processed', processed_at_ms = ?1, updated_at_ms = ?1, lease_expires_at_ms = NULL,
                    outcome = done.done_outcome
FROM (SELECT json_extract(value, '$[0]') AS done_key, json_extract(value, '$[1]') AS done_token,
             json_extract(value, '$[2]') AS done_outcome
      FROM json_each(?2)) AS done
WHERE key = done.done_key AND lease_token = done.done_token AND status = 'processing'
RETURNING key, lease_token";

pub(super) const COMPLETED_UNDER: &str =
    "SELECT 1 FROM messages WHERE key = ?1 AND lease_token = ?2 AND status = 'processed'";

pub(super) const DELETE_LEASED: &str =
    "DELETE FROM messages WHERE key = ?1 AND lease_token = ?2 AND status = 'processing'";

pub(super) const RETRY: &str = "
UPDATE messages SET status = CASE WHEN ?2 <= ?1 THEN 'pending' ELSE 'sleeping' END,
                    process_at_ms = ?2, last_error = COALESCE(?3, last_error),
                    updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?4 AND lease_token = ?5 AND status = 'processing'";

pub(super) const FAIL: &str = "
UPDATE messages SET status = 'failed', last_error = ?2, outcome = NULL, updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?3 AND lease_token = ?4 AND status = 'processing'";

pub(super) const RELEASE: &str = "
UPDATE messages SET status = 'pending', attempts = MAX(attempts - 1, 0), updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?2 AND lease_token = ?3 AND status = 'processing'";

/// The version waiting for release becomes the live one; ?2 forces a status (abandonment
/// without retry), ?3 sets the last error. Rows: ?4 = key and ?5 = token, or every expired
/// row of queue ?6.
pub(super) const APPLY_NEXT: &str = "
UPDATE messages SET delivery_id = next_delivery_id, payload = next_payload, payload_hash = next_payload_hash,
    headers = next_headers, priority = next_priority, process_at_ms = next_process_at_ms,
    enqueued_at_ms = next_enqueued_at_ms,
    status = COALESCE(?2, next_status, CASE WHEN next_process_at_ms > ?1 THEN 'sleeping' ELSE 'pending' END),
    attempts = COALESCE(next_attempts, 0), last_error = COALESCE(next_last_error, ?3),
    processed_at_ms = NULL, lease_expires_at_ms = NULL, updated_at_ms = ?1,
    source_delivery_id = next_source_delivery_id, outcome = NULL, version = version + 1,
    next_delivery_id = NULL, next_payload = NULL, next_payload_hash = NULL, next_headers = NULL,
    next_priority = NULL, next_process_at_ms = NULL, next_status = NULL, next_enqueued_at_ms = NULL,
    next_attempts = NULL, next_last_error = NULL, next_source_delivery_id = NULL
WHERE status = 'awaiting-release'
  AND ((?4 IS NOT NULL AND key = ?4 AND lease_token = ?5)
       OR (?6 IS NOT NULL AND queue = ?6 AND lease_expires_at_ms <= ?1))";

pub(super) const EXPIRE: &str = "
UPDATE messages
SET status = CASE WHEN ?4 = 0 OR attempts >= ?3 THEN 'failed' ELSE 'pending' END,
    outcome = NULL,
    last_error = 'lease expired before the message was settled (attempt ' || attempts || ')',
    lease_expires_at_ms = NULL, updated_at_ms = ?1
WHERE queue = ?2 AND status = 'processing' AND lease_expires_at_ms <= ?1";

pub(super) const ABANDONED: &str =
    "lease expired before the message was settled; retry_abandoned = false";

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use libsqlite3_sys::{
        SQLITE_STMTSTATUS_REPREPARE, sqlite3_next_stmt, sqlite3_sql, sqlite3_stmt_status,
    };

    use super::super::store_with_orders;
    use crate::queue::{QueueStore, SqliteStore};

    /// How often SQLite prepared again the writer's cached statements whose text contains
    /// `needle` (at least one must).
    async fn reprepared(store: &SqliteStore, needle: &str) -> i32 {
        let mut conn = store.pool.acquire().await.unwrap();
        let mut handle = conn.lock_handle().await.unwrap();
        let db = handle.as_raw_handle().as_ptr();
        let (mut matched, mut total) = (0, 0);
        // SAFETY: the connection is locked for this task, and its statements are only read.
        unsafe {
            let mut stmt = sqlite3_next_stmt(db, std::ptr::null_mut());
            while !stmt.is_null() {
                if CStr::from_ptr(sqlite3_sql(stmt))
                    .to_string_lossy()
                    .contains(needle)
                {
                    matched += 1;
                    total += sqlite3_stmt_status(stmt, SQLITE_STMTSTATUS_REPREPARE, 0);
                }
                stmt = sqlite3_next_stmt(db, stmt);
            }
        }
        assert!(matched > 0, "no cached statement contains {needle:?}");
        total
    }

    #[tokio::test]
    async fn leases_reuse_the_prepared_lease_statement() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_orders(dir.path(), 10).await;
        let mut leased = 0;
        for max in [1, 2, 3, 1, 3] {
            leased += store.lease("orders", max, 30_000).await.unwrap().len();
        }
        assert_eq!(leased, 10);
        assert_eq!(
            reprepared(&store, "SET status = 'processing'").await,
            0,
            "binding the lease's limit made SQLite prepare the statement again"
        );
    }
}

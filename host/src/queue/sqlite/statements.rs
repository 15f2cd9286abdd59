//! The statements only the SQLite queue store runs: its lease (checking the inbox with
//! `wharf_inbox_key`) and its batch of completions.

use std::sync::LazyLock;

use crate::queue::sessions;

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
pub(in crate::queue) fn lease(sessions: bool) -> &'static str {
    if sessions {
        LEASE_IN_SESSIONS.as_str()
    } else {
        LEASE.as_str()
    }
}

/// [`lease`] with each delivery checked against the inbox table `{inbox_table}` (endpoint
/// `?5`) in the same statement, on the key `wharf_inbox_key` computes (see [`super::inbox_key`]).
pub(in crate::queue) fn lease_checking_inbox(inbox_table: &str, sessions: bool) -> String {
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

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use libsqlite3_sys::{
        SQLITE_STMTSTATUS_REPREPARE, sqlite3_next_stmt, sqlite3_sql, sqlite3_stmt_status,
    };

    use super::super::store_with_orders;
    use crate::queue::{QueueStore, SqlStore};
    use crate::sql::Pool;

    /// How often SQLite prepared again the writer's cached statements whose text contains
    /// `needle` (at least one must).
    async fn reprepared(store: &SqlStore, needle: &str) -> i32 {
        let Pool::Sqlite(pool) = &store.pool else {
            unreachable!("a SQLite store")
        };
        let mut conn = pool.acquire().await.unwrap();
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

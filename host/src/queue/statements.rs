//! The statements of the SQL queue, each written once for both dialects ([`Sql::both`]) or in
//! each dialect's words where they differ ([`Sql::each`]). Statements only one dialect runs
//! (array batches, advisory locks, the SQLite inbox-key function) live with it (`postgres/`,
//! `sqlite/`).

use super::{postgres, sqlite};
use crate::sql::{Dialect, Sql};

pub(super) static DEFER: Sql = Sql::both("
UPDATE messages SET next_delivery_id = $1, next_payload = $2, next_payload_hash = $3, next_headers = $4,
    next_priority = $5, next_process_at_ms = $6, next_status = $7, next_enqueued_at_ms = $8,
    next_attempts = $10, next_last_error = $11, next_source_delivery_id = $12,
    status = 'awaiting-release', updated_at_ms = $8
WHERE key = $9");

/// Copy the live version of the selected rows into history, with `status` (?2) when given.
pub(super) static RECORD_HISTORY: Sql = Sql::each(
    // SQLite
    "
INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers, priority,
                             status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
SELECT queue, message_id, key, version, delivery_id, payload, headers, priority,
       COALESCE(?2, status), attempts, COALESCE(?3, last_error), enqueued_at_ms,
       CASE WHEN ?2 = 'processed' THEN ?1 ELSE processed_at_ms END, ?1
FROM messages WHERE key = ?4 AND message_id IS NOT NULL AND (?5 IS NULL OR lease_token = ?5)
  AND (?6 IS NULL OR status = ?6)",
    // PostgreSQL
    "
INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload, headers, priority,
                             status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
SELECT queue, message_id, key, version, delivery_id, payload, headers, priority,
       COALESCE($2::text, status), attempts, COALESCE($3::text, last_error), enqueued_at_ms,
       CASE WHEN $2::text = 'processed' THEN $1 ELSE processed_at_ms END, $1
FROM messages WHERE key = $4 AND message_id IS NOT NULL AND ($5::bigint IS NULL OR lease_token = $5)
  AND ($6::text IS NULL OR status = $6)",
);

pub(super) static REPLACE: Sql = Sql::both("
UPDATE messages SET delivery_id = $1, payload = $2, payload_hash = $3, headers = $4, priority = $5,
    status = $6, process_at_ms = $7, enqueued_at_ms = $8, updated_at_ms = $8, attempts = $12, last_error = $10,
    processed_at_ms = NULL, lease_expires_at_ms = NULL, version = version + 1,
    source_delivery_id = $11, outcome = NULL, session_key = $13
WHERE key = $9");

pub(super) static COMPLETED_UNDER: Sql = Sql::both(
    "SELECT 1 FROM messages WHERE key = $1 AND lease_token = $2 AND status = 'processed'",
);

pub(super) static DELETE_LEASED: Sql =
    Sql::both("DELETE FROM messages WHERE key = $1 AND lease_token = $2 AND status = 'processing'");

pub(super) static RETRY: Sql = Sql::both(
    "
UPDATE messages SET status = CASE WHEN $2 <= $1 THEN 'pending' ELSE 'sleeping' END,
                    process_at_ms = $2, last_error = COALESCE($3, last_error),
                    updated_at_ms = $1, lease_expires_at_ms = NULL
WHERE key = $4 AND lease_token = $5 AND status = 'processing'",
);

pub(super) static FAIL: Sql = Sql::both("
UPDATE messages SET status = 'failed', last_error = $2, outcome = NULL, updated_at_ms = $1, lease_expires_at_ms = NULL
WHERE key = $3 AND lease_token = $4 AND status = 'processing'");

pub(super) static RELEASE: Sql = Sql::each(
    // SQLite
    "
UPDATE messages SET status = 'pending', attempts = MAX(attempts - 1, 0), updated_at_ms = ?1, lease_expires_at_ms = NULL
WHERE key = ?2 AND lease_token = ?3 AND status = 'processing'",
    // PostgreSQL
    "
UPDATE messages SET status = 'pending', attempts = GREATEST(attempts - 1, 0), updated_at_ms = $1,
                    lease_expires_at_ms = NULL
WHERE key = $2 AND lease_token = $3 AND status = 'processing'",
);

/// The version waiting for release becomes the live one; ?2 forces a status (abandonment
/// without retry), ?3 sets the last error. Rows: ?4 = key and ?5 = token, or every expired
/// row of queue ?6.
pub(super) static APPLY_NEXT: Sql = Sql::each(
    // SQLite
    "
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
       OR (?6 IS NOT NULL AND queue = ?6 AND lease_expires_at_ms <= ?1))",
    // PostgreSQL
    "
UPDATE messages SET delivery_id = next_delivery_id, payload = next_payload, payload_hash = next_payload_hash,
    headers = next_headers, priority = next_priority, process_at_ms = next_process_at_ms,
    enqueued_at_ms = next_enqueued_at_ms,
    status = COALESCE($2::text, next_status, CASE WHEN next_process_at_ms > $1 THEN 'sleeping' ELSE 'pending' END),
    attempts = COALESCE(next_attempts, 0), last_error = COALESCE(next_last_error, $3::text),
    processed_at_ms = NULL, lease_expires_at_ms = NULL, updated_at_ms = $1,
    source_delivery_id = next_source_delivery_id, outcome = NULL, version = version + 1,
    next_delivery_id = NULL, next_payload = NULL, next_payload_hash = NULL, next_headers = NULL,
    next_priority = NULL, next_process_at_ms = NULL, next_status = NULL, next_enqueued_at_ms = NULL,
    next_attempts = NULL, next_last_error = NULL, next_source_delivery_id = NULL
WHERE status = 'awaiting-release'
  AND (($4::bigint IS NOT NULL AND key = $4 AND lease_token = $5::bigint)
       OR ($6::text IS NOT NULL AND queue = $6 AND lease_expires_at_ms <= $1))",
);

pub(super) static EXPIRE: Sql = Sql::each(
    // SQLite
    "
UPDATE messages
SET status = CASE WHEN ?4 = 0 OR attempts >= ?3 THEN 'failed' ELSE 'pending' END,
    outcome = NULL,
    last_error = 'lease expired before the message was settled (attempt ' || attempts || ')',
    lease_expires_at_ms = NULL, updated_at_ms = ?1
WHERE queue = ?2 AND status = 'processing' AND lease_expires_at_ms <= ?1",
    // PostgreSQL
    "
UPDATE messages
SET status = CASE WHEN NOT $4 OR attempts >= $3 THEN 'failed' ELSE 'pending' END,
    outcome = NULL,
    last_error = 'lease expired before the message was settled (attempt ' || attempts || ')',
    lease_expires_at_ms = NULL, updated_at_ms = $1
WHERE queue = $2 AND status = 'processing' AND lease_expires_at_ms <= $1",
);

pub(super) const ABANDONED: &str =
    "lease expired before the message was settled; retry_abandoned = false";

/// The stored message with id `$2` in queue `$1`, locked for the enqueue that applies to it
/// (SQLite: the transaction began with a write, so it holds the database's write lock already).
pub(super) static SELECT_EXISTING: Sql = Sql::each(
    "SELECT key, status, payload_hash, next_payload_hash FROM messages
     WHERE queue = $1 AND message_id = $2",
    "SELECT key, status, payload_hash, next_payload_hash FROM messages
     WHERE queue = $1 AND wharf_id_hash(message_id) = wharf_id_hash($2) AND message_id = $2
     FOR UPDATE",
);

/// The lease statement: plain, or leasing only the heads of sessions. Binds the lease's end,
/// now, the queue and the limit.
pub(super) fn lease(dialect: Dialect, sessions: bool) -> &'static str {
    match dialect {
        Dialect::Sqlite => sqlite::statements::lease(sessions),
        Dialect::Postgres => postgres::statements::lease(sessions),
    }
}

/// [`lease`] with each delivery checked against the inbox table `inbox_table` in the same
/// statement; binds the inbox endpoint fifth.
pub(super) fn lease_checking_inbox(dialect: Dialect, inbox_table: &str, sessions: bool) -> String {
    match dialect {
        Dialect::Sqlite => sqlite::statements::lease_checking_inbox(inbox_table, sessions),
        Dialect::Postgres => postgres::statements::lease_checking_inbox(inbox_table, sessions),
    }
}

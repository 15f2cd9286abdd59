//! Retention and operator commands of the SQLite queue store: the shared commands
//! ([`operator_commands!`]) with SQLite's statements.

use super::SqliteStore;
use super::stored;
use crate::queue::manage::{ManageSql, operator_commands};

/// The operator statements in SQLite's words.
const SQL: ManageSql = ManageSql {
    expired_keys: "SELECT key FROM messages WHERE queue = $1 AND status = 'processed' AND processed_at_ms < $2
                   LIMIT $3",
    overflow_keys: "SELECT key FROM (SELECT key FROM messages WHERE queue = $1 AND status = 'processed'
                                     ORDER BY processed_at_ms DESC, key DESC LIMIT -1 OFFSET $2)
                    LIMIT $3",
    archive_keys: "INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload,
                       headers, priority, status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
                   SELECT queue, message_id, key, version, delivery_id, payload, headers, priority, status, attempts,
                          last_error, enqueued_at_ms, processed_at_ms, $2
                   FROM messages WHERE key IN (SELECT value FROM json_each($1))
                     AND message_id IS NOT NULL AND status = 'processed'",
    delete_keys: "DELETE FROM messages WHERE key IN (SELECT value FROM json_each($1)) AND status = 'processed'",
    history: "SELECT * FROM message_history WHERE queue = $1 AND message_id = $2 ORDER BY history_key",
    list: "SELECT * FROM messages
           WHERE ($1 IS NULL OR queue = $1) AND ($2 IS NULL OR status = $2)
             AND ($4 IS NULL OR message_id = $4) AND ($5 IS NULL OR key < $5)
             AND ($6 IS NULL OR session_key = $6)
           ORDER BY key DESC LIMIT $3",
    retry: "UPDATE messages SET status = 'pending', process_at_ms = $1, attempts = 0, updated_at_ms = $1,
                source_delivery_id = COALESCE(source_delivery_id, delivery_id),
                delivery_id = lower(hex(randomblob(16))), processed_at_ms = NULL, outcome = NULL
            WHERE status NOT IN ('processing', 'awaiting-release')
              AND ($2 IS NULL OR key = $2) AND ($3 IS NULL OR (queue = $3 AND status = $4))
            RETURNING queue, session_key",
};

operator_commands!(SqliteStore, SQL);

//! Retention and operator commands of the PostgreSQL queue store: the shared commands
//! ([`operator_commands!`]) with PostgreSQL's statements.

use super::PostgresStore;
use super::stored;
use crate::queue::manage::{ManageSql, operator_commands};

/// The operator statements in PostgreSQL's words (ids found through their hash index).
const SQL: ManageSql = ManageSql {
    expired_keys: "SELECT key FROM messages WHERE queue = $1 AND status = 'processed' AND processed_at_ms < $2
                   LIMIT $3 FOR UPDATE SKIP LOCKED",
    overflow_keys: "SELECT key FROM (SELECT key FROM messages WHERE queue = $1 AND status = 'processed'
                                     ORDER BY processed_at_ms DESC, key DESC OFFSET $2) old
                    LIMIT $3",
    archive_keys: "INSERT INTO message_history (queue, message_id, message_key, version, delivery_id, payload,
                       headers, priority, status, attempts, last_error, enqueued_at_ms, processed_at_ms, recorded_at_ms)
                   SELECT queue, message_id, key, version, delivery_id, payload, headers, priority, status, attempts,
                          last_error, enqueued_at_ms, processed_at_ms, $2
                   FROM messages WHERE key IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb))
                     AND message_id IS NOT NULL AND status = 'processed'",
    delete_keys: "DELETE FROM messages
                  WHERE key IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb))
                    AND status = 'processed'",
    history: "SELECT * FROM message_history
              WHERE queue = $1 AND wharf_id_hash(message_id) = wharf_id_hash($2) AND message_id = $2
              ORDER BY history_key",
    list: "SELECT * FROM messages
           WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR status = $2)
             AND ($4::text IS NULL OR (wharf_id_hash(message_id) = wharf_id_hash($4) AND message_id = $4))
             AND ($5::bigint IS NULL OR key < $5)
             AND ($6::text IS NULL OR session_key = $6)
           ORDER BY key DESC LIMIT $3",
    retry: "UPDATE messages SET status = 'pending', process_at_ms = $1, attempts = 0, updated_at_ms = $1,
                source_delivery_id = COALESCE(source_delivery_id, delivery_id),
                delivery_id = replace(gen_random_uuid()::text, '-', ''), processed_at_ms = NULL, outcome = NULL
            WHERE status NOT IN ('processing', 'awaiting-release')
              AND ($2::bigint IS NULL OR key = $2) AND ($3::text IS NULL OR (queue = $3 AND status = $4::text))
            RETURNING queue, session_key",
};

operator_commands!(PostgresStore, SQL);

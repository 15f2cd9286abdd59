//! The statements only the PostgreSQL queue store runs: array batches (`UNNEST`), advisory
//! locks on ids, its lease and its batch of completions.

use std::sync::LazyLock;

use crate::queue::inbox_records::insert_postgres;
use crate::queue::sessions;

/// Insert a round of new messages (one array per column, `$1` the queue, `$2` now); an id
/// already stored is skipped. Keys follow the batch order, so first enqueued is first leased.
/// Returns the key of each inserted message with its delivery id.
pub(super) const INSERT_MANY: &str = "
INSERT INTO messages (queue, message_id, delivery_id, payload, payload_hash, headers, priority, status,
                      process_at_ms, created_at_ms, enqueued_at_ms, updated_at_ms, last_error,
                      source_delivery_id, attempts, session_key)
SELECT $1, m.message_id, m.delivery_id, m.payload, m.payload_hash, m.headers, m.priority, m.status,
       m.process_at_ms, $2, $2, $2, m.last_error, m.source_delivery_id, m.attempts, m.session_key
FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int4[], $9::text[],
            $10::int8[], $11::text[], $12::text[], $13::int4[], $14::text[]) WITH ORDINALITY
     AS m(message_id, delivery_id, payload, payload_hash, headers, priority, status, process_at_ms,
          last_error, source_delivery_id, attempts, session_key, position)
ORDER BY m.position
ON CONFLICT (queue, wharf_id_hash(message_id)) WHERE message_id IS NOT NULL DO NOTHING
RETURNING key, delivery_id";

/// Transaction-scoped advisory locks on (queue, id) hashes, taken in sorted order: every
/// enqueue of ids takes them first, so batches with ids in opposite orders queue up instead of
/// deadlocking. (Two-key locks: a space apart from the schema lock's one-key lock.) Row locks
/// of a batch that re-enqueues messages being settled can still meet a settlement's in a
/// cycle; PostgreSQL breaks it and the losing side retries.
pub(super) const LOCK_IDS: &str = "
SELECT count(pg_advisory_xact_lock(k.queue_hash, k.id_hash)) FROM (
    SELECT DISTINCT hashtext($1) AS queue_hash, hashtext(id) AS id_hash
    FROM UNNEST($2::text[]) AS id
    ORDER BY 1, 2) k";

/// Lease up to `$4` ready messages of queue `$3` (`$2` now, until `$1`); `guard` adds a
/// condition on each candidate row (`messages`).
fn lease_with(guard: &str) -> String {
    format!(
        "
UPDATE messages m
SET status = 'processing', attempts = m.attempts + 1, lease_token = m.lease_token + 1,
    lease_expires_at_ms = $1, updated_at_ms = $2
FROM (SELECT key FROM messages
      WHERE queue = $3 AND status IN ('pending', 'sleeping') AND process_at_ms <= $2 {guard}
      ORDER BY priority DESC, process_at_ms, key
      LIMIT $4
      FOR UPDATE SKIP LOCKED) ready
WHERE m.key = ready.key
RETURNING m.key, m.queue, m.message_id, m.delivery_id, m.payload, m.headers, m.priority, m.attempts,
          m.lease_token, m.enqueued_at_ms, m.process_at_ms, m.source_delivery_id, m.session_key"
    )
}

static LEASE: LazyLock<String> = LazyLock::new(|| lease_with(""));
static LEASE_IN_SESSIONS: LazyLock<String> =
    LazyLock::new(|| lease_with(&format!("AND {}", sessions::head_guard())));

/// The lease statement: plain, or leasing only the heads of sessions.
pub(in crate::queue) fn lease(sessions: bool) -> &'static str {
    if sessions {
        LEASE_IN_SESSIONS.as_str()
    } else {
        LEASE.as_str()
    }
}

/// [`LEASE`] with each delivery checked against an inbox table (`{inbox}`, endpoint `$5`):
/// the key is SHA-256 over the length-delimited (endpoint, delivery id) encoding, the same
/// bytes as `InboxKey::new`. A lateral lookup, not `EXISTS`: PostgreSQL turns an uncorrelated
/// `EXISTS` into a hashed sub-plan that scans the whole inbox table on every lease.
pub(in crate::queue) fn lease_checking_inbox(inbox_table: &str, sessions: bool) -> String {
    let lease = lease(sessions);
    format!(
        "WITH leased AS ({lease})
SELECT leased.*, seen.hit IS NOT NULL AS inbox_processed
FROM leased LEFT JOIN LATERAL (
    SELECT 1 AS hit FROM {inbox_table} i
    WHERE i.id_hash = sha256(int8send(octet_length($5::text)::bigint) || convert_to($5::text, 'UTF8')
                             || int8send(octet_length(leased.delivery_id)::bigint)
                             || convert_to(leased.delivery_id, 'UTF8'))
      AND i.expires_at_ms > $2
    LIMIT 1) seen ON true"
    )
}

/// Complete the leases of the arrays `$2` (keys), `$3` (tokens) and `$4` (outcomes) kept as
/// processed (`$1` now), in one statement; returns the leases it completed.
pub(super) const COMPLETE_MANY: &str = "
UPDATE messages m SET status = 'processed', processed_at_ms = $1, updated_at_ms = $1, lease_expires_at_ms = NULL,
                      outcome = done.outcome
FROM UNNEST($2::bigint[], $3::bigint[], $4::text[]) AS done(key, token, outcome)
WHERE m.key = done.key AND m.lease_token = done.token AND m.status = 'processing'
RETURNING m.key, m.lease_token";

/// [`COMPLETE_MANY`] writing inbox records into `{inbox_table}` in the same statement
/// (`$5` their expiry; `$6`, `$7`, `$8` their hashes, endpoints and MessageIds). Records are
/// inserted in hash order, so two batches recording the same keys never wait on each other
/// in a cycle.
pub(super) fn complete_recording_inbox(inbox_table: &str) -> String {
    let record = insert_postgres(inbox_table, [6, 7, 8, 1, 5]);
    format!("WITH recorded AS ({record})\n{COMPLETE_MANY}")
}

//! The outbox: follow-ups for external queues, written as rows of `wharf_outbox` in the
//! transaction that commits their handler's outcome, then published into the broker by a
//! relay and deleted. A relay claims rows with a lease (`claimed_until_ms`) in one
//! serialized step, never a queue that another relay holds rows of, so two hosts do not
//! publish one row, and one queue's rows go out in the order they were committed.

use crate::headers;
use crate::sql::{Conn, Pool, Sql};

use super::{FollowUp, QueueError};

/// Where a follow-up for an external queue goes: the outbox row's details besides its
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The `[providers.NAME]` name of the target queue.
    pub provider: String,
    /// The MessageId it is published with, the same on every try (the handler's `id`, else
    /// one derived from the source delivery and the follow-up's position).
    pub message_id: Option<String>,
    /// When it is due, for a provider with native delay.
    pub due_at_ms: Option<i64>,
}

/// One claimed outbox row.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Its key.
    pub key: i64,
    /// The target queue.
    pub queue: String,
    /// The provider it was staged for.
    pub provider: String,
    /// Its MessageId.
    pub message_id: String,
    /// The message JSON.
    pub payload: String,
    /// Its priority.
    pub priority: i32,
    /// Its session key.
    pub session: Option<String>,
    /// When it is due (native delay).
    pub due_at_ms: Option<i64>,
    /// When it was committed.
    pub created_at_ms: i64,
    /// Publications tried, this one included.
    pub attempts: i32,
    /// Its trace context (`traceparent`, `tracestate`), published beside it.
    pub trace: Vec<(String, String)>,
}

/// The outbox of one target queue, for operators.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutboxBacklog {
    /// The target queue.
    pub queue: String,
    /// Rows not published yet.
    pub rows: u64,
    /// When the oldest was committed (Unix ms).
    pub oldest_ms: i64,
    /// The last publication error, if the oldest row failed to publish.
    pub last_error: Option<String>,
}

/// The columns of an outbox row as written, one `$N` per column.
const INSERT_COLUMNS: &str = "INSERT INTO wharf_outbox (queue, provider, message_id, payload, priority, session, due_at_ms, created_at_ms, traceparent, tracestate) VALUES ";

/// Parameters per row.
const COLUMNS: usize = 10;

/// Rows per insert statement (within both dialects' parameter limits).
const INSERT_ROWS: usize = 500;

/// Rows free to claim, oldest first, of queues no relay holds rows of.
const CLAIM: Sql = Sql::both(
    "UPDATE wharf_outbox SET claimed_until_ms = $1, claimed_by = $2, attempts = attempts + 1 \
     WHERE key IN (SELECT key FROM wharf_outbox WHERE claimed_until_ms <= $3 \
       AND queue NOT IN (SELECT queue FROM wharf_outbox WHERE claimed_until_ms > $3) \
       ORDER BY key LIMIT $4) \
     RETURNING key, queue, provider, message_id, payload, priority, session, due_at_ms, created_at_ms, attempts, traceparent, tracestate",
);

/// One relay claims at a time (PostgreSQL; SQLite has one writer anyway).
const CLAIM_LOCK: &str = "SELECT pg_advisory_xact_lock(7370851217423590001)";

const DELETE: Sql = Sql::each(
    "DELETE FROM wharf_outbox WHERE key IN (SELECT value FROM json_each($1))",
    "DELETE FROM wharf_outbox WHERE key IN (SELECT (jsonb_array_elements_text($1::jsonb))::bigint)",
);

const FAILED: Sql = Sql::each(
    "UPDATE wharf_outbox SET claimed_until_ms = $1, claimed_by = NULL, last_error = $2 \
     WHERE key IN (SELECT value FROM json_each($3))",
    "UPDATE wharf_outbox SET claimed_until_ms = $1, claimed_by = NULL, last_error = $2 \
     WHERE key IN (SELECT (jsonb_array_elements_text($3::jsonb))::bigint)",
);

const BACKLOG: Sql = Sql::both(
    "SELECT o.queue, COUNT(*), MIN(o.created_at_ms), \
       (SELECT f.last_error FROM wharf_outbox f WHERE f.queue = o.queue ORDER BY f.key LIMIT 1) \
     FROM wharf_outbox o GROUP BY o.queue ORDER BY o.queue",
);

/// Write the outbox rows of `follow_ups` (those with an [`OutboxEntry`]) on `conn`, in the
/// caller's transaction, in order: one multi-row insert per [`INSERT_ROWS`].
pub(crate) async fn insert(
    conn: &mut Conn<'_>,
    follow_ups: &[&FollowUp],
    now: i64,
) -> Result<(), QueueError> {
    for chunk in follow_ups.chunks(INSERT_ROWS) {
        let mut text = String::from(INSERT_COLUMNS);
        for n in 0..chunk.len() {
            if n > 0 {
                text.push_str(", ");
            }
            let row: Vec<String> = (1..=COLUMNS)
                .map(|c| format!("${}", n * COLUMNS + c))
                .collect();
            text.push_str(&format!("({})", row.join(", ")));
        }
        let mut query = conn.query(text);
        for f in chunk {
            let entry = f.outbox.as_ref().expect("an outbox follow-up");
            let message_id = entry
                .message_id
                .clone()
                .unwrap_or_else(super::new_delivery_id);
            query = query
                .bind(f.queue.as_str())
                .bind(entry.provider.as_str())
                .bind(message_id)
                .bind(f.message.payload.as_str())
                .bind(f.message.priority)
                .bind(f.message.session.as_deref())
                .bind(entry.due_at_ms)
                .bind(now)
                .bind(headers::value(&f.message.headers, headers::TRACEPARENT))
                .bind(headers::value(&f.message.headers, headers::TRACESTATE));
        }
        query.execute().await?;
    }
    Ok(())
}

/// Claim up to `max` rows for `holder` until `now + lease_ms`, in key order.
pub(crate) async fn claim(
    pool: &Pool,
    holder: &str,
    max: u32,
    lease_ms: i64,
    now: i64,
) -> Result<Vec<OutboxRow>, QueueError> {
    let mut tx = pool.begin().await?;
    let mut conn = tx.conn();
    if let Conn::Postgres(_) = conn {
        conn.query(CLAIM_LOCK).execute().await?;
    }
    let rows = conn
        .query(&CLAIM)
        .bind(now + lease_ms)
        .bind(holder)
        .bind(now)
        .bind(i64::from(max))
        .fetch_all()
        .await?;
    let mut claimed = rows
        .iter()
        .map(|r| {
            Ok(OutboxRow {
                key: r.get(0)?,
                queue: r.get(1)?,
                provider: r.get(2)?,
                message_id: r.get(3)?,
                payload: r.get(4)?,
                priority: r.get(5)?,
                session: r.get(6)?,
                due_at_ms: r.get(7)?,
                created_at_ms: r.get(8)?,
                attempts: r.get(9)?,
                trace: [
                    (crate::headers::TRACEPARENT, r.get::<Option<String>, _>(10)?),
                    (crate::headers::TRACESTATE, r.get::<Option<String>, _>(11)?),
                ]
                .into_iter()
                .filter_map(|(name, value)| Some((name.to_string(), value?)))
                .collect(),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    tx.commit().await?;
    claimed.sort_by_key(|r| r.key);
    Ok(claimed)
}

/// Delete published rows.
pub(crate) async fn published(pool: &Pool, keys: &[i64]) -> Result<(), QueueError> {
    pool.query(&DELETE).bind(keys_json(keys)).execute().await?;
    Ok(())
}

/// Keep rows whose publication failed, claimable again at `retry_at_ms`.
pub(crate) async fn failed(
    pool: &Pool,
    keys: &[i64],
    error: &str,
    retry_at_ms: i64,
) -> Result<(), QueueError> {
    pool.query(&FAILED)
        .bind(retry_at_ms)
        .bind(error)
        .bind(keys_json(keys))
        .execute()
        .await?;
    Ok(())
}

/// The backlog per target queue.
pub(crate) async fn backlog(pool: &Pool) -> Result<Vec<OutboxBacklog>, QueueError> {
    let rows = pool.query(&BACKLOG).fetch_all().await?;
    rows.iter()
        .map(|r| {
            Ok(OutboxBacklog {
                queue: r.get(0)?,
                rows: r.get::<i64, _>(1)? as u64,
                oldest_ms: r.get(2)?,
                last_error: r.get(3)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(QueueError::from)
}

fn keys_json(keys: &[i64]) -> String {
    serde_json::to_string(keys).expect("keys serialize")
}

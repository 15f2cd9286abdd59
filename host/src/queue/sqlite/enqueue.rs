//! What only SQLite does in an enqueue: new messages arrive as one multi-row
//! `INSERT … VALUES (…), (…)` per round. (Its writers take turns anyway, so ids need no locks.)

use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

use crate::queue::QueueError;
use crate::queue::prepared::Prepared;

/// Insert the messages of `round` whose id is not stored yet; returns the key and delivery id
/// of each inserted one.
pub(in crate::queue) async fn insert_new(
    conn: &mut SqliteConnection,
    queue: &str,
    round: &[&Prepared],
    now: i64,
) -> Result<Vec<(i64, String)>, QueueError> {
    let mut insert = QueryBuilder::<Sqlite>::new(
        "INSERT INTO messages (queue, message_id, delivery_id, payload, payload_hash, headers,
            priority, status, process_at_ms, created_at_ms, enqueued_at_ms, updated_at_ms,
            last_error, source_delivery_id, attempts, session_key) ",
    );
    insert.push_values(round, |mut row, m| {
        row.push_bind(queue)
            .push_bind(m.message.id.as_deref())
            .push_bind(m.delivery_id.as_str())
            .push_bind(m.message.payload.as_str())
            .push_bind(m.hash.as_str())
            .push_bind(m.headers.as_str())
            .push_bind(m.message.priority)
            .push_bind(m.status.as_str())
            .push_bind(m.at)
            .push_bind(now)
            .push_bind(now)
            .push_bind(now)
            .push_bind(m.message.last_error.as_deref())
            .push_bind(m.message.source_delivery_id.as_deref())
            .push_bind(m.message.attempts as i64)
            .push_bind(m.message.session.as_deref());
    });
    insert.push(
        " ON CONFLICT (queue, message_id) WHERE message_id IS NOT NULL DO NOTHING
          RETURNING key, delivery_id",
    );
    let rows = insert.build().fetch_all(conn).await?;
    let returned = rows
        .iter()
        .map(|r| Ok((r.try_get("key")?, r.try_get("delivery_id")?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(returned)
}

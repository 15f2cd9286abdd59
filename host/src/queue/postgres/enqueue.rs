//! What only PostgreSQL does in an enqueue: new messages arrive as one
//! `INSERT … SELECT FROM UNNEST(arrays)` per round, so a batch of a thousand costs one
//! statement, not a thousand; and ids are locked in one global order first.

use sqlx::{PgConnection, Row};

use super::statements::{INSERT_MANY, LOCK_IDS};
use crate::queue::QueueError;
use crate::queue::prepared::Prepared;

/// Serialise with other enqueues of the same ids until the transaction ends, taking the
/// locks in one global order so two batches never wait for each other in a cycle.
pub(in crate::queue) async fn lock_ids(
    conn: &mut PgConnection,
    queue: &str,
    ids: Vec<&str>,
) -> Result<(), QueueError> {
    sqlx::query(LOCK_IDS)
        .bind(queue)
        .bind(ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// Insert the messages of `round` whose id is not stored yet; returns the key and delivery id
/// of each inserted one.
pub(in crate::queue) async fn insert_new(
    conn: &mut PgConnection,
    queue: &str,
    round: &[&Prepared],
    now: i64,
) -> Result<Vec<(i64, String)>, QueueError> {
    let column = |f: fn(&Prepared) -> Option<String>| -> Vec<Option<String>> {
        round.iter().map(|m| f(m)).collect()
    };
    let rows = sqlx::query(INSERT_MANY)
        .bind(queue)
        .bind(now)
        .bind(column(|m| m.message.id.clone()))
        .bind(column(|m| Some(m.delivery_id.clone())))
        .bind(column(|m| Some(m.message.payload.clone())))
        .bind(column(|m| Some(m.hash.clone())))
        .bind(column(|m| Some(m.headers.clone())))
        .bind(
            round
                .iter()
                .map(|m| m.message.priority)
                .collect::<Vec<i32>>(),
        )
        .bind(column(|m| Some(m.status.as_str().to_string())))
        .bind(round.iter().map(|m| m.at).collect::<Vec<i64>>())
        .bind(column(|m| m.message.last_error.clone()))
        .bind(column(|m| m.message.source_delivery_id.clone()))
        .bind(
            round
                .iter()
                .map(|m| m.message.attempts as i32)
                .collect::<Vec<i32>>(),
        )
        .bind(column(|m| m.message.session.clone()))
        .fetch_all(conn)
        .await?;
    let returned = rows
        .iter()
        .map(|r| Ok((r.try_get("key")?, r.try_get("delivery_id")?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(returned)
}

//! Completions on PostgreSQL: those that keep their message are one `UPDATE … FROM UNNEST`
//! for the whole batch, with the batch's inbox records in the same statement when asked.

use std::collections::HashSet;

use sqlx::{AssertSqlSafe, PgConnection};

use super::statements::{COMPLETE_MANY, complete_recording_inbox};
use crate::queue::{InboxWrite, Lease, QueueError, Settlement};

/// Complete `completes` (kept, with their outcome) and write `inbox` in one statement;
/// returns the leases done.
pub(in crate::queue) async fn complete(
    conn: &mut PgConnection,
    completes: &[&Settlement],
    inbox: Option<&InboxWrite>,
    now: i64,
) -> Result<HashSet<Lease>, QueueError> {
    let keys: Vec<i64> = completes.iter().map(|s| s.lease.key).collect();
    let tokens: Vec<i64> = completes.iter().map(|s| s.lease.token).collect();
    let outcomes: Vec<Option<&str>> = completes.iter().map(|s| s.outcome.as_deref()).collect();
    let sql = match inbox {
        Some(write) => complete_recording_inbox(&write.table),
        None => COMPLETE_MANY.to_string(),
    };
    let mut query = sqlx::query_as::<_, (i64, i64)>(AssertSqlSafe(sql))
        .bind(now)
        .bind(&keys)
        .bind(&tokens)
        .bind(&outcomes);
    if let Some(write) = inbox {
        let hashes: Vec<&[u8]> = write.rows.iter().map(|k| &k.hash[..]).collect();
        let endpoints: Vec<&str> = write.rows.iter().map(|k| k.endpoint.as_str()).collect();
        let ids: Vec<&str> = write.rows.iter().map(|k| k.message_id.as_str()).collect();
        query = query
            .bind(now + write.retention_ms)
            .bind(hashes)
            .bind(endpoints)
            .bind(ids);
    }
    let done = query.fetch_all(conn).await?;
    Ok(done
        .into_iter()
        .map(|(key, token)| Lease { key, token })
        .collect())
}

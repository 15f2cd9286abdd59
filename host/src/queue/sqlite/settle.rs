//! Completions on SQLite: those that keep their message are one statement for the whole
//! batch, the leases travelling as one JSON array.

use std::collections::HashSet;

use sqlx::{Row, SqliteConnection};

use super::statements::COMPLETE_MANY;
use crate::queue::{Lease, QueueError, Settlement};

/// Complete `completes` (kept as processed, with their outcome); returns the leases done.
pub(in crate::queue) async fn complete(
    conn: &mut SqliteConnection,
    completes: &[&Settlement],
    now: i64,
) -> Result<HashSet<Lease>, QueueError> {
    let done: Vec<(i64, i64, Option<&str>)> = completes
        .iter()
        .map(|s| (s.lease.key, s.lease.token, s.outcome.as_deref()))
        .collect();
    let done = serde_json::to_string(&done).expect("leases serialize");
    let rows = sqlx::query(COMPLETE_MANY)
        .bind(now)
        .bind(done)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Lease {
                key: r.try_get("key")?,
                token: r.try_get("lease_token")?,
            })
        })
        .collect()
}

//! Commit marks: for a broker message processed without the SQL inbox, a row per delivery
//! whose follow-ups were committed, written in that commit's transaction. A redelivery
//! after the commit but before the broker's acknowledgement (a crash, a lost connection)
//! runs the handler again; its commit finds the mark and writes nothing, so the follow-ups
//! still exist once. Marks expire after [`MARK_RETENTION_MS`]; expired ones are deleted by
//! the commits themselves, at most once a minute per process.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::sql::{Conn, Sql};

use super::QueueError;

/// How long a delivery's mark is kept: a redelivery later than this commits again.
pub const MARK_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// How often a process deletes expired marks.
const SWEEP_EVERY_MS: i64 = 60_000;

/// Expired marks deleted per sweep.
const SWEEP_ROWS: i64 = 1000;

static LAST_SWEEP_MS: AtomicI64 = AtomicI64::new(0);

/// Which delivery's follow-ups a commit writes: the source queue and an identity of the
/// delivery that is the same on every redelivery (the envelope's MessageId or the broker's
/// own delivery identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitMark {
    /// The source queue.
    pub queue: String,
    /// The delivery's stable identity.
    pub delivery: String,
}

const SWEEP: Sql = Sql::both(
    "DELETE FROM wharf_follow_up_commits WHERE (queue, delivery) IN \
     (SELECT queue, delivery FROM wharf_follow_up_commits WHERE expires_at_ms <= $1 LIMIT $2)",
);

/// Write `marks` (distinct) on `conn`, in the caller's transaction; returns the ones that are
/// new (or took over an expired mark): the others' deliveries were committed before.
pub(crate) async fn mark_many(
    conn: &mut Conn<'_>,
    marks: &[&CommitMark],
    now: i64,
) -> Result<HashSet<(String, String)>, QueueError> {
    let mut new = HashSet::new();
    if marks.is_empty() {
        return Ok(new);
    }
    sweep(conn, now).await?;
    for chunk in marks.chunks(1000) {
        let values = (0..chunk.len())
            .map(|i| format!("(${}, ${}, ${})", 3 * i + 2, 3 * i + 3, 3 * i + 4))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "INSERT INTO wharf_follow_up_commits (queue, delivery, expires_at_ms) VALUES {values} \
             ON CONFLICT (queue, delivery) DO UPDATE SET expires_at_ms = excluded.expires_at_ms \
             WHERE wharf_follow_up_commits.expires_at_ms <= $1 RETURNING queue, delivery"
        );
        let mut query = conn.query(text).bind(now);
        for mark in chunk {
            query = query
                .bind(mark.queue.as_str())
                .bind(mark.delivery.as_str())
                .bind(now + MARK_RETENTION_MS);
        }
        for row in query.fetch_all().await? {
            new.insert((row.get("queue")?, row.get("delivery")?));
        }
    }
    Ok(new)
}

/// Remove `marks` (of commits that were left out after all), in the caller's transaction.
pub(crate) async fn unmark(conn: &mut Conn<'_>, marks: &[&CommitMark]) -> Result<(), QueueError> {
    const UNMARK: Sql =
        Sql::both("DELETE FROM wharf_follow_up_commits WHERE queue = $1 AND delivery = $2");
    for mark in marks {
        conn.query(&UNMARK)
            .bind(mark.queue.as_str())
            .bind(mark.delivery.as_str())
            .execute()
            .await?;
    }
    Ok(())
}

/// Delete expired marks, at most once a minute per process.
async fn sweep(conn: &mut Conn<'_>, now: i64) -> Result<(), QueueError> {
    let last = LAST_SWEEP_MS.load(Ordering::Relaxed);
    if now - last >= SWEEP_EVERY_MS
        && LAST_SWEEP_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        conn.query(&SWEEP)
            .bind(now)
            .bind(SWEEP_ROWS)
            .execute()
            .await?;
    }
    Ok(())
}

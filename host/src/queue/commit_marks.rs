//! Commit marks: for a broker message processed without the SQL inbox, a row per delivery
//! whose follow-ups were committed, written in that commit's transaction. A redelivery
//! after the commit but before the broker's acknowledgement (a crash, a lost connection)
//! runs the handler again; its commit finds the mark and writes nothing, so the follow-ups
//! still exist once. Marks expire after [`MARK_RETENTION_MS`]; expired ones are deleted by
//! the commits themselves, at most once a minute per process.

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

/// A new mark, or an expired one taken over; a live mark stays as it is.
const MARK: Sql = Sql::both(
    "INSERT INTO wharf_follow_up_commits (queue, delivery, expires_at_ms) VALUES ($1, $2, $3) \
     ON CONFLICT (queue, delivery) DO UPDATE SET expires_at_ms = excluded.expires_at_ms \
     WHERE wharf_follow_up_commits.expires_at_ms <= $4",
);

const SWEEP: Sql = Sql::both(
    "DELETE FROM wharf_follow_up_commits WHERE (queue, delivery) IN \
     (SELECT queue, delivery FROM wharf_follow_up_commits WHERE expires_at_ms <= $1 LIMIT $2)",
);

/// Write `mark` on `conn`, in the caller's transaction. False when the delivery's follow-ups
/// were committed before (a live mark exists): the caller then writes nothing.
pub(crate) async fn mark(
    conn: &mut Conn<'_>,
    mark: &CommitMark,
    now: i64,
) -> Result<bool, QueueError> {
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
    let written = conn
        .query(&MARK)
        .bind(mark.queue.as_str())
        .bind(mark.delivery.as_str())
        .bind(now + MARK_RETENTION_MS)
        .bind(now)
        .execute()
        .await?;
    Ok(written == 1)
}

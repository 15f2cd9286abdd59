//! Ordered sessions on SQLite ([`crate::queue::sessions`] holds the rules and the SQL):
//! tending sessions in the caller's transaction, leasing only session heads, settling
//! handoffs and listing blocked sessions.

use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::statements::{TEND, lease};
use crate::queue::rows::{decode_headers, leased_in_order};
use crate::queue::sessions::{BLOCKED, SETTLE_HANDOFF, by_queue};
use crate::queue::{BlockedSession, InboxProbe, Lease, LeasedMessage, QueueError, Status, now_ms};

/// Park and drain the sessions of `queue`: those in the JSON array `sessions`, or with
/// `None` every session of the queue with a blocker or parked messages.
pub(super) async fn tend(
    conn: &mut SqliteConnection,
    queue: &str,
    sessions: Option<&str>,
    now: i64,
) -> Result<(), QueueError> {
    let (park, drain) = match sessions {
        Some(_) => (&TEND.park_listed, &TEND.drain_listed),
        None => (&TEND.park_troubled, &TEND.drain_troubled),
    };
    for sql in [park, drain] {
        let mut statement = sqlx::query(sql.as_str()).bind(queue).bind(now);
        if let Some(list) = sessions {
            statement = statement.bind(list);
        }
        statement.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Tend the sessions of the messages an operator command changed (their queue and session,
/// as its `RETURNING` gave them).
pub(super) async fn tend_touched(
    conn: &mut SqliteConnection,
    touched: &[(String, Option<String>)],
    now: i64,
) -> Result<(), QueueError> {
    let pairs = touched
        .iter()
        .filter_map(|(queue, session)| Some((queue.as_str(), session.as_deref()?)));
    for (queue, list) in by_queue(pairs) {
        tend(conn, queue, Some(&list), now).await?;
    }
    Ok(())
}

impl SqliteStore {
    /// Lease session heads (see [`crate::queue::QueueStore::lease_in_sessions`]).
    pub(super) async fn lease_heads(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
        inbox: Option<&InboxProbe>,
    ) -> Result<Vec<LeasedMessage>, QueueError> {
        let now = now_ms();
        // SQLite's leases do not check the inbox (the pipeline checks it).
        let _ = inbox;
        let rows = sqlx::query(lease(true))
            .bind(now + lease_ms)
            .bind(now)
            .bind(queue)
            .bind(max as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(leased_in_order!(rows))
    }

    /// Settle a handed-off message (see [`crate::queue::QueueStore::settle_handoff`]).
    pub(super) async fn settle_handoff_now(
        &self,
        key: i64,
        failure: Option<&str>,
    ) -> Result<bool, QueueError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let status = if failure.is_some() {
            "failed"
        } else {
            "processed"
        };
        let touched: Vec<(String, Option<String>)> = sqlx::query_as(SETTLE_HANDOFF)
            .bind(now)
            .bind(status)
            .bind(key)
            .bind(failure)
            .fetch_all(&mut *tx)
            .await?;
        tend_touched(&mut tx, &touched, now).await?;
        tx.commit().await?;
        Ok(!touched.is_empty())
    }

    /// Tend every troubled session of a queue (see [`crate::queue::QueueStore::tend_sessions`]).
    pub(super) async fn tend_queue(&self, queue: &str) -> Result<(), QueueError> {
        let mut tx = self.pool.begin().await?;
        tend(&mut tx, queue, None, now_ms()).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Blocked sessions (see [`crate::queue::QueueStore::blocked_sessions`]).
    pub(super) async fn blocked_now(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BlockedSession>, QueueError> {
        let rows = sqlx::query(BLOCKED)
            .bind(queue)
            .bind(limit as i64)
            .fetch_all(self.readers())
            .await?;
        rows.iter()
            .map(|r| {
                Ok(BlockedSession {
                    queue: r.try_get("queue")?,
                    session: r.try_get("session_key")?,
                    blocked_by_key: r.try_get("key")?,
                    blocked_by_id: r.try_get("message_id")?,
                    blocked_by_delivery_id: r.try_get("blocker_delivery")?,
                    status: Status::parse(r.try_get::<&str, _>("status")?),
                    last_error: r.try_get("last_error")?,
                    parked: r.try_get::<i64, _>("parked")? as u64,
                    since_ms: r.try_get("updated_at_ms")?,
                })
            })
            .collect()
    }
}

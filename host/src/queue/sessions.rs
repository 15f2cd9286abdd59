//! Ordered sessions, for queues with `sessions = true`: messages that share a session key run
//! one at a time, in key (enqueue) order, across every host. The rules live in the SQL below,
//! shared by both dialects:
//!
//! - **Head**: a session message may be leased only when no other message of its session is
//!   in flight (`processing`, `awaiting-release`) and none ahead of it (a smaller key) is
//!   waiting (`pending`, `sleeping`, `parked`) or blocking (`failed`, `handed-off`). Priority
//!   orders sessions between themselves, never messages inside one. A message older than the
//!   blocker (a redelivery of one that already ran) may still run: the consumer inbox checks
//!   it before any session rule, and a session blocked by a later message stays blocked.
//! - **Block**: a message that fails (permanently, out of attempts, or abandoned) or is
//!   handed off blocks its session; the later messages of the session are **parked**, and a
//!   message enqueued into a blocked session is parked at once.
//! - **Resolve and drain**: the block lasts while the blocker is `failed` or `handed-off`, and
//!   while an operator's retry of it is on its way; once it is processed, deleted, moved to
//!   another status, or its handoff is settled, the parked messages become ready again and
//!   run in order. A failed handoff (`wharf messages fail`) is an operator's decision and does
//!   not block (its `outcome` says so).
//!
//! Blocking is read from the messages themselves, so there is no separate state that a crash
//! could leave behind: parking and draining happen in the transaction that changes the
//! blocker, and every housekeeping pass tends the queue's blocked sessions again.

/// Every status a session message can have while it still matters for its session's order;
/// the partial index `messages_session` holds exactly these rows. Queries repeat this list
/// word for word so both dialects see they may use the index.
pub(crate) const SESSION_STATUSES: &str =
    "('pending', 'sleeping', 'parked', 'processing', 'awaiting-release', 'failed', 'handed-off')";

/// The outcome kept on a handed-off message that an operator settled as failed: it stays
/// failed for inspection and does not block its session.
pub const HANDOFF_FAILED: &str = "handoff failed";

/// The outcome kept on a handed-off message that an operator settled as completed.
pub const HANDOFF_COMPLETED: &str = "handoff completed";

/// A condition on the row `messages` (the candidate being leased): true when it is not in a
/// session, or is its session's head.
pub(crate) fn head_guard() -> String {
    format!(
        "(messages.session_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM messages s
    WHERE s.queue = messages.queue AND s.session_key = messages.session_key
      AND s.session_key IS NOT NULL AND s.status IN {SESSION_STATUSES}
      AND s.key <> messages.key
      AND (s.status IN ('processing', 'awaiting-release')
           OR (s.key < messages.key
               AND (s.status IN ('pending', 'sleeping', 'parked', 'handed-off')
                    OR (s.status = 'failed' AND s.outcome IS NULL))))))"
    )
}

/// The condition, on a row aliased `b`, of a message that blocks its session; the same words
/// as the partial index `messages_session_blockers`, so both dialects use it.
const BLOCKER: &str = "b.session_key IS NOT NULL \
    AND (b.status = 'handed-off' OR (b.status = 'failed' AND b.outcome IS NULL))";

/// Park the ready messages of the sessions `set` (an SQL set expression) of queue `$1` that
/// wait behind a blocker (`$2`: now). The blocked sessions among `set` are found first, through
/// the small index of blockers, so a large `set` without blockers costs one probe per key.
pub(crate) fn park(set: &str) -> String {
    format!(
        "UPDATE messages SET status = 'parked', updated_at_ms = $2
WHERE queue = $1
  AND session_key IN (SELECT b.session_key FROM messages b
                      WHERE b.queue = $1 AND b.session_key IN ({set}) AND {BLOCKER})
  AND session_key IS NOT NULL AND status IN {SESSION_STATUSES} AND status IN ('pending', 'sleeping')
  AND EXISTS (
    SELECT 1 FROM messages b
    WHERE b.queue = messages.queue AND b.session_key = messages.session_key AND {BLOCKER}
      AND b.key < messages.key)"
    )
}

/// Make the parked messages of the sessions `set` of queue `$1` ready again (`$2`: now) where
/// nothing blocks them any more and nothing older of their session is still on its way.
pub(crate) fn drain(set: &str) -> String {
    format!(
        "UPDATE messages SET status = CASE WHEN process_at_ms > $2 THEN 'sleeping' ELSE 'pending' END,
    updated_at_ms = $2
WHERE queue = $1 AND session_key IN ({set})
  AND session_key IS NOT NULL AND status IN {SESSION_STATUSES} AND status = 'parked'
  AND NOT EXISTS (
    SELECT 1 FROM messages b
    WHERE b.queue = messages.queue AND b.session_key = messages.session_key
      AND b.session_key IS NOT NULL AND b.status IN {SESSION_STATUSES}
      AND b.key <> messages.key
      AND (b.status = 'handed-off' OR (b.status = 'failed' AND b.outcome IS NULL)
           OR (b.status IN ('pending', 'sleeping', 'processing', 'awaiting-release')
               AND b.key < messages.key)))"
    )
}

/// The sessions of queue `$1` that have a blocker or parked messages: what a housekeeping
/// pass tends.
pub(crate) const TROUBLED: &str = "SELECT session_key FROM messages
    WHERE queue = $1 AND session_key IS NOT NULL
      AND status IN ('failed', 'handed-off', 'parked')";

/// The blocked sessions (of queue `$1`, or every queue when it is NULL), oldest block first.
pub(crate) const BLOCKED: &str = "
SELECT b.queue, b.session_key, b.key, b.message_id, COALESCE(b.source_delivery_id, b.delivery_id) AS blocker_delivery,
       b.status, b.last_error, b.updated_at_ms,
       (SELECT COUNT(*) FROM messages p
        WHERE p.queue = b.queue AND p.session_key = b.session_key
          AND p.session_key IS NOT NULL AND p.status IN ('pending', 'sleeping', 'parked', 'processing', 'awaiting-release', 'failed', 'handed-off')
          AND p.status = 'parked') AS parked
FROM messages b
WHERE (CAST($1 AS TEXT) IS NULL OR b.queue = $1) AND b.session_key IS NOT NULL
  AND (b.status = 'handed-off' OR (b.status = 'failed' AND b.outcome IS NULL))
ORDER BY b.updated_at_ms, b.key
LIMIT $2";

/// Which sessions of queue `$1` among `set` have a message waiting, in flight or blocking:
/// every status the partial index holds, except a failure an operator already decided on.
pub(crate) fn live(set: &str) -> String {
    format!(
        "SELECT DISTINCT session_key FROM messages
WHERE queue = $1 AND session_key IN ({set})
  AND session_key IS NOT NULL AND status IN {SESSION_STATUSES}
  AND NOT (status = 'failed' AND outcome IS NOT NULL)"
    )
}

/// Settle a handed-off message `$3` (`$1` now): completed (`$2` = 'processed') or failed
/// (`$2` = 'failed', error `$4`), with outcome `$5`. Returns its queue and session.
pub(crate) const SETTLE_HANDOFF: &str = "
UPDATE messages SET status = $2, updated_at_ms = $1,
    processed_at_ms = CASE WHEN $2 = 'processed' THEN $1 ELSE processed_at_ms END,
    last_error = CASE WHEN $2 = 'failed' THEN $4 ELSE last_error END,
    outcome = $5
WHERE key = $3 AND status = 'handed-off'
RETURNING queue, session_key";

/// Keep a leased session message handed off (fenced like every settlement).
pub(crate) const HAND_OFF: &str = "
UPDATE messages SET status = 'handed-off', updated_at_ms = $1, lease_expires_at_ms = NULL,
    outcome = 'pending-handoff'
WHERE key = $2 AND lease_token = $3 AND status = 'processing'";

/// The session statements of one dialect, built from its way of reading a JSON array of
/// session keys from `$3`.
pub(crate) struct TendSql {
    /// Park behind blockers in the listed sessions.
    pub park_listed: String,
    /// Drain the listed sessions.
    pub drain_listed: String,
    /// Park behind blockers in every troubled session of the queue.
    pub park_troubled: String,
    /// Drain every troubled session of the queue.
    pub drain_troubled: String,
    /// Which of the sessions in the JSON array `$2` of queue `$1` have a message that still
    /// matters for their order (see [`live`]).
    pub live_listed: String,
    /// Which of the MessageIds in the JSON array `$2` name a session message of queue `$1`.
    pub held_listed: String,
}

impl TendSql {
    /// The statements for a dialect whose set expression over the JSON array `$3` is `listed`.
    pub fn new(listed: &str) -> Self {
        TendSql {
            park_listed: park(listed),
            drain_listed: drain(listed),
            park_troubled: park(TROUBLED),
            drain_troubled: drain(TROUBLED),
            live_listed: live(&listed.replace("$3", "$2")),
            held_listed: format!(
                "SELECT message_id FROM messages
WHERE queue = $1 AND message_id IN ({}) AND session_key IS NOT NULL",
                listed.replace("$3", "$2")
            ),
        }
    }
}

/// Group `(queue, session)` pairs by queue, each queue's sessions as a JSON array (the form
/// the dialects' set expressions read), without repeats.
pub(crate) fn by_queue<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(&'a str, String)> {
    let mut grouped: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        std::collections::BTreeMap::new();
    for (queue, session) in pairs {
        grouped.entry(queue).or_default().insert(session);
    }
    grouped
        .into_iter()
        .map(|(queue, sessions)| {
            let list: Vec<&str> = sessions.into_iter().collect();
            (
                queue,
                serde_json::to_string(&list).expect("strings serialize"),
            )
        })
        .collect()
}

/// Implement the session commands shared by both dialects, in a store module that defines
/// `$store` (with a `pool` for writes and `readers()`), on connections of type `$conn`, with
/// that dialect's [`TendSql`] `$tend`: `tend`, `park` (an enqueue's) and `tend_touched`, in
/// the caller's transaction, and the store's `settle_handoff_now`, `tend_queue` and
/// `blocked_now`.
macro_rules! session_commands {
    ($store:ty, $conn:ty, $tend:expr) => {
        /// Park and drain the sessions of `queue`: those in the JSON array `sessions`, or with
        /// `None` every session of the queue with a blocker or parked messages.
        pub(super) async fn tend(
            conn: &mut $conn,
            queue: &str,
            sessions: Option<&str>,
            now: i64,
        ) -> Result<(), $crate::queue::QueueError> {
            let tend: &$crate::queue::sessions::TendSql = &$tend;
            let (park, drain) = match sessions {
                Some(_) => (&tend.park_listed, &tend.drain_listed),
                None => (&tend.park_troubled, &tend.drain_troubled),
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

        /// Park what waits behind a blocker in the sessions in the JSON array `sessions` of
        /// `queue` (what an enqueue into a blocked session needs; nothing there can drain).
        pub(super) async fn park(
            conn: &mut $conn,
            queue: &str,
            sessions: &str,
            now: i64,
        ) -> Result<(), $crate::queue::QueueError> {
            let tend: &$crate::queue::sessions::TendSql = &$tend;
            sqlx::query(tend.park_listed.as_str())
                .bind(queue)
                .bind(now)
                .bind(sessions)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        /// Tend the sessions of the messages an operator command changed (their queue and session,
        /// as its `RETURNING` gave them).
        pub(super) async fn tend_touched(
            conn: &mut $conn,
            touched: &[(String, Option<String>)],
            now: i64,
        ) -> Result<(), $crate::queue::QueueError> {
            let pairs = touched
                .iter()
                .filter_map(|(queue, session)| Some((queue.as_str(), session.as_deref()?)));
            for (queue, list) in $crate::queue::sessions::by_queue(pairs) {
                tend(conn, queue, Some(&list), now).await?;
            }
            Ok(())
        }

        impl $store {
            /// Settle a handed-off message (see [`crate::queue::QueueStore::settle_handoff`]).
            pub(super) async fn settle_handoff_now(
                &self,
                key: i64,
                failure: Option<&str>,
            ) -> Result<bool, $crate::queue::QueueError> {
                let now = $crate::queue::now_ms();
                let mut tx = self.pool.begin().await?;
                use $crate::queue::sessions::{HANDOFF_COMPLETED, HANDOFF_FAILED};
                let (status, outcome) = match failure {
                    Some(_) => ("failed", HANDOFF_FAILED),
                    None => ("processed", HANDOFF_COMPLETED),
                };
                let touched: Vec<(String, Option<String>)> =
                    sqlx::query_as($crate::queue::sessions::SETTLE_HANDOFF)
                        .bind(now)
                        .bind(status)
                        .bind(key)
                        .bind(failure)
                        .bind(outcome)
                        .fetch_all(&mut *tx)
                        .await?;
                tend_touched(&mut tx, &touched, now).await?;
                tx.commit().await?;
                Ok(!touched.is_empty())
            }

            /// Tend every troubled session of a queue (see [`crate::queue::QueueStore::tend_sessions`]).
            pub(super) async fn tend_queue(
                &self,
                queue: &str,
            ) -> Result<(), $crate::queue::QueueError> {
                let mut tx = self.pool.begin().await?;
                tend(&mut tx, queue, None, $crate::queue::now_ms()).await?;
                tx.commit().await?;
                Ok(())
            }

            /// Sessions in use (see [`crate::queue::QueueStore::sessions_in_use`]).
            pub(super) async fn live_now(
                &self,
                queue: &str,
                sessions: &[String],
            ) -> Result<Vec<String>, $crate::queue::QueueError> {
                let tend: &$crate::queue::sessions::TendSql = &$tend;
                self.select_listed(&tend.live_listed, queue, sessions).await
            }

            /// Session messages held (see [`crate::queue::QueueStore::session_ids_held`]).
            pub(super) async fn held_now(
                &self,
                queue: &str,
                ids: &[String],
            ) -> Result<Vec<String>, $crate::queue::QueueError> {
                let tend: &$crate::queue::sessions::TendSql = &$tend;
                self.select_listed(&tend.held_listed, queue, ids).await
            }

            /// The text column `sql` selects for `queue` (`$1`) and `items` (`$2`, a JSON
            /// array); nothing for no items.
            async fn select_listed(
                &self,
                sql: &str,
                queue: &str,
                items: &[String],
            ) -> Result<Vec<String>, $crate::queue::QueueError> {
                if items.is_empty() {
                    return Ok(Vec::new());
                }
                let list = serde_json::to_string(items).expect("strings serialize");
                let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(queue)
                    .bind(list)
                    .fetch_all(self.readers())
                    .await?;
                Ok(rows.into_iter().map(|(v,)| v).collect())
            }

            /// Blocked sessions (see [`crate::queue::QueueStore::blocked_sessions`]).
            pub(super) async fn blocked_now(
                &self,
                queue: Option<&str>,
                limit: u32,
            ) -> Result<Vec<$crate::queue::BlockedSession>, $crate::queue::QueueError> {
                let rows = sqlx::query($crate::queue::sessions::BLOCKED)
                    .bind(queue)
                    .bind(limit as i64)
                    .fetch_all(self.readers())
                    .await?;
                rows.iter()
                    .map(|r| {
                        use sqlx::Row;
                        Ok($crate::queue::BlockedSession {
                            queue: r.try_get("queue")?,
                            session: r.try_get("session_key")?,
                            blocked_by_key: r.try_get("key")?,
                            blocked_by_id: r.try_get("message_id")?,
                            blocked_by_delivery_id: r.try_get("blocker_delivery")?,
                            status: $crate::queue::Status::parse(r.try_get::<&str, _>("status")?),
                            last_error: r.try_get("last_error")?,
                            parked: r.try_get::<i64, _>("parked")? as u64,
                            since_ms: r.try_get("updated_at_ms")?,
                        })
                    })
                    .collect()
            }
        }
    };
}
pub(crate) use session_commands;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_group_by_queue_without_repeats() {
        let grouped = by_queue([("a", "s1"), ("b", "s2"), ("a", "s1"), ("a", "s0")]);
        assert_eq!(
            grouped,
            vec![
                ("a", r#"["s0","s1"]"#.to_string()),
                ("b", r#"["s2"]"#.to_string())
            ]
        );
    }
}

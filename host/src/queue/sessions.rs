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

use std::sync::LazyLock;

use super::{BlockedSession, QueueError, Status, now_ms};
use crate::sql::{Conn, Dialect, Pool, Query, Text};

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
pub(crate) fn park_statement(set: &str) -> String {
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
pub(crate) fn drain_statement(set: &str) -> String {
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
pub(crate) fn live_statement(set: &str) -> String {
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
            park_listed: park_statement(listed),
            drain_listed: drain_statement(listed),
            park_troubled: park_statement(TROUBLED),
            drain_troubled: drain_statement(TROUBLED),
            live_listed: live_statement(&listed.replace("$3", "$2")),
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

/// The statements that tend sessions, in the words of `dialect` (how it reads a JSON array
/// of session keys).
fn tend_statements(dialect: Dialect) -> &'static TendSql {
    static SQLITE: LazyLock<TendSql> =
        LazyLock::new(|| TendSql::new(&Dialect::Sqlite.json_strings(3)));
    static POSTGRES: LazyLock<TendSql> =
        LazyLock::new(|| TendSql::new(&Dialect::Postgres.json_strings(3)));
    match dialect {
        Dialect::Sqlite => &SQLITE,
        Dialect::Postgres => &POSTGRES,
    }
}

/// Park and drain sessions of `queue` in the caller's transaction: those in the JSON array
/// `sessions`, or (`None`) every session of the queue with a blocker or parked messages.
pub(super) async fn tend(
    conn: &mut Conn<'_>,
    queue: &str,
    sessions: Option<&str>,
    now: i64,
) -> Result<(), QueueError> {
    let tend = tend_statements(conn.dialect());
    let (park, drain) = match sessions {
        Some(_) => (&tend.park_listed, &tend.drain_listed),
        None => (&tend.park_troubled, &tend.drain_troubled),
    };
    for sql in [park, drain] {
        let mut statement = conn.query(sql.as_str()).bind(queue).bind(now);
        if let Some(list) = sessions {
            statement = statement.bind(list);
        }
        statement.execute().await?;
    }
    Ok(())
}

/// Park what was enqueued into a blocked session: the sessions in the JSON array `sessions`.
pub(super) async fn park(
    conn: &mut Conn<'_>,
    queue: &str,
    sessions: &str,
    now: i64,
) -> Result<(), QueueError> {
    let tend = tend_statements(conn.dialect());
    conn.query(tend.park_listed.as_str())
        .bind(queue)
        .bind(now)
        .bind(sessions)
        .execute()
        .await?;
    Ok(())
}

/// Tend the sessions of the `(queue, session)` rows an operator command changed.
async fn tend_touched(
    conn: &mut Conn<'_>,
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

/// Run `sql` (its parameters bound by `bind`), which changes messages and returns the queue
/// and session key of each, and tend the sessions it touched, in one transaction; returns how
/// many messages it changed.
pub(super) async fn change_and_tend(
    pool: &Pool,
    sql: impl Text,
    now: i64,
    bind: impl for<'q> FnOnce(Query<'q>) -> Query<'q>,
) -> Result<usize, QueueError> {
    let mut tx = pool.begin().await?;
    let rows = bind(tx.conn().query(sql)).fetch_all().await?;
    let touched = rows
        .iter()
        .map(|r| Ok((r.get("queue")?, r.get("session_key")?)))
        .collect::<Result<Vec<(String, Option<String>)>, QueueError>>()?;
    tend_touched(&mut tx.conn(), &touched, now).await?;
    tx.commit().await?;
    Ok(touched.len())
}

/// See [`crate::queue::QueueStore::settle_handoff`].
pub(super) async fn settle_handoff(
    pool: &Pool,
    key: i64,
    failure: Option<&str>,
) -> Result<bool, QueueError> {
    let now = now_ms();
    let (status, outcome) = match failure {
        Some(_) => ("failed", HANDOFF_FAILED),
        None => ("processed", HANDOFF_COMPLETED),
    };
    let changed = change_and_tend(pool, SETTLE_HANDOFF, now, |q| {
        q.bind(now)
            .bind(status)
            .bind(key)
            .bind(failure)
            .bind(outcome)
    });
    Ok(changed.await? > 0)
}

/// See [`crate::queue::QueueStore::tend_sessions`].
pub(super) async fn tend_queue(pool: &Pool, queue: &str) -> Result<(), QueueError> {
    let mut tx = pool.begin().await?;
    tend(&mut tx.conn(), queue, None, now_ms()).await?;
    tx.commit().await?;
    Ok(())
}

/// See [`crate::queue::QueueStore::sessions_in_use`].
pub(super) async fn sessions_in_use(
    readers: &Pool,
    queue: &str,
    sessions: &[String],
) -> Result<Vec<String>, QueueError> {
    let tend = tend_statements(readers.dialect());
    select_listed(readers, &tend.live_listed, queue, sessions).await
}

/// See [`crate::queue::QueueStore::session_ids_held`].
pub(super) async fn session_ids_held(
    readers: &Pool,
    queue: &str,
    ids: &[String],
) -> Result<Vec<String>, QueueError> {
    let tend = tend_statements(readers.dialect());
    select_listed(readers, &tend.held_listed, queue, ids).await
}

async fn select_listed(
    readers: &Pool,
    sql: &'static str,
    queue: &str,
    items: &[String],
) -> Result<Vec<String>, QueueError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let list = serde_json::to_string(items).expect("strings serialize");
    let found = readers
        .query(sql)
        .bind(queue)
        .bind(list)
        .fetch_column()
        .await?;
    Ok(found)
}

/// See [`crate::queue::QueueStore::blocked_sessions`].
pub(super) async fn blocked_sessions(
    readers: &Pool,
    queue: Option<&str>,
    limit: u32,
) -> Result<Vec<BlockedSession>, QueueError> {
    let rows = readers
        .query(BLOCKED)
        .bind(queue)
        .bind(limit as i64)
        .fetch_all()
        .await?;
    rows.iter()
        .map(|r| {
            Ok(BlockedSession {
                queue: r.get("queue")?,
                session: r.get("session_key")?,
                blocked_by_key: r.get("key")?,
                blocked_by_id: r.get("message_id")?,
                blocked_by_delivery_id: r.get("blocker_delivery")?,
                status: Status::parse(r.get::<&str, _>("status")?),
                last_error: r.get("last_error")?,
                parked: r.get::<i64, _>("parked")? as u64,
                since_ms: r.get("updated_at_ms")?,
            })
        })
        .collect()
}

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

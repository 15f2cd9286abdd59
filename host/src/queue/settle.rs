//! Settling leases, once for every SQL dialect: the key-value changes checked and their rows
//! locked first (a settlement whose read-then-set lost a race is replaced by its
//! `on_conflict`), then the inbox records, each outcome, the follow-ups and the key-value
//! writes,
//! fenced by the lease token, inside the caller's transaction. A message re-enqueued while it
//! was leased (AwaitingRelease) keeps its newer version: this processor's outcome is recorded
//! in history and the newer version becomes live. Only the batch of completions differs
//! between dialects (arrays on PostgreSQL, a JSON array on SQLite).

use std::borrow::Cow;
use std::collections::HashSet;

use super::sessions::{self, by_queue};
use super::statements::{
    APPLY_NEXT, COMPLETED_UNDER, DELETE_LEASED, FAIL, RECORD_HISTORY, RELEASE, RETRY,
};
use super::{
    Disposition, FollowUp, InboxWrite, Lease, QueueError, SettleResult, Settlement, StateWrite,
    follow_ups, inbox_records, inbox_writes, postgres, sqlite, state,
};
use crate::sql::{Conn, Pool, Text};

/// What a batch did.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// One result per settlement, in input order.
    pub results: Vec<SettleResult>,
    /// What its follow-ups wrote.
    pub follow_ups: follow_ups::Written,
}

/// How one settlement went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    /// Applied by this transaction.
    Now,
    /// Applied by an earlier try of the same batch (its follow-ups were written then).
    Before,
    /// The lease was lost.
    Lost,
}

/// The inbox records of a batch made only of completions that keep their message, outside
/// sessions and without follow-ups, with at most one inbox write: `Some(write)` for such a batch, which a store may
/// apply in one statement. `None` for any other batch.
fn plain_completions(settlements: &[Settlement]) -> Option<Option<InboxWrite>> {
    let plain = settlements.iter().all(|s| {
        s.disposition == Disposition::Complete
            && s.keep_processed
            && s.session.is_none()
            && s.follow_ups.is_empty()
            && s.state.is_empty()
    });
    if !plain {
        return None;
    }
    let mut writes = inbox_writes(settlements);
    match writes.len() {
        0 => Some(None),
        1 => Some(writes.pop()),
        _ => None,
    }
}

/// Apply `settlements` on `pool`; results in input order. On PostgreSQL a batch of plain
/// completions ([`plain_completions`]) is one statement, so one round trip where `BEGIN`, the
/// inbox records, the update and `COMMIT` took four: the settlement task waits for each batch,
/// so every round trip saved is throughput. Its messages that it did not complete
/// (re-enqueued while leased, or leased no more) are then settled as any batch is, their
/// inbox records already written (a record follows the handler's success, not the lease).
/// Any other batch is one transaction.
pub(crate) async fn settle_batch(
    pool: &Pool,
    settlements: &[Settlement],
    now: i64,
) -> Result<Settled, QueueError> {
    let (Pool::Postgres(pg), Some(inbox)) = (pool, plain_completions(settlements)) else {
        return in_transaction(pool, settlements, now).await;
    };
    let completes: Vec<&Settlement> = settlements.iter().collect();
    let done =
        postgres::complete(&mut *pg.acquire().await?, &completes, inbox.as_ref(), now).await?;
    let rest: Vec<Settlement> = settlements
        .iter()
        .filter(|s| !done.contains(&s.lease))
        .map(|s| Settlement {
            inbox: None,
            ..s.clone()
        })
        .collect();
    let mut rest = if rest.is_empty() {
        Vec::new()
    } else {
        in_transaction(pool, &rest, now).await?.results
    }
    .into_iter();
    let results = settlements
        .iter()
        .map(|s| match done.contains(&s.lease) {
            true => SettleResult::Applied,
            false => rest.next().unwrap_or(SettleResult::LeaseLost),
        })
        .collect();
    Ok(Settled {
        results,
        follow_ups: follow_ups::Written::default(),
    })
}

/// Tries of a transaction whose key-value changes met a key written meanwhile by another
/// (rolled back and tried again, which then finds and locks the row).
pub(crate) const STATE_TRIES: u32 = 5;

async fn in_transaction(
    pool: &Pool,
    settlements: &[Settlement],
    now: i64,
) -> Result<Settled, QueueError> {
    let with_state = settlements.iter().any(|s| !s.state.is_empty());
    let mut tries = 0;
    loop {
        tries += 1;
        let mut tx = pool.begin().await?;
        match settle(&mut tx.conn(), settlements, now).await {
            Err(QueueError::Conflict(_)) if with_state && tries < STATE_TRIES => continue,
            settled => {
                let settled = settled?;
                tx.commit().await?;
                return Ok(settled);
            }
        }
    }
}

/// `disposition` with `{key}` in its error replaced by the conflicting `BUCKET/KEY`.
fn with_key(disposition: &Disposition, key: &str) -> Disposition {
    match disposition.clone() {
        Disposition::Retry { at_ms, error } => Disposition::Retry {
            at_ms,
            error: error.map(|e| e.replace("{key}", key)),
        },
        Disposition::Fail { error } => Disposition::Fail {
            error: error.replace("{key}", key),
        },
        other => other,
    }
}

/// The settlements with their key-value changes checked: the rows they change locked, and
/// each one whose read-then-set lost a race replaced by its `on_conflict`, without effects.
async fn check_state<'s>(
    conn: &mut Conn<'_>,
    settlements: &'s [Settlement],
) -> Result<
    (
        Cow<'s, [Settlement]>,
        Vec<Option<String>>,
        Option<state::Locked>,
    ),
    QueueError,
> {
    if settlements.iter().all(|s| s.state.is_empty()) {
        return Ok((
            Cow::Borrowed(settlements),
            vec![None; settlements.len()],
            None,
        ));
    }
    let groups: Vec<&[StateWrite]> = settlements.iter().map(|s| s.state.as_slice()).collect();
    let (conflicts, locked) = state::lock(conn, &groups).await?;
    if conflicts.iter().all(Option::is_none) {
        return Ok((Cow::Borrowed(settlements), conflicts, Some(locked)));
    }
    let checked = settlements
        .iter()
        .zip(&conflicts)
        .map(|(s, conflict)| match conflict {
            None => s.clone(),
            Some(key) => Settlement {
                disposition: with_key(&s.on_conflict, key),
                outcome: None,
                inbox: None,
                follow_ups: Vec::new(),
                state: Vec::new(),
                ..s.clone()
            },
        })
        .collect();
    Ok((Cow::Owned(checked), conflicts, Some(locked)))
}

/// Apply `settlements` on `conn`, in the caller's transaction; results in input order. The
/// follow-ups of the settlements this transaction applies are written with them.
async fn settle(
    conn: &mut Conn<'_>,
    settlements: &[Settlement],
    now: i64,
) -> Result<Settled, QueueError> {
    // Key-value changes checked first: their rows locked, conflicting settlements replaced.
    let (settlements, conflicts, locked) = check_state(conn, settlements).await?;
    let settlements = &*settlements;
    // Inbox records next: recorded exactly when the settlement commits.
    for write in inbox_writes(settlements) {
        inbox_records::record(conn, &write).await?;
    }
    // The common case, completions that keep the message, together.
    let completes: Vec<&Settlement> = settlements
        .iter()
        .filter(|s| s.disposition == Disposition::Complete && s.keep_processed)
        .collect();
    let completed = if completes.is_empty() {
        HashSet::new()
    } else {
        complete_kept(conn, &completes, now).await?
    };
    let mut done = Vec::with_capacity(settlements.len());
    for s in settlements {
        done.push(match completed.contains(&s.lease) {
            true => Done::Now,
            false => settle_one(conn, s, now).await?,
        });
    }
    let mut follow_ups: Vec<&FollowUp> = Vec::new();
    for (s, done) in settlements.iter().zip(&done) {
        if *done == Done::Now {
            follow_ups.extend(&s.follow_ups);
        }
    }
    let written = follow_ups::write(conn, follow_ups, now).await?;
    if let Some(locked) = &locked {
        let applied: Vec<&[StateWrite]> = settlements
            .iter()
            .zip(&done)
            .filter(|(_, done)| **done == Done::Now)
            .map(|(s, _)| s.state.as_slice())
            .collect();
        state::write(conn, &applied, locked, now).await?;
    }
    // Sessions last, on the statuses just written: a failure or handoff parks what waits
    // behind it, a success of a blocker's retry drains its session.
    let touched = settlements.iter().filter_map(|s| {
        let (queue, session) = s.session.as_ref()?;
        let changes_order = !matches!(
            s.disposition,
            Disposition::Retry { .. } | Disposition::Release
        );
        changes_order.then_some((queue.as_str(), session.as_str()))
    });
    for (queue, sessions) in by_queue(touched) {
        sessions::tend(conn, queue, Some(&sessions), now).await?;
    }
    let results = done
        .into_iter()
        .zip(conflicts)
        .map(|(d, conflict)| match (d, conflict) {
            (Done::Lost, _) => SettleResult::LeaseLost,
            (_, Some(key)) => SettleResult::StateConflict(key),
            (Done::Now | Done::Before, None) => SettleResult::Applied,
        })
        .collect();
    Ok(Settled {
        results,
        follow_ups: written,
    })
}

async fn settle_one(conn: &mut Conn<'_>, s: &Settlement, now: i64) -> Result<Done, QueueError> {
    let lease = s.lease;
    let applied = match &s.disposition {
        // Not completed with the others: leased no more, or awaiting release.
        Disposition::Complete if s.keep_processed => false,
        Disposition::Complete => {
            record_history(conn, lease, "processed", None, "processing", now).await?;
            fenced(conn, &DELETE_LEASED, None, lease).await?
        }
        Disposition::Retry { at_ms, error } => {
            let retry = conn
                .query(&RETRY)
                .bind(now)
                .bind(*at_ms)
                .bind(error.as_deref());
            changed_one(retry.bind(lease.key).bind(lease.token)).await?
        }
        Disposition::Fail { error } => {
            let fail = conn.query(&FAIL).bind(now).bind(error.as_str());
            changed_one(fail.bind(lease.key).bind(lease.token)).await?
        }
        Disposition::Release => fenced(conn, &RELEASE, Some(now), lease).await?,
        Disposition::HandOff => fenced(conn, sessions::HAND_OFF, Some(now), lease).await?,
    };
    if applied {
        return Ok(Done::Now);
    }
    // Re-enqueued while leased: record what this processor did, then the newer version takes
    // over (the older outcome never overwrites it).
    let outcome = match &s.disposition {
        Disposition::Complete => Some(("processed", None)),
        Disposition::Fail { error } => Some(("failed", Some(error.as_str()))),
        Disposition::HandOff => Some(("handed-off", None)),
        _ => None,
    };
    if let Some((status, error)) = outcome {
        record_history(conn, lease, status, error, "awaiting-release", now).await?;
    }
    let next = conn
        .query(&APPLY_NEXT)
        .bind(now)
        .bind(None::<String>)
        .bind(None::<String>);
    let next = next.bind(lease.key).bind(lease.token).bind(None::<String>);
    if changed_one(next).await? {
        return Ok(Done::Now);
    }
    // A retry of a completion that went through: applied, not lost.
    match s.disposition {
        Disposition::Complete if s.keep_processed => {
            let found = conn
                .query(&COMPLETED_UNDER)
                .bind(lease.key)
                .bind(lease.token);
            Ok(match found.fetch_optional().await? {
                Some(_) => Done::Before,
                None => Done::Lost,
            })
        }
        _ => Ok(Done::Lost),
    }
}

/// Whether a fenced statement changed its message.
async fn changed_one(statement: crate::sql::Query<'_>) -> Result<bool, QueueError> {
    Ok(statement.execute().await? == 1)
}

/// Run a statement binding (`now` when given,) the lease's key and token.
async fn fenced(
    conn: &mut Conn<'_>,
    sql: impl Text,
    now: Option<i64>,
    lease: Lease,
) -> Result<bool, QueueError> {
    let mut statement = conn.query(sql);
    if let Some(now) = now {
        statement = statement.bind(now);
    }
    changed_one(statement.bind(lease.key).bind(lease.token)).await
}

/// Copy the live version of message `lease.key` into history, with `status` and `error`
/// when given, if its lease is `lease` and its status is `only_in`.
pub(super) async fn record_history(
    conn: &mut Conn<'_>,
    lease: Lease,
    status: &str,
    error: Option<&str>,
    only_in: &str,
    now: i64,
) -> Result<(), QueueError> {
    conn.query(&RECORD_HISTORY)
        .bind(now)
        .bind(status)
        .bind(error)
        .bind(lease.key)
        .bind(lease.token)
        .bind(only_in)
        .execute()
        .await?;
    Ok(())
}

/// Complete `completes` (kept as processed, with their outcome) in one statement; returns
/// the leases done.
async fn complete_kept(
    conn: &mut Conn<'_>,
    completes: &[&Settlement],
    now: i64,
) -> Result<HashSet<Lease>, QueueError> {
    match conn {
        Conn::Postgres(pg) => postgres::complete(pg, completes, None, now).await,
        Conn::Sqlite(lite) => sqlite::complete(lite, completes, now).await,
    }
}

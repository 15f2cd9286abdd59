//! Settling leases, once for every SQL dialect: the inbox records first, then each outcome,
//! fenced by the lease token, inside the caller's transaction. A message re-enqueued while it
//! was leased (AwaitingRelease) keeps its newer version: this processor's outcome is recorded
//! in history and the newer version becomes live. Each store supplies only its statements,
//! through [`SettleStatements`].

use std::collections::HashSet;

use async_trait::async_trait;

use super::sessions::by_queue;
use super::{Disposition, InboxWrite, Lease, QueueError, SettleResult, Settlement, inbox_writes};

/// The statements one dialect runs for a settlement, all inside the caller's transaction.
/// Each fenced statement applies only to a message still `processing` under `lease` and says
/// whether it did.
#[async_trait]
pub(crate) trait SettleStatements: Send {
    /// Write inbox records into a table of the queue database.
    async fn record_inbox(&mut self, write: &InboxWrite) -> Result<(), QueueError>;

    /// Complete `completes` (kept as processed, with their outcome); returns the leases done.
    async fn complete_kept(
        &mut self,
        completes: &[&Settlement],
        now: i64,
    ) -> Result<HashSet<Lease>, QueueError>;

    /// Copy the live version of message `lease.key` into history, with `status` and `error`
    /// when given, if its lease is `lease` and its status is `only_in`.
    async fn record_history(
        &mut self,
        lease: Lease,
        status: &str,
        error: Option<&str>,
        only_in: &str,
        now: i64,
    ) -> Result<(), QueueError>;

    /// Delete the message (completed, not kept).
    async fn delete_leased(&mut self, lease: Lease) -> Result<bool, QueueError>;

    /// Make it ready again at `at_ms` (pending, or sleeping until then).
    async fn retry(
        &mut self,
        lease: Lease,
        at_ms: i64,
        error: Option<&str>,
        now: i64,
    ) -> Result<bool, QueueError>;

    /// Fail it with `error`.
    async fn fail(&mut self, lease: Lease, error: &str, now: i64) -> Result<bool, QueueError>;

    /// Hand it back without counting the attempt.
    async fn release(&mut self, lease: Lease, now: i64) -> Result<bool, QueueError>;

    /// Make the version that waited for release (AwaitingRelease under `lease`) live.
    async fn apply_next(&mut self, lease: Lease, now: i64) -> Result<bool, QueueError>;

    /// Whether the message was completed and kept under `lease` already: a settlement
    /// retried after its completion went through (the answer to the first try was lost).
    async fn completed_under(&mut self, lease: Lease) -> Result<bool, QueueError>;

    /// Keep it `handed-off` (a pending handoff in a session).
    async fn hand_off(&mut self, lease: Lease, now: i64) -> Result<bool, QueueError>;

    /// Park and drain the sessions in the JSON array `sessions` of `queue`.
    async fn tend_sessions(
        &mut self,
        queue: &str,
        sessions: &str,
        now: i64,
    ) -> Result<(), QueueError>;
}

/// The inbox records of a batch made only of completions that keep their message, outside
/// sessions, with at most one inbox write: `Some(write)` for such a batch, which a store may
/// apply in one statement. `None` for any other batch.
pub(crate) fn plain_completions(settlements: &[Settlement]) -> Option<Option<InboxWrite>> {
    let plain = settlements
        .iter()
        .all(|s| s.disposition == Disposition::Complete && s.keep_processed && s.session.is_none());
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

/// Apply `settlements` through `statements` (one transaction); results in input order.
pub(crate) async fn settle<S: SettleStatements>(
    statements: &mut S,
    settlements: &[Settlement],
    now: i64,
) -> Result<Vec<SettleResult>, QueueError> {
    // Inbox records first: recorded exactly when the settlement commits.
    for write in inbox_writes(settlements) {
        statements.record_inbox(&write).await?;
    }
    // The common case, completions that keep the message, together.
    let completes: Vec<&Settlement> = settlements
        .iter()
        .filter(|s| s.disposition == Disposition::Complete && s.keep_processed)
        .collect();
    let completed = if completes.is_empty() {
        HashSet::new()
    } else {
        statements.complete_kept(&completes, now).await?
    };
    let mut results = Vec::with_capacity(settlements.len());
    for s in settlements {
        let applied = completed.contains(&s.lease) || settle_one(statements, s, now).await?;
        results.push(if applied {
            SettleResult::Applied
        } else {
            SettleResult::LeaseLost
        });
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
        statements.tend_sessions(queue, &sessions, now).await?;
    }
    Ok(results)
}

async fn settle_one<S: SettleStatements>(
    statements: &mut S,
    s: &Settlement,
    now: i64,
) -> Result<bool, QueueError> {
    let lease = s.lease;
    let applied = match &s.disposition {
        // Not completed with the others: leased no more, or awaiting release.
        Disposition::Complete if s.keep_processed => false,
        Disposition::Complete => {
            statements
                .record_history(lease, "processed", None, "processing", now)
                .await?;
            statements.delete_leased(lease).await?
        }
        Disposition::Retry { at_ms, error } => {
            statements
                .retry(lease, *at_ms, error.as_deref(), now)
                .await?
        }
        Disposition::Fail { error } => statements.fail(lease, error, now).await?,
        Disposition::Release => statements.release(lease, now).await?,
        Disposition::HandOff => statements.hand_off(lease, now).await?,
    };
    if applied {
        return Ok(true);
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
        statements
            .record_history(lease, status, error, "awaiting-release", now)
            .await?;
    }
    if statements.apply_next(lease, now).await? {
        return Ok(true);
    }
    // A retry of a completion that went through: applied, not lost.
    match s.disposition {
        Disposition::Complete if s.keep_processed => statements.completed_under(lease).await,
        _ => Ok(false),
    }
}

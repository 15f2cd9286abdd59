//! The commit of broker messages' effects — follow-ups, key-value changes, inbox records and
//! commit marks — for many messages in one transaction ([`commit_many`]): a message whose
//! mark exists already commits nothing (`Ok(false)`), one whose key-value change conflicts
//! commits nothing (`Err(StateConflict)`), the others commit together.

use std::collections::HashSet;

use super::follow_ups::{self, Written};
use super::{
    CommitMark, FollowUp, InboxWrite, QueueError, StateWrite, commit_marks, inbox_records, state,
};
use crate::sql::Conn;

/// The effects of one successful broker delivery.
#[derive(Debug, Clone, Default)]
pub struct EffectsCommit {
    /// Its inbox records (a table of the queue database).
    pub inbox: Option<InboxWrite>,
    /// Its commit mark: nothing is committed when the mark exists already.
    pub mark: Option<CommitMark>,
    /// Its follow-ups.
    pub follow_ups: Vec<FollowUp>,
    /// Its key-value changes.
    pub state: Vec<StateWrite>,
}

/// What one commit came to: committed (`true`), committed before (`false`), or a state
/// conflict.
pub type CommitResult = Result<bool, QueueError>;

/// Commit `commits` on `conn`, in the caller's transaction. A key found absent that another
/// transaction wrote meanwhile is [`QueueError::Conflict`]: roll back and try again.
pub(crate) async fn commit_many(
    conn: &mut Conn<'_>,
    commits: &[EffectsCommit],
    now: i64,
) -> Result<(Vec<CommitResult>, Written), QueueError> {
    let mut results: Vec<CommitResult> = commits.iter().map(|_| Ok(true)).collect();
    // Marks first: a delivery committed before (or twice in this batch) commits nothing.
    let marks: Vec<(usize, &CommitMark)> = commits
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.mark.as_ref().map(|m| (i, m)))
        .collect();
    let mut seen = HashSet::new();
    let mut unique = Vec::new();
    for (i, mark) in &marks {
        match seen.insert((&mark.queue, &mark.delivery)) {
            true => unique.push(*mark),
            false => results[*i] = Ok(false),
        }
    }
    let new = commit_marks::mark_many(conn, &unique, now).await?;
    for (i, mark) in &marks {
        if !new.contains(&(mark.queue.clone(), mark.delivery.clone())) {
            results[*i] = Ok(false);
        }
    }
    // Key-value changes: rows locked, conflicting commits left out (their marks removed).
    let live: Vec<usize> = (0..commits.len()).filter(|i| results[*i].is_ok()).collect();
    let mut locked = None;
    if live.iter().any(|i| !commits[*i].state.is_empty()) {
        let groups: Vec<&[StateWrite]> = live.iter().map(|i| &commits[*i].state[..]).collect();
        let (conflicts, rows) = state::lock(conn, &groups).await?;
        let mut unmark = Vec::new();
        for (i, conflict) in live.iter().zip(conflicts) {
            if let Some(key) = conflict {
                results[*i] = Err(QueueError::StateConflict(key));
                unmark.extend(commits[*i].mark.as_ref());
            }
        }
        commit_marks::unmark(conn, &unmark).await?;
        locked = Some(rows);
    }
    let applied: Vec<&EffectsCommit> = commits
        .iter()
        .zip(&results)
        .filter(|(_, r)| matches!(r, Ok(true)))
        .map(|(c, _)| c)
        .collect();
    for write in inbox_records::merged(applied.iter().filter_map(|c| c.inbox.as_ref())) {
        inbox_records::record(conn, &write).await?;
    }
    let written = follow_ups::write(conn, applied.iter().flat_map(|c| &c.follow_ups), now).await?;
    if let Some(locked) = &locked {
        let groups: Vec<&[StateWrite]> = applied.iter().map(|c| &c.state[..]).collect();
        state::write(conn, &groups, locked, now).await?;
    }
    Ok((results, written))
}

//! Follow-up messages a handler staged, written in the transaction that settles the message
//! it was processing (or, for a message from a broker, in the transaction that commits its
//! effects before the acknowledgement): they exist if and only if that attempt's outcome
//! was committed. The identity rules are those of every enqueue ([`super::enqueue::apply`]).

use std::collections::BTreeMap;

use super::enqueue::apply;
use super::prepared::Prepared;
use super::{NewMessage, QueueError};
use crate::sql::Conn;

/// A message a handler enqueued while processing another, staged until that message's
/// outcome is committed.
#[derive(Debug, Clone)]
pub struct FollowUp {
    /// The target queue (a queue of the same SQL store).
    pub queue: String,
    /// The message, checked against the target's limits already.
    pub message: NewMessage,
    /// Whether the target queue is idempotent.
    pub idempotent: bool,
}

/// Write `follow_ups` on `conn`, in the caller's transaction, in order per target queue (the
/// targets in name order, so two transactions lock ids in one order). Returns the queues
/// that now have a ready message.
pub(crate) async fn write<'f>(
    conn: &mut Conn<'_>,
    follow_ups: impl IntoIterator<Item = &'f FollowUp>,
    now: i64,
) -> Result<Vec<String>, QueueError> {
    let mut by_queue: BTreeMap<(&str, bool), Vec<Prepared>> = BTreeMap::new();
    for f in follow_ups {
        by_queue
            .entry((f.queue.as_str(), f.idempotent))
            .or_default()
            .push(Prepared::new(f.message.clone(), now));
    }
    let mut ready = Vec::new();
    for ((queue, idempotent), messages) in by_queue {
        if apply(conn, queue, &messages, idempotent, now).await?.ready
            && !ready.iter().any(|q| q == queue)
        {
            ready.push(queue.to_string());
        }
    }
    Ok(ready)
}

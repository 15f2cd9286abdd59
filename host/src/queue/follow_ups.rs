//! Follow-up messages a handler staged, written in the transaction that settles the message
//! it was processing (or, for a message from a broker, in the transaction that commits its
//! effects before the acknowledgement): they exist if and only if that attempt's outcome
//! was committed. The identity rules are those of every enqueue ([`super::enqueue::apply`]).

use std::collections::BTreeMap;

use super::enqueue::apply;
use super::outbox::{self, OutboxEntry};
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
    /// For a queue whose pending messages live in a broker: written into the outbox, and
    /// published from there.
    pub outbox: Option<OutboxEntry>,
}

/// What writing follow-ups did.
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// The queues that now have a ready message.
    pub ready: Vec<String>,
    /// Whether outbox rows were written.
    pub outbox: bool,
}

/// Write `follow_ups` on `conn`, in the caller's transaction, in order per target queue (the
/// targets in name order, so two transactions lock ids in one order).
pub(crate) async fn write<'f>(
    conn: &mut Conn<'_>,
    follow_ups: impl IntoIterator<Item = &'f FollowUp>,
    now: i64,
) -> Result<Written, QueueError> {
    let mut by_queue: BTreeMap<(&str, bool), Vec<Prepared>> = BTreeMap::new();
    let mut written = Written::default();
    let mut for_outbox = Vec::new();
    for f in follow_ups {
        if f.outbox.is_some() {
            for_outbox.push(f);
            continue;
        }
        by_queue
            .entry((f.queue.as_str(), f.idempotent))
            .or_default()
            .push(Prepared::new(f.message.clone(), now));
    }
    if !for_outbox.is_empty() {
        outbox::insert(conn, &for_outbox, now).await?;
        written.outbox = true;
    }
    for ((queue, idempotent), messages) in by_queue {
        if apply(conn, queue, &messages, idempotent, now).await?.ready
            && !written.ready.iter().any(|q| q == queue)
        {
            written.ready.push(queue.to_string());
        }
    }
    Ok(written)
}

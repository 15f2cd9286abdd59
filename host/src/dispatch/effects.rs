//! A handler's effects, committed with its outcome: the follow-up messages it enqueues are
//! staged during the call ([`Staging`]) and exist if and only if the attempt succeeded. A
//! source that settles in the SQL store (the SQL queue) writes them in its settlement's
//! transaction; for a broker message they are committed here, with its inbox records when the
//! inbox lives in the queue database, before the acknowledgement ([`commit`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::deliver::InboxBinding;
use super::{Shared, Source};
use crate::headers::SEND_NOW;
use crate::inbox::InboxKey;
use crate::queue::{
    CommitMark, EffectsCommit, EnqueueStatus, Enqueued, FollowUp, InboxRow, InboxWrite, NewMessage,
    QueueError, StateWrite,
};
use crate::runtime::{EnqueueError, Enqueuer, Staged};

/// Most follow-ups one handler call may stage.
pub const MAX_FOLLOW_UPS: usize = 250;

/// Most payload bytes of the follow-ups one handler call may stage.
pub const MAX_FOLLOW_UP_BYTES: usize = 16 << 20;

/// How many times a message whose key-value changes conflicted at commit runs again without
/// counting an attempt; past that, a conflict fails its attempt ("state conflict on
/// BUCKET/KEY", counted like a transient failure).
pub const STATE_RERUNS: u32 = 100;

/// Messages of one queue whose key-value changes conflicted, by delivery, and how often.
#[derive(Default)]
pub(crate) struct StateConflicts(Mutex<HashMap<String, u32>>);

impl StateConflicts {
    /// Most messages remembered (a guard: entries leave when their message settles).
    const MAX: usize = 100_000;

    /// How often `delivery` conflicted so far.
    pub(crate) fn reruns(&self, delivery: &str) -> u32 {
        let counts = self.0.lock().expect("state conflicts");
        counts.get(delivery).copied().unwrap_or(0)
    }

    /// Note a conflict of `delivery` in `queue`.
    pub(crate) fn conflicted(&self, queue: &str, delivery: &str, key: &str) {
        crate::metrics::state_conflict(queue);
        let mut counts = self.0.lock().expect("state conflicts");
        if counts.len() >= Self::MAX {
            counts.clear();
        }
        let n = counts.entry(delivery.to_string()).or_default();
        *n += 1;
        tracing::info!(
            queue,
            delivery,
            key,
            reruns = *n,
            "state conflict: a key this handler read and then set was changed by another call before the commit; nothing of the attempt was committed and the message runs again"
        );
    }

    /// `delivery` settled otherwise: forget it.
    pub(crate) fn settled(&self, delivery: &str) {
        let mut counts = self.0.lock().expect("state conflicts");
        if !counts.is_empty() {
            counts.remove(delivery);
        }
    }
}

/// The enqueuer one handler call sees: what goes into the SQL store is staged, what goes to a
/// broker is enqueued at once.
pub(crate) struct Staging {
    inner: Arc<dyn Enqueuer>,
    /// What the MessageIds of follow-ups for brokers without an id of their own derive from:
    /// the delivery being processed (a random one for a broker message without MessageId).
    source: String,
    staged: Mutex<(Vec<FollowUp>, usize)>,
}

impl Staging {
    /// Staging in front of `inner`, for the call that processes `delivery_id`.
    pub(crate) fn new(inner: Arc<dyn Enqueuer>, delivery_id: &str) -> Arc<Self> {
        let source = match delivery_id {
            "" => crate::queue::new_delivery_id(),
            id => id.to_string(),
        };
        Arc::new(Staging {
            inner,
            source,
            staged: Mutex::new((Vec::new(), 0)),
        })
    }

    /// The follow-ups staged so far, in the order the handler enqueued them.
    pub(crate) fn take(&self) -> Vec<FollowUp> {
        std::mem::take(&mut self.staged.lock().expect("staged follow-ups").0)
    }
}

#[async_trait]
impl Enqueuer for Staging {
    /// A staged follow-up reports `added`: whether it adds, updates or is discarded is known
    /// when it is committed. A message with the header [`SEND_NOW`] is not staged: it is
    /// enqueued at once, whatever the handler's outcome. One for a broker without an id of its own is given a MessageId
    /// derived from the delivery being processed and its position among the call's
    /// follow-ups, so a redelivery that commits it again publishes it under the same id.
    fn system(&self, queue: &str) -> &'static str {
        self.inner.system(queue)
    }

    async fn enqueue(
        &self,
        queue: &str,
        mut message: NewMessage,
    ) -> Result<Enqueued, EnqueueError> {
        let before = message.headers.len();
        message.headers.retain(|(name, _)| name != SEND_NOW);
        if message.headers.len() != before {
            // Asked to go out now, outside the guarantee (a progress event).
            return self.inner.enqueue(queue, message).await;
        }
        let mut follow_up = match self.inner.stage(queue, message)? {
            Staged::Store(follow_up) => follow_up,
            Staged::Now(message) => return self.inner.enqueue(queue, message).await,
        };
        let mut staged = self.staged.lock().expect("staged follow-ups");
        let (count, bytes) = (
            staged.0.len() + 1,
            staged.1 + follow_up.message.payload.len(),
        );
        if count > MAX_FOLLOW_UPS || bytes > MAX_FOLLOW_UP_BYTES {
            return Err(EnqueueError::FollowUpLimit {
                count,
                bytes,
                max_count: MAX_FOLLOW_UPS,
                max_bytes: MAX_FOLLOW_UP_BYTES,
            });
        }
        if let Some(entry) = follow_up.outbox.as_mut().filter(|e| e.message_id.is_none()) {
            entry.message_id = Some(format!("{}:{}", self.source, staged.0.len()));
        }
        staged.0.push(follow_up);
        staged.1 = bytes;
        Ok(Enqueued {
            key: 0,
            status: EnqueueStatus::Added,
        })
    }
}

/// What a success leaves for its settlement, once its effects that the settlement does not
/// write are committed.
#[derive(Default)]
pub(crate) struct ForSettlement {
    /// Inbox records the source writes with its settlement.
    pub inbox: Option<InboxWrite>,
    /// Follow-ups the source writes with its settlement.
    pub follow_ups: Vec<FollowUp>,
    /// Key-value changes the source writes with its settlement.
    pub state: Vec<StateWrite>,
    /// Inbox keys to record once the settlement is applied: an inbox outside the queue
    /// database, of a delivery whose follow-ups the settlement writes. Recorded after them, a
    /// crash in between runs the handler again instead of skipping it with its follow-ups.
    pub record_after: Vec<InboxKey>,
    /// How many inbox keys were (or will be) recorded.
    pub recorded: usize,
}

/// Step 3, after the guest succeeded: its `follow_ups`, and the inbox records of
/// `record_ids` when `inbox` is given (a completion, not a pending handoff). What the source
/// writes with its settlement is returned; the rest is committed or recorded first. Fails
/// with why, when nothing of the attempt's effects was committed.
pub(crate) async fn commit<S: Source>(
    shared: &Shared<S>,
    inbox: Option<&InboxBinding>,
    record_ids: &[String],
    mark: Option<String>,
    follow_ups: Vec<FollowUp>,
    state: Vec<StateWrite>,
) -> Result<ForSettlement, CommitError> {
    let keys = inbox.map(|binding| keys(binding, record_ids));
    let recorded = keys.as_ref().map_or(0, Vec::len);
    let in_queue_database = |binding: &InboxBinding, keys: &[InboxKey]| {
        binding.queue_table.clone().map(|table| InboxWrite {
            table,
            rows: keys.iter().map(InboxRow::from).collect(),
            retention_ms: binding.retention.as_millis() as i64,
        })
    };
    let source = &shared.source;
    if (follow_ups.is_empty() && state.is_empty()) || source.settles_follow_ups() {
        let mut left = ForSettlement {
            recorded,
            ..ForSettlement::default()
        };
        if let (Some(binding), Some(keys)) = (inbox, keys) {
            if source.records_inbox(binding) {
                left.inbox = in_queue_database(binding, &keys);
            } else if follow_ups.is_empty() {
                binding.recorder.record(keys).await.map_err(|e| {
                    CommitError::Failed(format!(
                        "inbox record failed after the handler succeeded: {e}"
                    ))
                })?;
            } else {
                left.record_after = keys;
            }
        }
        left.follow_ups = follow_ups;
        left.state = state;
        return Ok(left);
    }
    // A broker message with follow-ups: they and an inbox of the queue database commit
    // together, before the acknowledgement. Without an inbox record there, a commit mark
    // keeps a redelivery of a committed success from committing again.
    let write = inbox
        .zip(keys.as_deref())
        .and_then(|(b, k)| in_queue_database(b, k))
        .filter(|write| !write.rows.is_empty());
    let mark = mark.filter(|_| write.is_none()).map(|delivery| CommitMark {
        queue: shared.pipeline.name.to_string(),
        delivery,
    });
    // Committed with the queue's other deliveries that succeed at the same time.
    let targets: Vec<String> = follow_ups.iter().map(|f| f.queue.clone()).collect();
    let effects = EffectsCommit {
        inbox: write.clone(),
        mark,
        follow_ups,
        state,
    };
    let committed = shared
        .pipeline
        .committer
        .commit(effects)
        .await
        .map_err(|e| match e {
            QueueError::StateConflict(key) => CommitError::StateConflict(key),
            e => CommitError::Failed(format!("committing the handler's effects failed: {e}")),
        })?;
    if committed {
        for queue in &targets {
            shared.pipeline.enqueuer.ready(queue);
        }
    }
    if !committed {
        tracing::info!(queue = %shared.pipeline.name, "the follow-ups of this delivery were committed by an earlier delivery of the message; not again");
    }
    if let (Some(binding), Some(keys), None) = (inbox, keys, &write) {
        // Committed already: a failing record only leaves a later redelivery undetected.
        if let Err(e) = binding.recorder.record(keys).await {
            tracing::warn!(queue = %shared.pipeline.name, endpoint = %binding.endpoint, "inbox record failed after the handler's follow-ups were committed; a redelivery would run it again: {e}");
        }
    }
    Ok(ForSettlement {
        recorded,
        ..ForSettlement::default()
    })
}

/// Why a success's effects were not committed.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// A key it read and then set was changed meanwhile (`BUCKET/KEY`): the message runs
    /// again.
    StateConflict(String),
    /// The commit failed: a transient failure of the attempt.
    Failed(String),
}

/// The inbox keys of `record_ids` on `binding`'s endpoint.
fn keys(binding: &InboxBinding, record_ids: &[String]) -> Vec<InboxKey> {
    let mut keys: Vec<InboxKey> = record_ids
        .iter()
        .filter_map(|id| InboxKey::new(&binding.endpoint, id).ok())
        .collect();
    keys.dedup();
    keys
}

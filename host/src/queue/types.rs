//! The values that cross the [`QueueStore`](super::QueueStore) seam.

use serde::Serialize;

use super::Status;

/// A message to enqueue.
#[derive(Debug, Clone, Default)]
pub struct NewMessage {
    /// Identity: an existing message with this id in the queue is updated instead.
    pub id: Option<String>,
    /// The message JSON.
    pub payload: String,
    /// Higher runs first.
    pub priority: i32,
    /// Earliest processing time (Unix ms); `None` means now.
    pub process_at_ms: Option<i64>,
    /// Producer metadata.
    pub headers: Vec<(String, String)>,
    /// A custom status to store the message in (kept, not processed, until moved); `None`
    /// means pending, or sleeping when `process_at_ms` is in the future.
    pub status: Option<Status>,
    /// The error to store with the message (e.g. a failure that moved it here from an
    /// external provider).
    pub last_error: Option<String>,
    /// The delivery id this message stands in for (consumer inbox: recorded on success, e.g.
    /// the MessageId of a message moved in from an external provider).
    pub source_delivery_id: Option<String>,
    /// Attempts already made elsewhere (a message moved in from an external provider keeps
    /// its count); 0 for a new message.
    pub attempts: u32,
    /// The session key: in a queue with `sessions = true`, messages that share it run one at
    /// a time, in enqueue order. `None`: no session.
    pub session: Option<String>,
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnqueueStatus {
    /// A new message was added.
    Added,
    /// An existing message with the same id was updated.
    Updated,
    /// An identical message with the same id exists in an idempotent queue.
    Discarded,
}

/// The result of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    /// The stored message's key (0 for a message stored in an external provider).
    pub key: i64,
    /// What happened.
    pub status: EnqueueStatus,
}

/// The right to settle one leased message: its key and the fencing token of this lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The message key.
    pub key: i64,
    /// Fencing token; a later lease of the same message has a larger one.
    pub token: i64,
}

/// A message handed to a processor.
#[derive(Debug, Clone)]
pub struct LeasedMessage {
    /// The lease to settle it with.
    pub lease: Lease,
    /// Its queue.
    pub queue: String,
    /// Its identity, if any.
    pub id: Option<String>,
    /// New for every enqueue and update; the same for redeliveries.
    pub delivery_id: String,
    /// The message JSON.
    pub payload: String,
    /// Its priority.
    pub priority: i32,
    /// 1 on the first delivery.
    pub attempt: u32,
    /// When this version was enqueued (Unix ms).
    pub enqueued_at_ms: i64,
    /// Producer metadata.
    pub headers: Vec<(String, String)>,
    /// For a resubmission: the delivery id of the delivery it stands in for.
    pub source_delivery_id: Option<String>,
    /// Whether the delivery id is recorded in the inbox, when the lease statement checked it
    /// ([`super::QueueStore::lease_checking_inbox`]); `None` when it did not.
    pub inbox_processed: Option<bool>,
    /// Its session key, if any.
    pub session: Option<String>,
}

/// What to do with a leased message.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Done: move to processed.
    Complete,
    /// Try again at `at_ms`, keeping `error` (if any) as the last error.
    Retry {
        /// When the next attempt may start (Unix ms).
        at_ms: i64,
        /// Why this attempt did not succeed.
        error: Option<String>,
    },
    /// Give up: move to failed with this error.
    Fail {
        /// Why.
        error: String,
    },
    /// Hand the message back untouched (shutdown): pending again, this attempt not counted.
    Release,
    /// Handed over to another system (a pending handoff in a session): kept `handed-off`,
    /// blocking its session until an operator settles it.
    HandOff,
}

/// One outcome to apply.
#[derive(Debug, Clone)]
pub struct Settlement {
    /// Which lease.
    pub lease: Lease,
    /// What to do.
    pub disposition: Disposition,
    /// On completion, keep the processed message (false when the queue's retention count
    /// is zero: it is deleted at once, an identified one recorded in history first).
    pub keep_processed: bool,
    /// On completion, how it was completed (shown with the message), e.g. `skipped: duplicate`.
    pub outcome: Option<String>,
    /// Inbox records to write in the same transaction (an inbox table in the queue database).
    pub inbox: Option<super::InboxWrite>,
    /// The message's session as (queue, session key): its order is tended in the same
    /// transaction (siblings parked behind a block, drained once it is resolved).
    pub session: Option<(String, String)>,
    /// On a success, the follow-ups its handler staged: written in the same transaction when
    /// the settlement is applied, never otherwise.
    pub follow_ups: Vec<super::FollowUp>,
    /// On a success, the key-value changes its handler staged: committed in the same
    /// transaction when the settlement is applied. When one of them conflicts (a key read
    /// and then set was changed meanwhile), nothing of it is: [`Settlement::on_conflict`]
    /// is applied instead.
    pub state: Vec<super::StateWrite>,
    /// What is applied instead on a state conflict (default: back to pending, the attempt
    /// not counted, so the message runs again).
    pub on_conflict: Disposition,
}

impl Settlement {
    /// A settlement that keeps processed messages.
    pub fn new(lease: Lease, disposition: Disposition) -> Self {
        Settlement {
            lease,
            disposition,
            keep_processed: true,
            outcome: None,
            inbox: None,
            session: None,
            follow_ups: Vec::new(),
            state: Vec::new(),
            on_conflict: Disposition::Release,
        }
    }
}

/// A previous version of an identified message.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    /// The message's queue.
    pub queue: String,
    /// The message's id.
    pub id: String,
    /// The key of the message row it was recorded from.
    pub message_key: i64,
    /// Version number of the message at the time.
    pub version: i64,
    /// Its delivery id.
    pub delivery_id: String,
    /// Its payload.
    pub payload: String,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its priority.
    pub priority: i32,
    /// The status it had when it was superseded (e.g. processed, failed, pending).
    #[serde(serialize_with = "status_name")]
    pub status: Status,
    /// Attempts it had used.
    pub attempts: u32,
    /// Its last error.
    pub last_error: Option<String>,
    /// When it was enqueued (Unix ms).
    pub enqueued_at_ms: i64,
    /// When it was processed (Unix ms), if it was.
    pub processed_at_ms: Option<i64>,
    /// When it was recorded (Unix ms).
    pub recorded_at_ms: i64,
}

/// How long processed messages and history are kept, per queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Delete processed messages older than this many milliseconds.
    pub max_age_ms: Option<i64>,
    /// Keep at most this many processed messages (newest first).
    pub max_count: Option<u64>,
    /// Versions of history kept per identified message.
    pub history_versions: u32,
}

/// Which messages a management command applies to.
#[derive(Debug, Clone, PartialEq)]
pub enum Selector {
    /// One message by key.
    Key(i64),
    /// Every message of a queue in a status.
    QueueStatus {
        /// The queue.
        queue: String,
        /// The status.
        status: Status,
    },
}

/// Whether a settlement was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettleResult {
    /// Applied.
    Applied,
    /// The lease had expired and the message was leased again (or changed): not applied.
    LeaseLost,
    /// A key-value change conflicted (`BUCKET/KEY`): the settlement's `on_conflict` was
    /// applied instead, nothing of its effects.
    StateConflict(String),
}

/// A message as stored, for inspection.
#[derive(Debug, Clone, Serialize)]
pub struct StoredMessage {
    /// Unique key of the message in the store.
    pub key: i64,
    /// Its queue.
    pub queue: String,
    /// Its identity, if any.
    pub id: Option<String>,
    /// Delivery id of the current version.
    pub delivery_id: String,
    /// Current status.
    #[serde(serialize_with = "status_name")]
    pub status: Status,
    /// The message JSON.
    pub payload: String,
    /// Producer metadata.
    pub headers: Vec<(String, String)>,
    /// Priority.
    pub priority: i32,
    /// Attempts made so far.
    pub attempts: u32,
    /// Earliest processing time (Unix ms).
    pub process_at_ms: i64,
    /// When the message was first enqueued (Unix ms).
    pub created_at_ms: i64,
    /// When the current version was enqueued (Unix ms).
    pub enqueued_at_ms: i64,
    /// Last change (Unix ms).
    pub updated_at_ms: i64,
    /// When it was processed (Unix ms).
    pub processed_at_ms: Option<i64>,
    /// When the current lease ends (Unix ms).
    pub lease_expires_at_ms: Option<i64>,
    /// The last error, kept through retries and in the failed status.
    pub last_error: Option<String>,
    /// Version number: 1 when added, incremented by every update.
    pub version: i64,
    /// How a processed message was completed (e.g. `completed`, `skipped: duplicate`).
    pub outcome: Option<String>,
    /// For a resubmission: the delivery it stands in for.
    pub source_delivery_id: Option<String>,
    /// Its session key, if any.
    pub session: Option<String>,
    /// The version enqueued while the message was leased, applied on release.
    pub next: Option<NextVersion>,
}

/// A version waiting for the current processor to release the message.
#[derive(Debug, Clone, Serialize)]
pub struct NextVersion {
    /// Its payload.
    pub payload: String,
    /// Its priority.
    pub priority: i32,
    /// Its processing date (Unix ms).
    pub process_at_ms: i64,
    /// The custom status it goes to, if any.
    pub status: Option<String>,
}

fn status_name<S: serde::Serializer>(status: &Status, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(status.as_str())
}

/// Which messages to list: newest first (by key, descending).
#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only messages with this MessageId.
    pub id: Option<String>,
    /// Only messages of this session.
    pub session: Option<String>,
    /// Only keys below this one: the cursor of the next page (the last key of the previous).
    pub before_key: Option<i64>,
    /// At most this many.
    pub limit: u32,
}

/// A session blocked by one of its messages (failed, or handed off), with what waits behind it.
#[derive(Debug, Clone, Serialize)]
pub struct BlockedSession {
    /// The queue.
    pub queue: String,
    /// The session key.
    pub session: String,
    /// The key of the message that blocks it.
    pub blocked_by_key: i64,
    /// That message's MessageId, if it has one.
    pub blocked_by_id: Option<String>,
    /// The delivery it stands in for, else its own delivery id: what a resolving
    /// resubmission records in the inbox.
    pub blocked_by_delivery_id: String,
    /// Its status (`failed` or `handed-off`).
    #[serde(serialize_with = "status_name")]
    pub status: Status,
    /// Its last error.
    pub last_error: Option<String>,
    /// Messages of the session parked behind it.
    pub parked: u64,
    /// Since when (Unix ms): the blocker's last change.
    pub since_ms: i64,
}

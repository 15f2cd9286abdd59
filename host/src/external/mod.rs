//! External pending storage: queues whose pending messages live in a broker instead of the
//! SQL queue. Owns the provider-independent parts — the envelope, the two seams every
//! provider implements ([`ExternalPendingStorage`] for the messages, [`ReadinessBridge`] for
//! the durable "this queue has work" notifications), the activation store that coalesces
//! notifications, the bridge loop with its health check, reconciliation, and the move of
//! failed and other non-pending messages into the SQL queue. Provider code lives in one
//! submodule each.

mod activation;
mod bridge;
mod envelope;
mod health;
mod processor;
mod providers;
mod reconcile;
pub mod redis;
mod run;
mod settler;

use async_trait::async_trait;

pub use activation::{ActivationStore, SqlActivations};
pub use bridge::run_bridge;
pub use envelope::{Envelope, EnvelopeError};
pub use health::ProviderHealth;
pub use processor::ExternalWorker;
pub use providers::{Provider, Providers};
pub use reconcile::{ReconciledQueue, run_reconciliation};
pub use run::{ExternalRuntime, external_queues, start};

use crate::queue::EnqueueStatus;

/// A failure of an external provider.
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// A Redis reply could not be read.
    #[error("redis reply: {0}")]
    RedisReply(#[from] ::redis::ParsingError),
    /// The provider answered something unexpected.
    #[error("{0}")]
    Protocol(String),
}

/// One message leased from a provider's processing channel.
#[derive(Debug, Clone)]
pub struct ExternalLeased {
    /// Fencing token: settles this lease and no later one.
    pub token: String,
    /// The raw broker body (an envelope, unless a direct producer wrote something else).
    pub body: String,
    /// 1 on the first delivery; counts deliveries whose lease expired.
    pub attempt: u32,
}

/// How much work an external queue holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Ready to lease.
    pub ready: u64,
    /// Scheduled for later.
    pub delayed: u64,
    /// Scheduled messages whose time has come (not yet promoted).
    pub delayed_due: u64,
    /// Leased now.
    pub leased: u64,
    /// Leased, with the lease expired (their host died).
    pub expired: u64,
}

impl Depth {
    /// Whether a processor has something to do.
    pub fn has_work(&self) -> bool {
        self.ready > 0 || self.delayed_due > 0 || self.expired > 0
    }
}

/// Where a queue's pending messages are kept, leased and settled.
#[async_trait]
pub trait ExternalPendingStorage: Send + Sync + 'static {
    /// Enqueue one ready message (and one readiness notification, atomically).
    async fn enqueue(
        &self,
        queue: &str,
        envelope: &Envelope,
        idempotent: bool,
    ) -> Result<EnqueueStatus, ExternalError>;

    /// Enqueue several ready messages with at most one readiness notification, appended
    /// only when at least one message was added.
    async fn enqueue_batch(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        idempotent: bool,
    ) -> Result<Vec<EnqueueStatus>, ExternalError>;

    /// Enqueue a message that becomes ready at `due_at_ms` (Unix ms).
    async fn enqueue_delayed(
        &self,
        queue: &str,
        envelope: &Envelope,
        due_at_ms: i64,
        idempotent: bool,
    ) -> Result<EnqueueStatus, ExternalError>;

    /// Lease up to `max` ready messages, highest priority first, each until `lease_ms` from
    /// now.
    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<ExternalLeased>, ExternalError>;

    /// Remove leased messages for good (processed, or moved into the SQL queue), given as
    /// (lease token, MessageId). Returns, per lease, whether it was still held.
    async fn settle(
        &self,
        queue: &str,
        settled: &[(String, Option<String>)],
    ) -> Result<Vec<bool>, ExternalError>;

    /// Hand leased messages back untouched (shutdown): ready again, the delivery not
    /// counted. Returns how many were still leased.
    async fn release(&self, queue: &str, tokens: &[String]) -> Result<u64, ExternalError>;

    /// Return messages whose lease expired to the ready set (at most `max`); returns how many.
    async fn return_expired(&self, queue: &str, max: u32) -> Result<u64, ExternalError>;

    /// How much work `queue` holds.
    async fn depth(&self, queue: &str) -> Result<Depth, ExternalError>;

    /// Whether the provider answers.
    async fn ping(&self) -> Result<(), ExternalError>;
}

/// One durable readiness notification.
#[derive(Debug, Clone)]
pub struct Notification {
    /// The logical queue it is for.
    pub queue: String,
    /// The provider's handle to acknowledge it with.
    pub handle: String,
}

/// Observes a provider's durable notification path. Never leases or settles messages.
#[async_trait]
pub trait ReadinessBridge: Send + Sync + 'static {
    /// Prepare the consumer (e.g. create consumer groups) for `queues`.
    async fn start(&self, queues: &[String]) -> Result<(), ExternalError>;

    /// Wait (bounded) for notifications on `queues`, including ones a crashed consumer left
    /// unacknowledged for longer than the claim delay.
    async fn receive(&self, queues: &[String]) -> Result<Vec<Notification>, ExternalError>;

    /// Acknowledge notifications whose activation is durable.
    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ExternalError>;

    /// Provider housekeeping the bridge owns (Redis: promote due delayed messages, with their
    /// readiness record); returns how many messages became ready.
    async fn promote_due(&self, queue: &str) -> Result<u64, ExternalError>;
}

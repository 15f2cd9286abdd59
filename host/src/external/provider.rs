//! The provider seam: what every broker that keeps pending messages implements. It is shaped
//! by what Redis, RabbitMQ, Kafka and Service Bus share, not by any one of them:
//!
//! - a **producer** side ([`Provider::publish`]) taking envelopes and [`PublishOptions`];
//! - a **consumer** side per queue ([`Consumer`]): `receive` hands out [`Delivery`]s with an
//!   opaque [`Handle`], the body bytes, the broker's delivery count where it has one, and the
//!   enqueued time and headers where it carries them; `ack` and `nack`. A consumer whose
//!   broker locks a delivery for a limited time renews the locks of the deliveries it handed
//!   out itself, until they are acknowledged or handed back (it sees both);
//! - [`Capabilities`]: what the broker does natively, so the host decides by capability,
//!   never by provider name (a delay without native delay waits in the SQL queue; id
//!   replacement or idempotency without support is a config error; attempts are counted by
//!   the host where the broker has only a redelivered flag);
//! - a readiness bridge ([`super::ReadinessBridge`]) and provider-owned background tasks;
//! - one classified error type, [`ProviderError`].

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Envelope, ReadinessBridge};
use crate::queue::EnqueueStatus;

/// What went wrong with a broker, sorted once so the host reacts the same way everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The broker cannot be reached or the connection dropped.
    Unavailable,
    /// The broker did not answer in time.
    Timeout,
    /// Credentials or permissions were refused.
    Denied,
    /// The broker answered something unexpected, or refused a declaration.
    Protocol,
    /// The lease, lock or channel a delivery belonged to is gone: its outcome was not applied
    /// and the broker delivers the message again.
    LockLost,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Denied => "denied",
            ErrorKind::Protocol => "protocol error",
            ErrorKind::LockLost => "lock lost",
        })
    }
}

/// A failure of an external provider: its kind and the broker's own error.
#[derive(Debug, thiserror::Error)]
#[error("{provider} ({kind}): {message}")]
pub struct ProviderError {
    /// How the host should treat it.
    pub kind: ErrorKind,
    /// The provider type (`redis`, `rabbitmq`, …).
    pub provider: &'static str,
    /// What happened, with the broker's words.
    pub message: String,
    /// The underlying error, when there is one.
    #[source]
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl ProviderError {
    /// An error of `kind` from `provider`.
    pub fn new(provider: &'static str, kind: ErrorKind, message: impl Into<String>) -> Self {
        ProviderError {
            kind,
            provider,
            message: message.into(),
            source: None,
        }
    }

    /// An error of `kind` caused by `source`.
    pub fn with_source<E: std::error::Error + Send + Sync + 'static>(
        provider: &'static str,
        kind: ErrorKind,
        source: E,
    ) -> Self {
        ProviderError {
            kind,
            provider,
            message: source.to_string(),
            source: Some(Arc::new(source)),
        }
    }
}

/// How a broker counts deliveries of one message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CountKind {
    /// An exact count per delivery (Redis hash, quorum `x-delivery-count`, Service Bus).
    Exact,
    /// Only whether the message was delivered before (RabbitMQ classic queues): the host
    /// counts redeliveries itself, durably.
    RedeliveredFlag,
    /// Nothing (Kafka): the host counts redeliveries itself, durably.
    #[default]
    None,
}

/// What a provider does natively. The host supplies or refuses the rest. The default is a
/// provider that does none of it (and counts nothing): a provider states what it adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Higher priorities are delivered first.
    pub priority: bool,
    /// A message can be scheduled for later in the broker.
    pub delay: bool,
    /// An enqueue with a MessageId replaces the pending message with that id.
    pub id_replacement: bool,
    /// An identical enqueue of a pending MessageId is discarded.
    pub idempotency: bool,
    /// How deliveries are counted.
    pub delivery_count: CountKind,
    /// The ready depth of a queue can be read.
    pub depth: bool,
    /// A message handed back with `nack { counted: false }` is not counted as a delivery.
    pub uncounted_release: bool,
    /// Messages published with one session key ([`Envelope::session`]) reach one consumer at
    /// a time, in the order they were published, and come back with that key
    /// ([`Delivery::session`]) — what `sessions = true` needs (Kafka: the record key picks
    /// the partition). Without it, a queue with sessions is a config error.
    pub keyed_order: bool,
}

/// How [`Provider::publish`] stores messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishOptions {
    /// Ready at this time (Unix ms) instead of now. Only passed to providers with
    /// [`Capabilities::delay`].
    pub due_at_ms: Option<i64>,
    /// Discard an identical pending message with the same MessageId. Only set for providers
    /// with [`Capabilities::idempotency`].
    pub idempotent: bool,
    /// A MessageId replaces the pending message with that id. Only set for providers with
    /// [`Capabilities::id_replacement`].
    pub replace_by_id: bool,
}

/// The opaque right to settle one delivery, owned by the consumer that produced it (a Redis
/// fencing token, a RabbitMQ delivery tag with its channel, a Kafka partition and offset, a
/// Service Bus lock token).
#[derive(Clone)]
pub struct Handle(Arc<dyn Any + Send + Sync>);

impl Handle {
    /// Wrap a provider's own handle value.
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        Handle(Arc::new(value))
    }

    /// The value `provider` made this handle with. A handle another provider made (or of
    /// another type) never reaches a provider when the host is wired right; it is an error
    /// naming both, never skipped.
    pub fn get<T: Any>(&self, provider: &'static str) -> Result<&T, ProviderError> {
        self.0.downcast_ref().ok_or_else(|| {
            ProviderError::new(
                provider,
                ErrorKind::Protocol,
                format!(
                    "a delivery handle that is not a {} reached the {provider} provider (a handle of another provider or queue): not applied",
                    std::any::type_name::<T>()
                ),
            )
        })
    }

    /// [`Handle::get`] for each of `handles`, all or the first error.
    pub fn all<'h, T: Any>(
        handles: impl IntoIterator<Item = &'h Handle>,
        provider: &'static str,
    ) -> Result<Vec<&'h T>, ProviderError> {
        handles.into_iter().map(|h| h.get(provider)).collect()
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handle(..)")
    }
}

/// How many times the broker delivered a message, as far as it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryCount {
    /// Exactly: 1 on the first delivery.
    Exact(u32),
    /// Whether it was delivered before.
    Redelivered(bool),
    /// Unknown: the host counts every delivery durably (one write each). A broker that can
    /// tell a replay (Kafka: an offset below the position a partition was assigned at)
    /// should report [`DeliveryCount::Redelivered`] instead, so only replays are written.
    Unknown,
}

/// One message received from a queue's processing channel.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Settles this delivery and no other.
    pub handle: Handle,
    /// The raw body: an envelope, unless a direct producer wrote something else.
    pub body: bytes::Bytes,
    /// The broker's count.
    pub count: DeliveryCount,
    /// A stable identity of this message in the broker, the same on every redelivery and
    /// different for every message (Kafka: topic, partition and offset; RabbitMQ: the id
    /// Wharf publishes with). Where the broker does not count deliveries the host counts them
    /// under it; without one, under the MessageId or the body's SHA-256.
    pub identity: Option<String>,
    /// When the broker says it was enqueued (Unix ms).
    pub enqueued_at_ms: Option<i64>,
    /// Broker properties and producer headers, as text.
    pub headers: Vec<(String, String)>,
    /// The broker's own key that keeps order ([`Capabilities::keyed_order`]), where it has
    /// one: the session key in a queue with sessions.
    pub session: Option<String>,
}

/// How a delivery is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nack {
    /// Back to the queue (true) or dropped / dead-lettered by the broker (false).
    pub requeue: bool,
    /// Whether this delivery should count as an attempt (where the broker lets the consumer
    /// choose, [`Capabilities::uncounted_release`]).
    pub counted: bool,
}

/// The consumer settings of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerSettings {
    /// Most deliveries held unsettled at once (the queue's concurrency, or the provider's
    /// prefetch).
    pub prefetch: u32,
    /// How long a delivery may stay unsettled before the broker may give it to another
    /// consumer, where the consumer chooses (Redis).
    pub lease: std::time::Duration,
}

/// The processing consumer of one queue.
#[async_trait]
pub trait Consumer: Send + Sync + 'static {
    /// Up to `max` deliveries available now (a pull may wait briefly); empty when none.
    async fn receive(&self, max: u32) -> Result<Vec<Delivery>, ProviderError>;

    /// The consumer group it receives in, where the broker has them (Kafka): a process
    /// span's `messaging.consumer.group.name`.
    fn group(&self) -> Option<&str> {
        None
    }

    /// Resolves when deliveries arrived without being asked for (push brokers), or when the
    /// consumer is not consuming (so that `receive` reconnects). A consumer that must keep
    /// polling to stay in its group (Kafka) runs its own poll loop, buffers, and reports
    /// itself here like a push broker; it handles partition revocation itself (acknowledges
    /// what is settled, and reports deliveries of revoked partitions as no longer held).
    /// Pure pull consumers never resolve.
    async fn pushed(&self) {
        std::future::pending::<()>().await
    }

    /// Whether `handle` is still held (its lease, lock or channel not gone), as far as the
    /// consumer knows without asking the broker. Checked before a message is moved into the
    /// SQL queue, so a delivery the broker already took back is not also kept there.
    fn holds(&self, handle: &Handle) -> bool {
        let _ = handle;
        true
    }

    /// Whether a delivery may wait for a free slot after `receive` handed it out: its lease
    /// runs from the receive for the consumer's [`ConsumerSettings::lease`] (nothing renews
    /// it, nothing else takes it back sooner) and `nack { counted: false }` leaves it as it
    /// was. Then a busy queue receives its next batch while the current one runs, and hands
    /// back what waited too long. Push brokers prefetch by themselves and answer false.
    fn leases_on_receive(&self) -> bool {
        false
    }

    /// Remove deliveries for good (processed, or moved into the SQL queue). Returns, per
    /// handle, whether it was still held; a lost one returns to the broker by itself.
    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError>;

    /// Hand deliveries back.
    async fn nack(&self, handles: &[Handle], nack: Nack) -> Result<(), ProviderError>;

    /// Stop the broker from handing out more deliveries (shutdown begins). Returns the ones
    /// it already pushed that [`Consumer::receive`] did not hand out, for the host to hand
    /// back. Acknowledgements of deliveries still running keep working.
    async fn stop(&self) -> Vec<Delivery> {
        Vec::new()
    }

    /// Close the consumer after the last settlement (shutdown ends).
    async fn close(&self) {}
}

/// How much work an external queue holds, where the provider can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Deliverable now.
    pub ready: u64,
    /// Scheduled for later.
    pub delayed: u64,
    /// Delivered and not settled yet.
    pub in_flight: u64,
}

/// What a log-based broker's processing group has not committed yet on a queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lag {
    /// Messages past the group's committed position.
    pub messages: u64,
    /// When the oldest of them was written (ms since the Unix epoch): the record timestamp
    /// at the committed position; `None` with no lag or when the broker did not say.
    pub oldest_ms: Option<i64>,
}

/// One configured external provider.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider type (`redis`, `rabbitmq`, …).
    fn kind(&self) -> &'static str;

    /// What it does natively.
    fn capabilities(&self) -> Capabilities;

    /// Prepare `queues` (declare exchanges, queues, groups, subscriptions); idempotent. A
    /// declaration that conflicts with an existing one is a [`ErrorKind::Protocol`] error.
    async fn prepare(&self, queues: &[String]) -> Result<(), ProviderError>;

    /// Publish `envelopes` to `queue`, each with one readiness notification (a batch needs
    /// at most one). Returns one status per envelope.
    async fn publish(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        options: PublishOptions,
    ) -> Result<Vec<EnqueueStatus>, ProviderError>;

    /// Open the processing consumer of `queue`.
    async fn consumer(
        &self,
        queue: &str,
        settings: ConsumerSettings,
    ) -> Result<Arc<dyn Consumer>, ProviderError>;

    /// Open the readiness bridge of `queues` (its own connection).
    async fn readiness(&self, queues: &[String])
    -> Result<Arc<dyn ReadinessBridge>, ProviderError>;

    /// How much work `queue` holds. Only asked of providers with [`Capabilities::depth`].
    async fn depth(&self, queue: &str) -> Result<Depth, ProviderError> {
        let _ = queue;
        Err(ProviderError::new(
            self.kind(),
            ErrorKind::Protocol,
            "this provider cannot tell a queue's depth",
        ))
    }

    /// The processing group's lag on `queue` (messages past its committed position, and
    /// when the oldest of them was written), for a log-based broker; `None` where the
    /// broker has no such thing.
    async fn lag(&self, queue: &str) -> Result<Option<Lag>, ProviderError> {
        let _ = queue;
        Ok(None)
    }

    /// One round trip to the broker about `queues`, answered within `timeout` when the
    /// broker is reachable: the health probe for providers whose connections cannot tell a
    /// silent network cut by themselves (Kafka, Service Bus). The default does nothing: a
    /// Redis connection times out its blocking reads and an AMQP connection its heartbeats.
    async fn probe(&self, queues: &[String], timeout: Duration) -> Result<(), ProviderError> {
        let _ = (queues, timeout);
        Ok(())
    }

    /// Start the provider's own housekeeping for `queues` (Redis: promoting due delayed
    /// messages, returning expired leases) until `shutdown`.
    fn background(&self, queues: &[String], shutdown: CancellationToken) -> Vec<JoinHandle<()>> {
        let _ = (queues, shutdown);
        Vec::new()
    }

    /// Close the provider's own connections (the host or command is done with it).
    async fn close(&self) {}
}

//! External pending storage: queues whose pending messages live in a broker instead of the
//! SQL queue. Owns the provider-independent parts — the envelope, the provider seam
//! ([`Provider`], [`Consumer`], [`ReadinessBridge`], [`Capabilities`]), the registry of
//! provider types, the activation store that coalesces readiness notifications, the bridge
//! loop with its health check, reconciliation, host-side delivery counting, and the source
//! that feeds external deliveries into the one processing pipeline (moving failed and other
//! non-pending messages into the SQL queue). Provider code lives in one submodule each.

mod activation;
mod attempts;
mod bridge;
mod config_check;
mod envelope;
mod health;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod kind;
mod provider;
mod providers;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
mod reconcile;
#[cfg(feature = "redis")]
pub mod redis;
pub mod registry;
mod run;
#[cfg(feature = "servicebus")]
pub mod servicebus;

use async_trait::async_trait;

pub use activation::{ActivationStore, SqlActivations};
pub use attempts::{AttemptCounter, SqlAttempts, attempt_key, run_purge};
pub(crate) use attempts::{attempts_of, counting_key};
pub use bridge::run_bridge;
pub use config_check::check_config;
pub use envelope::{Envelope, EnvelopeError};
pub use health::{ProviderHealth, run_probe};
pub use provider::{
    Capabilities, Consumer, ConsumerSettings, CountKind, Delivery, DeliveryCount, Depth, ErrorKind,
    Handle, Lag, Nack, Provider, ProviderError, PublishOptions,
};
pub use providers::Providers;
pub use reconcile::{ReconciledQueue, run_reconciliation};
pub use run::{ExternalRuntime, external_queues, start};

/// One durable readiness notification.
#[derive(Debug, Clone)]
pub struct Notification {
    /// The logical queue it is for.
    pub queue: String,
    /// The provider's handle to acknowledge it with.
    pub handle: Handle,
}

/// Observes a provider's durable notification path for a set of queues. Never leases or
/// settles processing messages.
#[async_trait]
pub trait ReadinessBridge: Send + Sync + 'static {
    /// Prepare the consumer (e.g. create consumer groups, start consuming).
    async fn start(&self) -> Result<(), ProviderError>;

    /// Wait (bounded, about a second) for notifications, including ones a crashed consumer
    /// left unacknowledged.
    async fn receive(&self) -> Result<Vec<Notification>, ProviderError>;

    /// Acknowledge notifications whose activation is durable.
    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ProviderError>;

    /// Close the bridge's connection (shutdown); unacknowledged notifications stay with the
    /// broker.
    async fn close(&self) {}
}

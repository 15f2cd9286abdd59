//! The Azure Service Bus provider, with the documented topology: producers send to the
//! **topic** `{queue_prefix}{queue}`; the host receives from that topic's **processing**
//! subscription (peek-lock) and, independently, from its **readiness** subscription (the
//! bridge). The topic and both subscriptions must exist (entity management needs the
//! namespace's Manage right, which a host should not hold).
//!
//! Publishing is "Send Message Batch" with the envelope as body and `MessageId` set, and
//! `ScheduledEnqueueTimeUtc` for a future message (native scheduling). Consuming peek-locks
//! ([`consumer`]), completes after the settlement or the move into SQL is durable, unlocks
//! on release and at shutdown, and renews locks while a handler runs. The broker's
//! `DeliveryCount` is the attempt.
//!
//! Capabilities: native delay and an exact delivery count; no priority, id replacement,
//! idempotency or depth.

mod bridge;
mod consumer;
mod endpoint;
mod locks;
mod receivers;
mod rest;
mod sas;
mod settings;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use azure_messaging_servicebus::service_bus::SettableBrokerProperties;

pub use bridge::ServiceBusReadiness;
pub use consumer::{IDLE_WAIT, MAX_RECEIVERS, PAUSE_AFTER, ServiceBusConsumer};
pub use endpoint::{Redirect, http_client};
pub use settings::{Connection, ServiceBusSettings};

use super::kind::{ProviderKind, SettingsError, parse_settings};
use super::{
    Capabilities, Consumer, ConsumerSettings, Envelope, ErrorKind, Provider, ProviderError,
    PublishOptions, ReadinessBridge,
};
use crate::queue::{EnqueueStatus, now_ms};
use rest::{Outgoing, Rest};

const KIND: &str = "servicebus";

/// Largest "Send Message Batch" request body (the Standard tier takes 256 KB per batch).
const MAX_BATCH_BYTES: usize = 192 * 1024;

/// `type = "servicebus"`.
pub struct ServiceBusKind;

#[async_trait]
impl ProviderKind for ServiceBusKind {
    fn name(&self) -> &'static str {
        KIND
    }

    fn check(&self, settings: &toml::Table) -> Result<Capabilities, SettingsError> {
        parse_settings::<ServiceBusSettings>(settings)?.check()
    }

    async fn open(
        &self,
        _name: &str,
        settings: &toml::Table,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        let settings: ServiceBusSettings = parse_settings(settings).map_err(|e| {
            ProviderError::new(
                KIND,
                ErrorKind::Protocol,
                format!("`{}`: {}", e.key, e.reason),
            )
        })?;
        Ok(Arc::new(ServiceBusProvider::open(settings)?))
    }
}

/// Pending messages in Service Bus topics.
pub struct ServiceBusProvider {
    settings: ServiceBusSettings,
    capabilities: Capabilities,
    rest: Arc<Rest>,
}

impl ServiceBusProvider {
    /// A provider for `settings` (checked); nothing is sent until it is used.
    pub fn open(settings: ServiceBusSettings) -> Result<Self, ProviderError> {
        let bad = |e: SettingsError| {
            ProviderError::new(
                KIND,
                ErrorKind::Protocol,
                format!("`{}`: {}", e.key, e.reason),
            )
        };
        let capabilities = settings.check().map_err(bad)?;
        let connection = settings.connection().map_err(bad)?;
        let http = http_client(settings.endpoint_override.as_deref()).map_err(|e| {
            ProviderError::new(
                KIND,
                ErrorKind::Protocol,
                format!("`endpoint_override`: {e}"),
            )
        })?;
        Ok(ServiceBusProvider {
            rest: Arc::new(Rest::new(http, connection)),
            settings,
            capabilities,
        })
    }

    fn outgoing(envelope: &Envelope, due_at_ms: Option<i64>) -> Outgoing {
        // Scheduled to the next whole second (the REST API's dates have no fraction), so a
        // message is never visible before it is due.
        let scheduled = due_at_ms.filter(|due| *due > now_ms()).map(|due| {
            let secs = due.div_euclid(1000) + i64::from(due.rem_euclid(1000) > 0);
            time::OffsetDateTime::from(UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64))
        });
        Outgoing {
            body: envelope.to_json(),
            broker: SettableBrokerProperties {
                message_id: envelope.message_id.as_deref().map(broker_message_id),
                scheduled_enqueue_time_utc: scheduled,
                ..SettableBrokerProperties::default()
            },
            properties: envelope.trace.clone(),
        }
    }
}

/// The broker's `MessageId` for a MessageId: itself up to Service Bus's 128 characters, else
/// `sha256:` and its hash (64 hex digits), which keeps duplicate detection per id. The full
/// id always travels in the envelope.
fn broker_message_id(id: &str) -> String {
    use sha2::{Digest, Sha256};
    if id.chars().count() <= 128 {
        return id.to_string();
    }
    format!("sha256:{}", hex::encode(Sha256::digest(id.as_bytes())))
}

#[async_trait]
impl Provider for ServiceBusProvider {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn prepare(&self, _queues: &[String]) -> Result<(), ProviderError> {
        // The entities are the namespace owner's; a missing one is reported by the first
        // receive (health) or send (error), naming it.
        Ok(())
    }

    async fn publish(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        options: PublishOptions,
    ) -> Result<Vec<EnqueueStatus>, ProviderError> {
        let topic = self.settings.topic(queue);
        let mut batch = Vec::new();
        let mut size = 0;
        for envelope in envelopes {
            let message = Self::outgoing(envelope, options.due_at_ms);
            let estimate = message.body.len() * 2 + 256;
            if !batch.is_empty() && size + estimate > MAX_BATCH_BYTES {
                self.rest.send(&topic, &std::mem::take(&mut batch)).await?;
                size = 0;
            }
            size += estimate;
            batch.push(message);
        }
        if !batch.is_empty() {
            self.rest.send(&topic, &batch).await?;
        }
        Ok(vec![EnqueueStatus::Added; envelopes.len()])
    }

    async fn consumer(
        &self,
        queue: &str,
        settings: ConsumerSettings,
    ) -> Result<Arc<dyn Consumer>, ProviderError> {
        Ok(Arc::new(ServiceBusConsumer::new(
            self.rest.clone(),
            self.settings.topic(queue),
            self.settings.processing_subscription.clone(),
            settings.prefetch,
            self.settings.lock_renewal,
        )))
    }

    /// A GET of the first queue's topic: the long-polling receives allow 30 s beyond their
    /// wait, this answers at once.
    async fn probe(&self, queues: &[String], _timeout: Duration) -> Result<(), ProviderError> {
        match queues.first() {
            Some(queue) => self.rest.reach(&self.settings.topic(queue)).await,
            None => Ok(()),
        }
    }

    async fn readiness(
        &self,
        queues: &[String],
    ) -> Result<Arc<dyn ReadinessBridge>, ProviderError> {
        Ok(Arc::new(ServiceBusReadiness::new(
            self.rest.clone(),
            queues
                .iter()
                .map(|q| (q.clone(), self.settings.topic(q)))
                .collect(),
            self.settings.readiness_subscription.clone(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::broker_message_id;

    #[test]
    fn long_ids_become_their_hash_within_the_brokers_limit() {
        assert_eq!(broker_message_id("order-1"), "order-1");
        let exact = "a".repeat(128);
        assert_eq!(broker_message_id(&exact), exact);
        let long = broker_message_id(&"a".repeat(129));
        assert!(long.starts_with("sha256:") && long.len() == 71, "{long}");
        assert_ne!(long, broker_message_id(&"b".repeat(129)));
    }
}

//! The RabbitMQ provider, with the documented topology: per queue a durable fan-out exchange
//! `{exchange_prefix}{queue}`, and bound to it the durable processing queue
//! `{queue_prefix}{queue}` and the readiness queue `{queue_prefix}{queue}{readiness_suffix}`.
//! Producers publish to the exchange only; the host declares all three at start
//! (idempotently; a conflicting existing declaration stops start-up with the broker's words).
//!
//! Publishing is persistent with publisher confirms; the body is the envelope, with the
//! `message_id`, `priority` and `timestamp` properties set. Consuming is push (`basic.consume`
//! with a prefetch) with manual acknowledgement only after the settlement, or the move into
//! SQL, is durable; releases are `nack` with requeue. A lost connection or channel is
//! reconnected on the next call; its unacknowledged deliveries return to the queue.
//!
//! Capabilities: priority when `max_priority` is set (classic queues), no native delay, id
//! replacement or idempotency; delivery count: `x-delivery-count` on quorum queues, only the
//! redelivered flag on classic queues (the host counts, durably); depth by passive declare.

mod acks;
mod bridge;
mod consumer;
mod session;
mod settings;
mod topology;

use std::sync::Arc;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Mutex;

pub use bridge::RabbitReadiness;
pub use consumer::RabbitConsumer;
pub use settings::{Names, QueueType, RabbitMqKind, RabbitSettings};

use super::{
    Capabilities, Consumer, ConsumerSettings, Depth, Envelope, ErrorKind, Provider, ProviderError,
    PublishOptions, ReadinessBridge,
};
use crate::queue::{EnqueueStatus, now_ms};

const KIND: &str = "rabbitmq";

/// Sort a lapin error into the provider error kinds.
pub(crate) fn error(e: lapin::Error) -> ProviderError {
    let kind = match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.get_id() {
            403 => ErrorKind::Denied,
            _ => ErrorKind::Protocol,
        },
        lapin::ErrorKind::ParsingError(_)
        | lapin::ErrorKind::SerialisationError(_)
        | lapin::ErrorKind::InvalidProtocolVersion(_) => ErrorKind::Protocol,
        _ => ErrorKind::Unavailable,
    };
    ProviderError::with_source(KIND, kind, e)
}

pub use crate::headers::{
    RABBITMQ_IDENTITY as IDENTITY_HEADER, RABBITMQ_SESSION as SESSION_HEADER,
};

/// Longest a connection attempt may take (a broker that does not answer at all).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connect to `url`, on the tokio runtime, named `name` in the broker's connection list.
pub(crate) async fn connect(url: &str, name: &str) -> Result<Connection, ProviderError> {
    let properties = lapin::ConnectionProperties::default()
        .with_connection_name(name.into())
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, properties)).await {
        Ok(connected) => connected.map_err(error),
        Err(_) => Err(ProviderError::new(
            KIND,
            ErrorKind::Timeout,
            format!("no answer within {CONNECT_TIMEOUT:?}"),
        )),
    }
}

/// The connection and confirm-mode channel publications and declarations use, reopened
/// after a failure.
struct Link {
    url: String,
    name: String,
    open: Mutex<Option<(Connection, Channel)>>,
    /// Queues whose topology was declared on the current connection.
    declared: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Link {
    /// The open channel, connecting first when needed.
    async fn channel(&self) -> Result<Channel, ProviderError> {
        let mut open = self.open.lock().await;
        if let Some((conn, channel)) = &*open
            && conn.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        *open = None;
        self.declared.lock().expect("declared queues").clear();
        let conn = connect(&self.url, &self.name).await?;
        let channel = conn.create_channel().await.map_err(error)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(error)?;
        *open = Some((conn, channel.clone()));
        Ok(channel)
    }

    /// Whether `queue`'s topology was declared on the current connection.
    fn is_declared(&self, queue: &str) -> bool {
        self.declared
            .lock()
            .expect("declared queues")
            .contains(queue)
    }

    /// `queue`'s topology was declared.
    fn declared(&self, queue: &str) {
        self.declared
            .lock()
            .expect("declared queues")
            .insert(queue.to_string());
    }

    /// A channel of its own on the connection (a failed declaration closes its channel).
    async fn spare_channel(&self) -> Result<Channel, ProviderError> {
        self.channel().await?;
        let open = self.open.lock().await;
        let (conn, _) = open.as_ref().expect("just opened");
        conn.create_channel().await.map_err(error)
    }
}

/// Pending messages in RabbitMQ.
pub struct RabbitProvider {
    name: String,
    settings: RabbitSettings,
    link: Link,
}

impl RabbitProvider {
    /// A provider for `settings` (`name` is the `[providers.NAME]` name); it connects on
    /// first use, so a broker that is down at start-up does not stop the host.
    pub async fn open(name: &str, settings: RabbitSettings) -> Result<Self, ProviderError> {
        let link = Link {
            url: settings.connection_url(),
            name: format!("wharf {name} publisher"),
            open: Mutex::new(None),
            declared: std::sync::Mutex::new(std::collections::HashSet::new()),
        };
        Ok(RabbitProvider {
            name: name.to_string(),
            settings,
            link,
        })
    }

    /// The settings it was opened with.
    pub fn settings(&self) -> &RabbitSettings {
        &self.settings
    }

    fn properties(&self, envelope: &Envelope) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(
            IDENTITY_HEADER.into(),
            AMQPValue::LongString(format!("{:032x}", rand::random::<u128>()).into()),
        );
        if let Some(session) = &envelope.session {
            headers.insert(
                SESSION_HEADER.into(),
                AMQPValue::LongString(session.as_str().into()),
            );
        }
        for (name, value) in &envelope.trace {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(value.as_str().into()),
            );
        }
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers)
            .with_content_type(ShortString::from("application/json"))
            .with_timestamp(now_ms().div_euclid(1000) as u64);
        // An AMQP short string holds at most 255 bytes; a longer id travels in the envelope
        // only (the property is a convenience for direct consumers, not Wharf's identity).
        if let Some(id) = envelope.message_id.as_ref().filter(|id| id.len() <= 255) {
            properties = properties.with_message_id(ShortString::from(id.as_str()));
        }
        if let Some(max) = self.settings.max_priority {
            properties = properties.with_priority(envelope.priority.clamp(0, i32::from(max)) as u8);
        }
        properties
    }
}

#[async_trait]
impl Provider for RabbitProvider {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        self.settings.capabilities()
    }

    async fn prepare(&self, queues: &[String]) -> Result<(), ProviderError> {
        for queue in queues {
            let channel = self.link.spare_channel().await?;
            topology::declare(&channel, &self.settings, queue).await?;
            self.link.declared(queue);
            let _ = channel.close(200, "declared").await;
        }
        Ok(())
    }

    async fn publish(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        options: PublishOptions,
    ) -> Result<Vec<EnqueueStatus>, ProviderError> {
        let _ = options; // no native delay, idempotency or replacement: the router knows
        if !self.link.is_declared(queue) {
            // The first publication on this connection (the broker may have been down when
            // the host started, or lost its definitions).
            self.prepare(&[queue.to_string()]).await?;
        }
        let exchange = self.settings.names(queue).exchange;
        let channel = self.link.channel().await?;
        let mut confirms = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            let confirm = channel
                .basic_publish(
                    &exchange,
                    "",
                    BasicPublishOptions::default(),
                    envelope.to_json().as_bytes(),
                    self.properties(envelope),
                )
                .await
                .map_err(error)?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            let confirmation = confirm.await.map_err(error)?;
            if confirmation.is_nack() {
                return Err(ProviderError::new(
                    KIND,
                    ErrorKind::Unavailable,
                    format!(
                        "the broker refused a message for exchange `{exchange}` (negative publisher confirm)"
                    ),
                ));
            }
        }
        Ok(vec![EnqueueStatus::Added; envelopes.len()])
    }

    async fn consumer(
        &self,
        queue: &str,
        settings: ConsumerSettings,
    ) -> Result<Arc<dyn Consumer>, ProviderError> {
        let prefetch = self
            .settings
            .prefetch
            .unwrap_or(settings.prefetch.clamp(1, u32::from(u16::MAX)) as u16);
        Ok(Arc::new(RabbitConsumer::new(
            &self.settings,
            &self.name,
            queue,
            prefetch,
        )))
    }

    async fn readiness(
        &self,
        queues: &[String],
    ) -> Result<Arc<dyn ReadinessBridge>, ProviderError> {
        Ok(Arc::new(RabbitReadiness::new(
            &self.settings,
            &self.name,
            queues,
        )))
    }

    async fn depth(&self, queue: &str) -> Result<Depth, ProviderError> {
        let name = self.settings.names(queue).processing;
        let channel = self.link.spare_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel
            .queue_declare(&name, passive, FieldTable::default())
            .await
            .map_err(error)?;
        let _ = channel.close(200, "counted").await;
        Ok(Depth {
            ready: u64::from(declared.message_count()),
            delayed: 0,
            // Unacknowledged deliveries are not reported by a passive declare.
            in_flight: 0,
        })
    }

    async fn close(&self) {
        if let Some((conn, channel)) = self.link.open.lock().await.take() {
            let _ = channel.close(200, "done").await;
            let _ = conn.close(200, "done").await;
        }
    }
}

//! The `rabbitmq` provider type: its `[providers.NAME]` settings, checked without connecting,
//! the broker names they give each queue, and what a provider with them can do.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{KIND, RabbitProvider};
use crate::config::duration;
use crate::external::kind::{ProviderKind, SettingsError, parse_settings};
use crate::external::{Capabilities, CountKind, ErrorKind, Provider, ProviderError};

/// The queue type of the processing and readiness queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Classic queues: priorities; only a redelivered flag.
    #[default]
    Classic,
    /// Quorum queues: replicated; `x-delivery-count`; no priorities.
    Quorum,
}

/// `[providers.NAME]` with `type = "rabbitmq"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitSettings {
    /// Connection URL, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`.
    pub url: String,
    /// Prefix of each queue's fan-out exchange.
    #[serde(default = "RabbitSettings::default_prefix")]
    pub exchange_prefix: String,
    /// Prefix of each processing queue (and of its readiness queue).
    #[serde(default = "RabbitSettings::default_prefix")]
    pub queue_prefix: String,
    /// Suffix of each readiness queue.
    #[serde(default = "RabbitSettings::default_suffix")]
    pub readiness_suffix: String,
    /// Deliveries held unacknowledged per queue (default: the queue's concurrency).
    #[serde(default)]
    pub prefetch: Option<u16>,
    /// `classic` (default) or `quorum`.
    #[serde(default)]
    pub queue_type: QueueType,
    /// `x-max-priority` of classic processing queues (1–255); unset: no priorities.
    #[serde(default)]
    pub max_priority: Option<u8>,
    /// The AMQP heartbeat (whole seconds): a connection that hears nothing from the broker
    /// for twice this long is dropped and reopened, so a silent network cut turns health red.
    /// A `heartbeat=` in the URL wins.
    #[serde(
        default = "RabbitSettings::default_heartbeat",
        deserialize_with = "duration::deserialize"
    )]
    pub heartbeat: Duration,
    /// Declare the processing queues with `x-single-active-consumer`: one consumer (one host)
    /// at a time receives a queue's messages, in order, and another takes over when it goes —
    /// what a queue with `sessions = true` needs (without `max_priority`, which reorders).
    #[serde(default)]
    pub single_active_consumer: bool,
}

impl RabbitSettings {
    /// Settings for `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        RabbitSettings {
            url: url.into(),
            exchange_prefix: Self::default_prefix(),
            queue_prefix: Self::default_prefix(),
            readiness_suffix: Self::default_suffix(),
            prefetch: None,
            queue_type: QueueType::Classic,
            max_priority: None,
            heartbeat: Self::default_heartbeat(),
            single_active_consumer: false,
        }
    }
    fn default_heartbeat() -> Duration {
        Duration::from_secs(5)
    }

    /// The URL connections are opened with: `url`, with `heartbeat=` added when it has none.
    pub fn connection_url(&self) -> String {
        let (base, query) = match self.url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (self.url.as_str(), ""),
        };
        if query.split('&').any(|pair| pair.starts_with("heartbeat=")) {
            return self.url.clone();
        }
        let heartbeat = format!("heartbeat={}", self.heartbeat.as_secs());
        match query {
            "" => format!("{base}?{heartbeat}"),
            query => format!("{base}?{query}&{heartbeat}"),
        }
    }
    fn default_prefix() -> String {
        "nexus.".to_string()
    }
    fn default_suffix() -> String {
        ".readiness".to_string()
    }

    /// What a provider with these settings can do.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            priority: self.max_priority.is_some(),
            delay: false,
            id_replacement: false,
            idempotency: false,
            delivery_count: match self.queue_type {
                QueueType::Classic => CountKind::RedeliveredFlag,
                QueueType::Quorum => CountKind::Exact,
            },
            depth: true,
            // Classic: the host forgives the redelivery of a released message; quorum queues
            // count every return.
            uncounted_release: self.queue_type == QueueType::Classic,
            // One consumer at a time, fed in queue order: the host keeps each session's order.
            keyed_order: self.single_active_consumer && self.max_priority.is_none(),
        }
    }

    /// The names of `queue`'s exchange, processing queue and readiness queue.
    pub fn names(&self, queue: &str) -> Names {
        let processing = format!("{}{queue}", self.queue_prefix);
        Names {
            exchange: format!("{}{queue}", self.exchange_prefix),
            readiness: format!("{processing}{}", self.readiness_suffix),
            processing,
        }
    }
}

/// The broker names of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The fan-out exchange producers publish to.
    pub exchange: String,
    /// The processing queue.
    pub processing: String,
    /// The readiness queue.
    pub readiness: String,
}

/// The `rabbitmq` provider type.
pub struct RabbitMqKind;

#[async_trait]
impl ProviderKind for RabbitMqKind {
    fn name(&self) -> &'static str {
        KIND
    }

    fn check(&self, settings: &toml::Table) -> Result<Capabilities, SettingsError> {
        let settings: RabbitSettings = parse_settings(settings)?;
        if settings.url.starts_with("amqps://") {
            return Err(SettingsError::new(
                "url",
                "amqps:// (TLS) is not supported by this build: use amqp:// (e.g. through a local TLS tunnel)",
            ));
        }
        settings.url.parse::<lapin::uri::AMQPUri>().map_err(|e| {
            SettingsError::new(
                "url",
                format!(
                    "`{}` is not an AMQP URL (expected amqp://user:password@host:5672/vhost): {e}",
                    crate::config::redacted_url(&settings.url)
                ),
            )
        })?;
        if settings.heartbeat.subsec_nanos() != 0
            || !(1..=u64::from(u16::MAX)).contains(&settings.heartbeat.as_secs())
        {
            return Err(SettingsError::new(
                "heartbeat",
                "must be whole seconds, from 1s to 65535s",
            ));
        }
        if settings.prefetch == Some(0) {
            return Err(SettingsError::new("prefetch", "must be at least 1"));
        }
        match (settings.queue_type, settings.max_priority) {
            (_, Some(0)) => {
                return Err(SettingsError::new("max_priority", "must be 1–255"));
            }
            (QueueType::Quorum, Some(_)) => {
                return Err(SettingsError::new(
                    "max_priority",
                    "quorum queues have no priorities: remove it or use queue_type = \"classic\"",
                ));
            }
            _ => {}
        }
        if settings.readiness_suffix.is_empty() {
            return Err(SettingsError::new(
                "readiness_suffix",
                "must not be empty (the readiness queue needs a name of its own)",
            ));
        }
        Ok(settings.capabilities())
    }

    async fn open(
        &self,
        name: &str,
        settings: &toml::Table,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        let settings: RabbitSettings = parse_settings(settings)
            .map_err(|e| ProviderError::new(KIND, ErrorKind::Protocol, e.reason))?;
        Ok(Arc::new(RabbitProvider::open(name, settings).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_joins_the_url_unless_it_names_one() {
        let mut s = RabbitSettings::new("amqp://h:5672/%2f");
        assert_eq!(s.connection_url(), "amqp://h:5672/%2f?heartbeat=5");
        s.url = "amqp://h/%2f?frame_max=8192".into();
        s.heartbeat = Duration::from_secs(3);
        assert_eq!(
            s.connection_url(),
            "amqp://h/%2f?frame_max=8192&heartbeat=3"
        );
        s.url = "amqp://h/%2f?heartbeat=30".into();
        assert_eq!(s.connection_url(), "amqp://h/%2f?heartbeat=30");
    }
}

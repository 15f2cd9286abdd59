//! The `kafka` provider type: its `[providers.NAME]` settings (checked without connecting,
//! librdkafka properties included), the topic each queue uses, the client configurations
//! built from them, and what a provider with them can do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use serde::Deserialize;

use super::{KIND, KafkaProvider};
use crate::config::duration;
use crate::external::kind::{ProviderKind, SettingsError, parse_settings};
use crate::external::{Capabilities, ErrorKind, Provider, ProviderError};

/// Properties the host sets itself; a `properties` table may not override them.
const OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "use `brokers`"),
    ("metadata.broker.list", "use `brokers`"),
    ("group.id", "use `processing_group` and `readiness_group`"),
    (
        "enable.auto.commit",
        "offsets are committed by the host after settlement",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed by the host after settlement",
    ),
];

/// A librdkafka property value as written in TOML.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Property {
    /// `"text"`.
    Text(String),
    /// `42`.
    Integer(i64),
    /// `true`.
    Bool(bool),
}

impl std::fmt::Display for Property {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Property::Text(s) => f.write_str(s),
            Property::Integer(n) => write!(f, "{n}"),
            Property::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// `[providers.NAME]` with `type = "kafka"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap brokers, comma-separated `host:port`.
    pub brokers: String,
    /// Prefix of each queue's topic.
    #[serde(default = "KafkaSettings::default_prefix")]
    pub topic_prefix: String,
    /// Consumer group of the processing consumers.
    #[serde(default = "KafkaSettings::default_processing_group")]
    pub processing_group: String,
    /// Consumer group of the readiness consumers (must differ from the processing group).
    #[serde(default = "KafkaSettings::default_readiness_group")]
    pub readiness_group: String,
    /// Create a queue's topic when it does not exist.
    #[serde(default = "KafkaSettings::default_create_topics")]
    pub create_topics: bool,
    /// Partitions of a topic the host creates.
    #[serde(default = "KafkaSettings::default_partitions")]
    pub partitions: i32,
    /// Replication factor of a topic the host creates; unset: the broker's default.
    #[serde(default)]
    pub replication: Option<i32>,
    /// How long a revoked partition's running messages may take to finish before the
    /// partition is released (what has not settled by then is redelivered to its new owner).
    #[serde(
        default = "KafkaSettings::default_rebalance_grace",
        deserialize_with = "duration::deserialize"
    )]
    pub rebalance_grace: Duration,
    /// librdkafka properties for every client (TLS, SASL, tuning).
    #[serde(default)]
    pub properties: BTreeMap<String, Property>,
}

impl KafkaSettings {
    /// Settings for `brokers` with every default.
    pub fn new(brokers: impl Into<String>) -> Self {
        KafkaSettings {
            brokers: brokers.into(),
            topic_prefix: Self::default_prefix(),
            processing_group: Self::default_processing_group(),
            readiness_group: Self::default_readiness_group(),
            create_topics: Self::default_create_topics(),
            partitions: Self::default_partitions(),
            replication: None,
            rebalance_grace: Self::default_rebalance_grace(),
            properties: BTreeMap::new(),
        }
    }
    fn default_prefix() -> String {
        "nexus.".to_string()
    }
    fn default_processing_group() -> String {
        "wharf.processing".to_string()
    }
    fn default_readiness_group() -> String {
        "wharf.readiness".to_string()
    }
    fn default_create_topics() -> bool {
        true
    }
    fn default_partitions() -> i32 {
        6
    }
    fn default_rebalance_grace() -> Duration {
        Duration::from_secs(10)
    }

    /// The topic of `queue`.
    pub fn topic(&self, queue: &str) -> String {
        format!("{}{queue}", self.topic_prefix)
    }

    /// The queue a topic belongs to, when it has the prefix.
    pub fn queue_of<'a>(&self, topic: &'a str) -> Option<&'a str> {
        topic.strip_prefix(self.topic_prefix.as_str())
    }

    /// The group whose committed offsets are the delivered marks of the processing group
    /// (how far it fetched each partition); it never consumes.
    pub fn delivered_group(&self) -> String {
        format!("{}.delivered", self.processing_group)
    }

    /// The base client configuration: brokers and the user's properties.
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        // librdkafka's own log lines go through `tracing` at debug level; failures reach
        // the health checks and are logged once per outage.
        config.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
        for (key, value) in &self.properties {
            config.set(key, value.to_string());
        }
        config
    }

    /// A consumer configuration in `group` (offsets committed by the host only).
    pub fn consumer(&self, group: &str) -> ClientConfig {
        let mut config = self.client();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if !self.properties.contains_key("auto.offset.reset") {
            // A new group starts at the oldest message: nothing published before the first
            // host started is skipped.
            config.set("auto.offset.reset", "earliest");
        }
        if !self
            .properties
            .contains_key("topic.metadata.refresh.interval.ms")
        {
            // A topic created after the consumer started (the broker was down) is seen soon.
            config.set("topic.metadata.refresh.interval.ms", "10000");
        }
        if !self.properties.contains_key("session.timeout.ms") {
            // librdkafka's 45 s made a new group's first join take ~23 s on the test broker
            // (it waits about half the session timeout); 10 s (Kafka's default before 3.0)
            // takes ~5 s. Heartbeats come from librdkafka's own thread, so a slow handler
            // never misses one; only 10 s without reaching the broker ends the membership
            // (a rebalance: nothing unsettled is committed, so nothing is lost).
            config.set("session.timeout.ms", "10000");
        }
        config
    }

    /// The producer configuration: every write acknowledged by all in-sync replicas,
    /// idempotent (a retried send is not written twice).
    pub fn producer(&self) -> ClientConfig {
        let mut config = self.client();
        for (key, value) in [("acks", "all"), ("enable.idempotence", "true")] {
            if !self.properties.contains_key(key) {
                config.set(key, value);
            }
        }
        config
    }

    /// What a provider with these settings can do.
    pub fn capabilities(&self) -> Capabilities {
        // No priority, delay, replacement or idempotency; deliveries are not counted; no
        // depth: lag is committed offsets against the partition ends, which not every
        // Kafka-protocol broker reports reliably (reconciliation activates every pass).
        Capabilities {
            // The host forgives the replay of a message it handed back itself.
            uncounted_release: true,
            keyed_order: true,
            ..Capabilities::default()
        }
    }
}

/// The `kafka` provider type.
pub struct KafkaKind;

#[async_trait]
impl ProviderKind for KafkaKind {
    fn name(&self) -> &'static str {
        KIND
    }

    fn check(&self, settings: &toml::Table) -> Result<Capabilities, SettingsError> {
        let settings: KafkaSettings = parse_settings(settings)?;
        if settings.brokers.trim().is_empty() {
            return Err(SettingsError::new(
                "brokers",
                "must name at least one broker, e.g. \"127.0.0.1:9092\"",
            ));
        }
        for (key, group) in [
            ("processing_group", &settings.processing_group),
            ("readiness_group", &settings.readiness_group),
        ] {
            if group.trim().is_empty() {
                return Err(SettingsError::new(key, "must not be empty"));
            }
        }
        if settings.processing_group == settings.readiness_group {
            return Err(SettingsError::new(
                "readiness_group",
                format!(
                    "must differ from processing_group (both are `{}`): readiness commits would advance processing offsets",
                    settings.readiness_group
                ),
            ));
        }
        if settings.readiness_group == settings.delivered_group() {
            return Err(SettingsError::new(
                "readiness_group",
                format!(
                    "`{}` is the group that keeps the processing group's delivered marks: choose another name",
                    settings.readiness_group
                ),
            ));
        }
        if settings.partitions < 1 {
            return Err(SettingsError::new("partitions", "must be at least 1"));
        }
        if settings.replication.is_some_and(|r| r < 1) {
            return Err(SettingsError::new(
                "replication",
                "must be at least 1 (leave it out for the broker's default)",
            ));
        }
        if settings.rebalance_grace.is_zero() {
            return Err(SettingsError::new("rebalance_grace", "must be above zero"));
        }
        for (key, hint) in OWNED {
            if settings.properties.contains_key(*key) {
                return Err(SettingsError::new(
                    format!("properties.{key}"),
                    format!("is set by the host: {hint}"),
                ));
            }
        }
        // librdkafka checks every property name and value without connecting.
        for (role, config) in [
            ("consumer", settings.consumer(&settings.processing_group)),
            ("producer", settings.producer()),
        ] {
            if let Err(e) = config.create_native_config() {
                return Err(SettingsError::new(
                    "properties",
                    format!("refused by librdkafka for the {role}: {e}"),
                ));
            }
        }
        Ok(settings.capabilities())
    }

    async fn open(
        &self,
        name: &str,
        settings: &toml::Table,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        let settings: KafkaSettings = parse_settings(settings)
            .map_err(|e| ProviderError::new(KIND, ErrorKind::Protocol, e.reason))?;
        Ok(Arc::new(KafkaProvider::open(name, settings)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::CountKind;

    #[test]
    fn consumers_end_a_silent_membership_after_10_s_unless_told_otherwise() {
        let settings = KafkaSettings::new("b:9092");
        let config = settings.consumer("g");
        assert_eq!(config.get("session.timeout.ms"), Some("10000"));
        let mut custom = KafkaSettings::new("b:9092");
        custom
            .properties
            .insert("session.timeout.ms".into(), Property::Integer(45_000));
        assert_eq!(
            custom.consumer("g").get("session.timeout.ms"),
            Some("45000")
        );
    }

    fn check(text: &str) -> Result<Capabilities, SettingsError> {
        KafkaKind.check(&toml::from_str(text).unwrap())
    }

    #[test]
    fn defaults_need_only_the_brokers() {
        let caps = check("brokers = \"127.0.0.1:9092\"").unwrap();
        assert_eq!(caps.delivery_count, CountKind::None);
        assert!(!caps.delay && !caps.priority && !caps.idempotency);
        let s = KafkaSettings::new("b:9092");
        assert_eq!(s.topic("orders"), "nexus.orders");
        assert_eq!(s.queue_of("nexus.orders"), Some("orders"));
        assert_ne!(s.processing_group, s.readiness_group);
    }

    #[test]
    fn equal_groups_are_refused() {
        let e = check("brokers = \"b:9092\"\nprocessing_group = \"g\"\nreadiness_group = \"g\"")
            .unwrap_err();
        assert_eq!(e.key, "readiness_group");
        assert!(e.reason.contains("must differ"), "{e:?}");
    }

    #[test]
    fn bad_numbers_name_their_key() {
        let e = check("brokers = \"b:9092\"\npartitions = 0").unwrap_err();
        assert_eq!(e.key, "partitions");
        let e = check("brokers = \"b:9092\"\nreplication = 0").unwrap_err();
        assert_eq!(e.key, "replication");
        let e = check("brokers = \"\"").unwrap_err();
        assert_eq!(e.key, "brokers");
    }

    #[test]
    fn properties_are_checked_by_librdkafka() {
        check("brokers = \"b:9092\"\n[properties]\n\"security.protocol\" = \"ssl\"\n\"socket.timeout.ms\" = 5000\n\"api.version.request\" = true")
            .unwrap();
        let e = check("brokers = \"b:9092\"\n[properties]\n\"no.such.thing\" = \"x\"").unwrap_err();
        assert_eq!(e.key, "properties");
        assert!(e.reason.contains("no.such.thing"), "{e:?}");
        let e = check("brokers = \"b:9092\"\n[properties]\n\"group.id\" = \"x\"").unwrap_err();
        assert_eq!(e.key, "properties.group.id");
    }
}

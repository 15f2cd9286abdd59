//! Configuration of external pending storage: `[providers.NAME]` (one broker each, selected
//! by queues with `storage = "external"` and `provider = "NAME"`; its `type` picks the
//! provider module, which owns and checks every other key of the section) and `[external]`
//! (the provider-independent settings).

use std::time::Duration;

use serde::Deserialize;

use super::duration;

/// Where a queue's pending messages live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueStorage {
    /// In the SQL queue of `[storage]`.
    #[default]
    Sql,
    /// In the broker of the queue's `provider`; failures and other non-pending states move
    /// into the SQL queue.
    External,
}

/// `[providers.NAME]`: one external pending storage. `type` names the provider module;
/// the other keys are its settings, checked by that module when the file is loaded.
#[derive(Clone, Deserialize)]
pub struct ProviderConfig {
    /// The provider type (`redis`, `rabbitmq`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// Every other key of the section.
    #[serde(flatten)]
    pub settings: toml::Table,
}

/// Shows the setting keys only: values may hold credentials (URLs with passwords,
/// connection strings).
impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("kind", &self.kind)
            .field("settings", &self.settings.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `[external]`: settings shared by every provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExternalConfig {
    /// How often the reconciliation pass checks every external queue for work that has no
    /// activation (a missed notification).
    #[serde(deserialize_with = "duration::deserialize")]
    pub reconcile_interval: Duration,
    /// How often each provider's broker is probed with a round trip (Kafka, Service Bus); a
    /// probe without an answer within this long turns the provider's health check red.
    #[serde(deserialize_with = "duration::deserialize")]
    pub probe_interval: Duration,
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            reconcile_interval: Duration::from_secs(30),
            probe_interval: Duration::from_secs(5),
        }
    }
}

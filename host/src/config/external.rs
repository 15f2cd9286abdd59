//! Configuration of external pending storage: `[providers.NAME]` (one broker connection
//! each, selected by queues with `storage = "external"` and `provider = "NAME"`) and
//! `[external]` (the provider-independent settings: reconciliation).

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

/// `[providers.NAME]`: one external pending storage.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderConfig {
    /// Redis: sorted sets and a readiness stream per queue.
    Redis(RedisProviderConfig),
}

impl ProviderConfig {
    /// The provider type name (`redis`), for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderConfig::Redis(_) => "redis",
        }
    }
}

/// `[providers.NAME]` with `type = "redis"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisProviderConfig {
    /// Connection URL, e.g. `redis://127.0.0.1:6379`.
    pub url: String,
    /// Prefix of every key (the queue name follows inside a `{hash tag}`).
    #[serde(default = "RedisProviderConfig::default_prefix")]
    pub key_prefix: String,
    /// Consumer group of the readiness bridge on each queue's readiness stream.
    #[serde(default = "RedisProviderConfig::default_group")]
    pub consumer_group: String,
    /// How often due delayed messages are promoted to the ready set.
    #[serde(
        default = "RedisProviderConfig::default_promote_interval",
        deserialize_with = "duration::deserialize"
    )]
    pub promote_interval: Duration,
}

impl RedisProviderConfig {
    fn default_prefix() -> String {
        "nexus:queue:".to_string()
    }
    fn default_group() -> String {
        "wharf-readiness".to_string()
    }
    fn default_promote_interval() -> Duration {
        Duration::from_millis(500)
    }
}

/// `[external]`: settings shared by every provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExternalConfig {
    /// How often the reconciliation pass checks every external queue for work that has no
    /// activation (a missed notification) and for expired leases.
    #[serde(deserialize_with = "duration::deserialize")]
    pub reconcile_interval: Duration,
    /// How long a readiness notification may stay unacknowledged by a crashed host before
    /// another host claims it.
    #[serde(deserialize_with = "duration::deserialize")]
    pub claim_after: Duration,
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            reconcile_interval: Duration::from_secs(30),
            claim_after: Duration::from_secs(30),
        }
    }
}

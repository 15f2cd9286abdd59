//! The consumer inbox's keys: `[inbox]` (where records can be kept) and a queue's
//! `inbox = { … }` (which store, how long).

use std::time::Duration;

use serde::Deserialize;

use super::duration;

/// `[inbox]`: where consumer-inbox records can be kept. The SQL store (the `[storage]`
/// database) and the in-memory store need no settings; Redis needs `[inbox.redis]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InboxStoresConfig {
    /// `[inbox.sql]`.
    pub sql: InboxSqlConfig,
    /// `[inbox.redis]`: required to select `store = "redis"`.
    pub redis: Option<InboxRedisConfig>,
}

/// `[inbox.sql]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InboxSqlConfig {
    /// Create the inbox table if it is missing (`false`: it must exist already).
    pub auto_create_table: bool,
    /// The table's name.
    pub table: String,
}

impl Default for InboxSqlConfig {
    fn default() -> Self {
        InboxSqlConfig {
            auto_create_table: true,
            table: "wharf_inbox".to_string(),
        }
    }
}

/// `[inbox.redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxRedisConfig {
    /// `redis://host:port/db`, or `redis+cluster://host:port,host:port,…` for a cluster.
    pub url: String,
    /// Prefix of every inbox key.
    #[serde(default = "InboxRedisConfig::default_prefix")]
    pub key_prefix: String,
}

impl InboxRedisConfig {
    fn default_prefix() -> String {
        "wharf:inbox:".to_string()
    }
}

/// Which inbox store a queue uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InboxStoreKind {
    /// A table in the `[storage]` database.
    Sql,
    /// Redis keys (`[inbox.redis]`).
    Redis,
    /// Process memory: for tests, not durable.
    Memory,
}

/// `[queues.NAME] inbox = { … }`: skip redeliveries of messages that already succeeded.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueInboxConfig {
    /// The store.
    pub store: InboxStoreKind,
    /// How long a record is kept.
    #[serde(
        default = "QueueInboxConfig::default_retention",
        deserialize_with = "duration::deserialize"
    )]
    pub retention: Duration,
    /// How often expired records of this endpoint are removed.
    #[serde(
        default = "QueueInboxConfig::default_cleanup",
        deserialize_with = "duration::deserialize"
    )]
    pub cleanup_interval: Duration,
}

impl QueueInboxConfig {
    fn default_retention() -> Duration {
        Duration::from_secs(7 * 24 * 3600)
    }
    fn default_cleanup() -> Duration {
        Duration::from_secs(3600)
    }
}

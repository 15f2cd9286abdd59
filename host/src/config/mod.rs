//! The `wharf.toml` schema: every key, its default, and validation with errors that name
//! the file, the key and the reason. Loading (interpolation, parsing) lives in [`load`].

mod admin;
pub(crate) mod duration;
mod external;
mod interpolate;
mod load;
mod providers;
mod secret;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

pub use admin::{AdminConfig, TOKEN_ENV};
pub use external::{ExternalConfig, ProviderConfig, QueueStorage};
pub use load::ConfigError;
pub(crate) use load::is_valid_name;
pub use secret::{Secret, redacted_url};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the file was loaded from (not a key; set by the loader).
    #[serde(skip)]
    pub source: PathBuf,
    /// `[host]`: process-wide settings.
    #[serde(default)]
    pub host: HostConfig,
    /// `[storage]`: the SQL queue.
    #[serde(default)]
    pub storage: StorageConfig,
    /// `[handlers.NAME]`: per-handler grants and limits (optional).
    #[serde(default)]
    pub handlers: BTreeMap<String, HandlerConfig>,
    /// `[queues.NAME]`: the queues and the handler bound to each.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueConfig>,
    /// `[inbox]`: the consumer-inbox stores queues may select.
    #[serde(default)]
    pub inbox: InboxStoresConfig,
    /// `[providers.NAME]`: external pending storages queues may select.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// `[external]`: settings shared by the external providers.
    #[serde(default)]
    pub external: ExternalConfig,
    /// `[admin]`: the admin API's token.
    #[serde(default)]
    pub admin: AdminConfig,
}

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
    /// `redis://host:port/db`.
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

/// `[host]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Directory watched for `NAME.wasm` handler components (relative to the config file).
    pub handlers_dir: PathBuf,
    /// Directory for compiled-component cache files (relative to the config file).
    pub cache_dir: PathBuf,
    /// Address of the admin HTTP server (`/healthz`, `/readyz`, `/handlers`).
    pub admin_listen: SocketAddr,
    /// How long in-flight messages may run after SIGINT/SIGTERM before they are released.
    #[serde(deserialize_with = "duration::deserialize")]
    pub shutdown_grace: Duration,
    /// Quiet period after the last change to a `.wasm` file before it is loaded.
    #[serde(deserialize_with = "duration::deserialize")]
    pub deploy_debounce: Duration,
    /// Most handler instances alive at once across all queues (sizes the instance pool).
    pub max_instances: u32,
    /// Default linear-memory cap of one handler instance.
    pub instance_memory: ByteSize,
    /// The largest `memory` any handler may be granted (sizes the instance pool's slots).
    pub max_instance_memory: ByteSize,
    /// How often the `/metrics` gauges (queue depth by status, external depth, health) are
    /// refreshed: one count per queue per interval, whatever the scrape rate.
    #[serde(deserialize_with = "duration::deserialize")]
    pub metrics_interval: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            handlers_dir: PathBuf::from("handlers"),
            cache_dir: PathBuf::from(".wharf/cache"),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            shutdown_grace: Duration::from_secs(30),
            deploy_debounce: Duration::from_millis(250),
            max_instances: 256,
            instance_memory: ByteSize::mib(64),
            max_instance_memory: ByteSize::mib(512),
            metrics_interval: Duration::from_secs(15),
        }
    }
}

/// `[storage]`: where the SQL queue lives.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// `sqlite://PATH` (relative paths are relative to the config file) or `postgres://…`.
    pub url: String,
    /// How often an idle queue looks for due (scheduled, retried) messages.
    #[serde(deserialize_with = "duration::deserialize")]
    pub poll_interval: Duration,
    /// Most connections the host keeps to the database.
    pub max_connections: u32,
    /// PostgreSQL schema holding Wharf's tables (created if missing); default: the
    /// connection's search path.
    pub schema: Option<String>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            url: "sqlite://wharf.db".to_string(),
            poll_interval: Duration::from_millis(250),
            max_connections: 8,
            schema: None,
        }
    }
}

/// `[handlers.NAME]`: what the WASI sandbox of one handler may reach. Everything is denied
/// unless granted here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HandlerConfig {
    /// Linear-memory cap of one instance (default: `[host] instance_memory`).
    pub memory: Option<ByteSize>,
    /// Environment variables visible to the handler, by value.
    pub env: BTreeMap<String, String>,
    /// Host environment variables passed through by name (missing ones are skipped).
    pub inherit_env: Vec<String>,
    /// Host directories mounted into the sandbox.
    pub preopens: Vec<Preopen>,
    /// Allow outgoing and incoming TCP/UDP and name lookups.
    pub network: bool,
    /// Let the handler write to the host's own stdout/stderr instead of the log.
    pub inherit_stdio: bool,
    /// Origins (`https://api.example.com`, `http://127.0.0.1:8080`, `https://*.example.com`)
    /// the handler may send HTTP requests to through `wasi:http`; empty: no outbound HTTP.
    pub allowed_outbound_hosts: Vec<crate::runtime::OutboundHost>,
}

/// A host directory mounted into a handler's sandbox.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preopen {
    /// Directory on the host (relative to the config file).
    pub host: PathBuf,
    /// Path the handler sees.
    pub guest: String,
    /// Mount read-only (the default).
    #[serde(default = "yes")]
    pub read_only: bool,
}

fn yes() -> bool {
    true
}

/// The most a queue without a `concurrency` setting processes at once.
pub const AUTO_CONCURRENCY: u32 = 64;

/// `[queues.NAME]`: one queue and the handler that processes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Name of the handler component (`handlers_dir/NAME.wasm`).
    pub handler: String,
    /// `concurrency` as set in the file; unset means automatic (see `concurrency`).
    #[serde(default, rename = "concurrency")]
    pub concurrency_setting: Option<u32>,
    /// Most messages of this queue processed at once: the setting, or when it is unset an
    /// equal share of the instances `host.max_instances` leaves to the queues that do not
    /// set it, at most [`AUTO_CONCURRENCY`]. Resolved when the configuration is loaded.
    #[serde(skip)]
    pub concurrency: u32,
    /// Attempts before a message is failed (the first delivery counts).
    #[serde(default = "QueueConfig::default_max_attempts")]
    pub max_attempts: u32,
    /// How long a lease lasts; an expired lease makes the message available again.
    #[serde(
        default = "QueueConfig::default_lease",
        deserialize_with = "duration::deserialize"
    )]
    pub lease: Duration,
    /// Longest a single `handle` call may run before it is interrupted.
    #[serde(
        default = "QueueConfig::default_timeout",
        deserialize_with = "duration::deserialize"
    )]
    pub timeout: Duration,
    /// First retry delay; doubled on each later attempt, with jitter.
    #[serde(
        default = "QueueConfig::default_backoff",
        deserialize_with = "duration::deserialize"
    )]
    pub backoff: Duration,
    /// Longest retry delay.
    #[serde(
        default = "QueueConfig::default_max_backoff",
        deserialize_with = "duration::deserialize"
    )]
    pub max_backoff: Duration,
    /// Messages leased per round trip to the store.
    #[serde(default = "QueueConfig::default_batch")]
    pub batch: u32,
    /// The largest payload an enqueue may carry (default 1 MiB); larger ones are refused,
    /// and a larger broker message is moved into the SQL queue as failed.
    #[serde(default = "QueueConfig::default_max_payload")]
    pub max_payload: ByteSize,
    /// Discard an enqueue whose payload equals (as JSON values) the latest version of the
    /// message with the same id.
    #[serde(default)]
    pub idempotent: bool,
    /// When a lease expires: `true` makes the message available again (failed once it used
    /// its last attempt); `false` fails it.
    #[serde(default = "yes")]
    pub retry_abandoned: bool,
    /// How long processed messages and previous versions are kept.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// The endpoint name the consumer inbox keys on (default: the queue name).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The consumer inbox (opt-in).
    #[serde(default)]
    pub inbox: Option<QueueInboxConfig>,
    /// Where pending messages live: `sql` (default) or `external`.
    #[serde(default)]
    pub storage: QueueStorage,
    /// With `storage = "external"`: the `[providers.NAME]` holding the pending messages.
    #[serde(default)]
    pub provider: Option<String>,
    /// External queues: whether an enqueue with a MessageId replaces the pending message
    /// with that id. Default: what the provider can do; `true` with a provider that cannot
    /// is a configuration error.
    #[serde(default)]
    pub replace_by_id: Option<bool>,
}

/// `[queues.NAME.retention]`: how long processed messages and history are kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Delete processed messages older than this (`"0s"`: keep no age limit... use `count`).
    #[serde(deserialize_with = "duration::deserialize_opt")]
    pub age: Option<Duration>,
    /// Keep at most this many processed messages; `0` deletes them on completion (an
    /// identified message's processed version is still recorded in its history).
    pub count: Option<u64>,
    /// Previous versions kept per identified message.
    pub history_versions: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            age: Some(Duration::from_secs(7 * 24 * 3600)),
            count: None,
            history_versions: 10,
        }
    }
}

impl QueueConfig {
    fn default_max_attempts() -> u32 {
        5
    }
    fn default_lease() -> Duration {
        Duration::from_secs(30)
    }
    fn default_timeout() -> Duration {
        Duration::from_secs(10)
    }
    fn default_backoff() -> Duration {
        Duration::from_secs(1)
    }
    fn default_max_backoff() -> Duration {
        Duration::from_secs(300)
    }
    fn default_batch() -> u32 {
        64
    }

    fn default_max_payload() -> ByteSize {
        ByteSize::b(crate::queue::limits::DEFAULT_MAX_PAYLOAD)
    }

    /// A queue bound to `handler` with every other key at its default.
    pub fn for_handler(handler: impl Into<String>) -> Self {
        QueueConfig {
            handler: handler.into(),
            concurrency_setting: None,
            concurrency: AUTO_CONCURRENCY,
            max_attempts: Self::default_max_attempts(),
            lease: Self::default_lease(),
            timeout: Self::default_timeout(),
            backoff: Self::default_backoff(),
            max_backoff: Self::default_max_backoff(),
            batch: Self::default_batch(),
            max_payload: Self::default_max_payload(),
            idempotent: false,
            retry_abandoned: true,
            retention: RetentionConfig::default(),
            endpoint: None,
            inbox: None,
            storage: QueueStorage::Sql,
            provider: None,
            replace_by_id: None,
        }
    }
}

impl Config {
    /// A configuration with every default and no queues, as if loaded from `source`.
    pub fn empty(source: PathBuf) -> Self {
        Config {
            source,
            host: HostConfig::default(),
            storage: StorageConfig::default(),
            handlers: BTreeMap::new(),
            queues: BTreeMap::new(),
            inbox: InboxStoresConfig::default(),
            providers: BTreeMap::new(),
            external: ExternalConfig::default(),
            admin: AdminConfig::default(),
        }
    }

    /// The grants of a handler (defaults when it has no `[handlers.NAME]` table).
    pub fn handler(&self, name: &str) -> HandlerConfig {
        self.handlers.get(name).cloned().unwrap_or_default()
    }

    /// The memory cap of one instance of the named handler.
    pub fn handler_memory(&self, name: &str) -> ByteSize {
        self.handlers
            .get(name)
            .and_then(|h| h.memory)
            .unwrap_or(self.host.instance_memory)
    }
}

//! The `wharf.toml` schema: every key, its default, and validation with errors that name
//! the file, the key and the reason. Loading (interpolation, parsing) lives in [`load`].

mod admin;
pub(crate) mod duration;
mod external;
mod inbox;
mod interpolate;
mod load;
mod outbound_host;
mod queue;
mod schedule;
mod secret;
mod telemetry;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

pub use admin::{AdminConfig, TOKEN_ENV};
pub use external::{ExternalConfig, ProviderConfig, QueueStorage};
pub use inbox::{
    InboxRedisConfig, InboxSqlConfig, InboxStoreKind, InboxStoresConfig, QueueInboxConfig,
};
pub use interpolate::{InterpolateError, interpolate};
pub use load::ConfigError;
pub use outbound_host::{BadOutboundHost, OutboundHost};
pub use queue::{AUTO_CONCURRENCY, QueueConfig, RetentionConfig};
pub use schedule::{CatchUp, ScheduleConfig};
pub use secret::{Secret, redacted_url};
pub use telemetry::{Sampling, Telemetry, TelemetryConfig};
pub(crate) use validate::check_name;
pub(crate) use validate::is_valid_name;

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
    /// `[schedules.NAME]`: periodic messages.
    #[serde(default)]
    pub schedules: BTreeMap<String, ScheduleConfig>,
    /// `[telemetry]`: OpenTelemetry traces, as written.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[telemetry]` resolved with the `OTEL_*` variables (not a key; set by the loader):
    /// `None` when traces are off.
    #[serde(skip)]
    pub traces: Option<Telemetry>,
}

/// `[host]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// This host's id, stable across restarts: shown by `wharf hosts` and recorded with the
    /// schedule ticks it enqueued (default: the machine's host name and the admin port).
    pub id: Option<String>,
    /// Where handler components come from: the `handlers_dir` directory (watched), or the
    /// queue's SQL store, shared by every host (`wharf handlers deploy`).
    pub handlers_source: HandlersSource,
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

/// Where a host's handler components come from (`[host] handlers_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlersSource {
    /// `NAME.wasm` files in `handlers_dir`, watched: one machine.
    Directory,
    /// The versions `wharf handlers deploy` wrote to the queue's SQL store: every host
    /// sharing the store serves the current one.
    Store,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            id: None,
            handlers_source: HandlersSource::Directory,
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

impl HostConfig {
    /// This host's id: `id`, or the machine's host name and the admin port (and the process
    /// id when the port is chosen by the system).
    pub fn host_id(&self) -> String {
        if let Some(id) = &self.id {
            return id.clone();
        }
        let machine = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "localhost".to_string());
        match self.admin_listen.port() {
            0 => format!("{machine}-0-{}", std::process::id()),
            port => format!("{machine}-{port}"),
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
    pub allowed_outbound_hosts: Vec<OutboundHost>,
    /// Key-value buckets (`wasi:keyvalue`) the handler may open; empty: none. Its state lives
    /// in the SQL store, its changes committed with the outcome of the message.
    pub keyvalue: Vec<String>,
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

pub(crate) fn yes() -> bool {
    true
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
            schedules: BTreeMap::new(),
            telemetry: TelemetryConfig::default(),
            traces: None,
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

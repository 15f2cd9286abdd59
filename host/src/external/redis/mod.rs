//! The Redis provider. Per queue, with the configured prefix (default `nexus:queue:`) and
//! the queue name as a literal hash tag so every key lands in one Redis Cluster slot:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{prefix}{queue}` | sorted set | ready envelopes, score = priority |
//! | `{prefix}{queue}:readiness` | stream | one `queue <name>` record per ready enqueue |
//! | `{prefix}{queue}:delayed` | sorted set | scheduled envelopes, score = due Unix seconds |
//! | `{prefix}{queue}:ids` | hash | MessageId → its pending envelope (replacement, idempotency) |
//! | `{prefix}{queue}:id-hashes` | hash | MessageId → canonical hash of its MessageJson (idempotency compares JSON values, as the SQL queue does) |
//! | `{prefix}{queue}:leases` | sorted set | lease token → deadline (Unix ms) |
//! | `{prefix}{queue}:leased` | hash | lease token → `priority|envelope` |
//! | `{prefix}{queue}:attempts` | hash | envelope → deliveries so far |
//! | `{prefix}{queue}:lease-seq` | string | the fencing-token counter |
//!
//! Leasing pops the highest score first (`ZPOPMAX`), so higher priorities run first, like
//! the SQL queue; within one priority Redis orders members by their bytes, not by arrival.
//!
//! Capabilities: priority, delay (the `:delayed` set, promoted by a background task), id
//! replacement and idempotency (the `:ids` hash), an exact delivery count, depth, and
//! releases that do not count the delivery. Expired leases are returned by a background
//! task.

mod bridge;
mod connection;
mod consumer;
mod maintenance;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use bridge::RedisReadiness;
pub(crate) use connection::Lazy;
pub use consumer::RedisConsumer;
pub use maintenance::Maintenance;
pub use scripts::DIRECT_PRODUCER;

use super::kind::{ProviderKind, SettingsError, parse_settings};
use super::{
    Capabilities, Consumer, ConsumerSettings, CountKind, Depth, Envelope, ErrorKind, Provider,
    ProviderError, PublishOptions, ReadinessBridge,
};
use crate::config::duration;
use crate::queue::{EnqueueStatus, canonical_hash, now_ms};
use crate::redis_client::RedisTarget;

const KIND: &str = "redis";

/// `[providers.NAME]` with `type = "redis"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// Connection URL, e.g. `redis://127.0.0.1:6379`, or
    /// `redis+cluster://host:port,host:port,…` for a Redis Cluster.
    pub url: String,
    /// Prefix of every key (the queue name follows inside a `{hash tag}`).
    #[serde(default = "RedisSettings::default_prefix")]
    pub key_prefix: String,
    /// Consumer group of the readiness bridge on each queue's readiness stream.
    #[serde(default = "RedisSettings::default_group")]
    pub consumer_group: String,
    /// How often due delayed messages are promoted and expired leases returned.
    #[serde(
        default = "RedisSettings::default_promote_interval",
        deserialize_with = "duration::deserialize"
    )]
    pub promote_interval: Duration,
    /// How long a readiness record may stay unacknowledged by a crashed host before another
    /// host claims it.
    #[serde(
        default = "RedisSettings::default_claim_after",
        deserialize_with = "duration::deserialize"
    )]
    pub claim_after: Duration,
}

impl RedisSettings {
    /// Settings for `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        RedisSettings {
            url: url.into(),
            key_prefix: Self::default_prefix(),
            consumer_group: Self::default_group(),
            promote_interval: Self::default_promote_interval(),
            claim_after: Self::default_claim_after(),
        }
    }
    fn default_prefix() -> String {
        "nexus:queue:".to_string()
    }
    fn default_group() -> String {
        "wharf-readiness".to_string()
    }
    fn default_promote_interval() -> Duration {
        Duration::from_millis(500)
    }
    fn default_claim_after() -> Duration {
        Duration::from_secs(30)
    }
}

/// What a Redis provider can do.
pub const CAPABILITIES: Capabilities = Capabilities {
    priority: true,
    delay: true,
    id_replacement: true,
    idempotency: true,
    delivery_count: CountKind::Exact,
    depth: true,
    uncounted_release: true,
    keyed_order: false,
};

/// The `redis` provider type.
pub struct RedisKind;

#[async_trait]
impl ProviderKind for RedisKind {
    fn name(&self) -> &'static str {
        KIND
    }

    fn check(&self, settings: &toml::Table) -> Result<Capabilities, SettingsError> {
        let settings: RedisSettings = parse_settings(settings)?;
        RedisTarget::parse(&settings.url).map_err(|e| {
            SettingsError::new(
                "url",
                format!(
                    "`{}` is not a Redis URL (expected redis://host:port, rediss://…, unix://… or redis+cluster://host:port,host:port,… for a cluster): {e}",
                    crate::config::redacted_url(&settings.url)
                ),
            )
        })?;
        if settings.claim_after.is_zero() {
            return Err(SettingsError::new("claim_after", "must be longer than 0s"));
        }
        if settings.promote_interval.is_zero() {
            return Err(SettingsError::new(
                "promote_interval",
                "must be longer than 0s",
            ));
        }
        Ok(CAPABILITIES)
    }

    async fn open(
        &self,
        _name: &str,
        settings: &toml::Table,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        let settings: RedisSettings = parse_settings(settings)
            .map_err(|e| ProviderError::new(KIND, ErrorKind::Protocol, e.reason))?;
        Ok(Arc::new(RedisProvider::open(settings).await?))
    }
}

/// Sort a Redis error into the provider error kinds.
pub(crate) fn error(e: redis::RedisError) -> ProviderError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        ErrorKind::Unavailable
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed {
        ErrorKind::Denied
    } else {
        ErrorKind::Protocol
    };
    ProviderError::with_source(KIND, kind, e)
}

/// A reply that does not have the expected shape.
pub(crate) fn protocol(message: impl Into<String>) -> ProviderError {
    ProviderError::new(KIND, ErrorKind::Protocol, message)
}

/// The key names of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// Ready envelopes.
    pub ready: String,
    /// Readiness records.
    pub readiness: String,
    /// Scheduled envelopes.
    pub delayed: String,
    /// MessageId → envelope.
    pub ids: String,
    /// MessageId → canonical hash of its MessageJson.
    pub id_hashes: String,
    /// Lease deadlines.
    pub leases: String,
    /// Leased envelopes.
    pub leased: String,
    /// Delivery counts.
    pub attempts: String,
    /// Fencing-token counter.
    pub lease_seq: String,
}

impl Keys {
    /// The keys of `queue` under `prefix`.
    pub fn new(prefix: &str, queue: &str) -> Keys {
        let ready = format!("{prefix}{{{queue}}}");
        Keys {
            readiness: format!("{ready}:readiness"),
            delayed: format!("{ready}:delayed"),
            ids: format!("{ready}:ids"),
            id_hashes: format!("{ready}:id-hashes"),
            leases: format!("{ready}:leases"),
            leased: format!("{ready}:leased"),
            attempts: format!("{ready}:attempts"),
            lease_seq: format!("{ready}:lease-seq"),
            ready,
        }
    }

    /// Every key, for checks (all must share one cluster slot).
    pub fn all(&self) -> [&str; 9] {
        [
            &self.ready,
            &self.readiness,
            &self.delayed,
            &self.ids,
            &self.id_hashes,
            &self.leases,
            &self.leased,
            &self.attempts,
            &self.lease_seq,
        ]
    }
}

/// Pending messages in Redis.
pub struct RedisProvider {
    conn: Lazy,
    settings: RedisSettings,
    enqueue: Script,
}

impl RedisProvider {
    /// A provider for `settings`; it connects on first use.
    pub async fn open(settings: RedisSettings) -> Result<Self, ProviderError> {
        let target = RedisTarget::parse(&settings.url).map_err(error)?;
        Ok(RedisProvider {
            conn: Lazy::new(target, Duration::from_secs(5)),
            settings,
            enqueue: Script::new(scripts::ENQUEUE),
        })
    }

    /// The keys of `queue`.
    pub fn keys(&self, queue: &str) -> Keys {
        Keys::new(&self.settings.key_prefix, queue)
    }

    /// Its housekeeping (run by [`Provider::background`]).
    pub fn maintenance(&self) -> Maintenance {
        Maintenance::new(self.conn.clone(), &self.settings.key_prefix)
    }
}

#[async_trait]
impl Provider for RedisProvider {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn prepare(&self, _queues: &[String]) -> Result<(), ProviderError> {
        // Keys come into being with their first write; the bridge creates its groups.
        Ok(())
    }

    async fn publish(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        options: PublishOptions,
    ) -> Result<Vec<EnqueueStatus>, ProviderError> {
        if envelopes.is_empty() {
            return Ok(Vec::new());
        }
        let keys = self.keys(queue);
        let mut call = self.enqueue.prepare_invoke();
        call.key(&keys.ready)
            .key(&keys.readiness)
            .key(&keys.delayed)
            .key(&keys.ids)
            .key(&keys.id_hashes)
            .arg(queue)
            .arg(if options.idempotent { "1" } else { "0" });
        for envelope in envelopes {
            let score = match options.due_at_ms {
                // Seconds, rounded up: a message never runs before its time.
                Some(ms) => (ms + 999).div_euclid(1000),
                None => i64::from(envelope.priority),
            };
            let id = match (&envelope.message_id, options.replace_by_id) {
                (Some(id), true) => id.as_str(),
                _ => "",
            };
            // What idempotency compares: the message as JSON values, as on the SQL queue.
            let hash = if id.is_empty() {
                String::new()
            } else {
                canonical_hash(&envelope.message_json)
            };
            call.arg(score)
                .arg(envelope.to_json())
                .arg(id)
                .arg(if options.due_at_ms.is_some() {
                    "1"
                } else {
                    "0"
                })
                .arg(hash);
        }
        let statuses: Vec<String> = call
            .invoke_async(&mut self.conn.get().await?)
            .await
            .map_err(error)?;
        statuses
            .iter()
            .map(|s| match s.as_str() {
                "added" => Ok(EnqueueStatus::Added),
                "updated" => Ok(EnqueueStatus::Updated),
                "discarded" => Ok(EnqueueStatus::Discarded),
                other => Err(protocol(format!("the enqueue script answered `{other}`"))),
            })
            .collect()
    }

    async fn consumer(
        &self,
        queue: &str,
        settings: ConsumerSettings,
    ) -> Result<Arc<dyn Consumer>, ProviderError> {
        Ok(Arc::new(RedisConsumer::new(
            self.conn.clone(),
            self.keys(queue),
            queue,
            settings.lease,
        )))
    }

    async fn readiness(
        &self,
        queues: &[String],
    ) -> Result<Arc<dyn ReadinessBridge>, ProviderError> {
        Ok(Arc::new(
            RedisReadiness::open(&self.settings, queues).await?,
        ))
    }

    async fn depth(&self, queue: &str) -> Result<Depth, ProviderError> {
        let keys = self.keys(queue);
        let now = now_ms();
        let (ready, delayed, delayed_due, leased, expired): (u64, u64, u64, u64, u64) =
            redis::pipe()
                .zcard(&keys.ready)
                .zcard(&keys.delayed)
                .zcount(&keys.delayed, "-inf", now.div_euclid(1000))
                .zcard(&keys.leases)
                .zcount(&keys.leases, "-inf", now)
                .query_async(&mut self.conn.get().await?)
                .await
                .map_err(error)?;
        // Due delayed messages and expired leases are work the background task makes ready.
        Ok(Depth {
            ready: ready + delayed_due + expired,
            delayed: delayed - delayed_due,
            in_flight: leased - expired,
        })
    }

    fn background(&self, queues: &[String], shutdown: CancellationToken) -> Vec<JoinHandle<()>> {
        vec![tokio::spawn(self.maintenance().run(
            queues.to_vec(),
            self.settings.promote_interval,
            shutdown,
        ))]
    }
}

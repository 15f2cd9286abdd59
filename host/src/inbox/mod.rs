//! The consumer inbox: skips redeliveries of a message that already succeeded on the same
//! endpoint. Keyed by (endpoint, MessageId) — byte-exact, hashed with SHA-256 over an
//! unambiguous length-delimited encoding. The dispatch loop checks before invoking the guest
//! and records only after the guest returned success; a store failure is a transient failure
//! of the attempt, never a duplicate.

mod cleanup;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod sql;

use std::sync::Arc;

use async_trait::async_trait;

pub use cleanup::run_cleanup;
pub use memory::MemoryInbox;
#[cfg(feature = "redis")]
pub use redis::RedisInbox;
pub use sql::SqlInbox;

use crate::config::{Config, InboxStoreKind};

/// Longest MessageId the inbox accepts (longer ones bypass it).
pub const MAX_MESSAGE_ID: usize = 512;
/// Longest endpoint name the inbox accepts.
pub const MAX_ENDPOINT: usize = 260;

/// A failure of an inbox store.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The SQL database failed.
    #[error("inbox storage: {0}")]
    Sql(sqlx::Error),
    /// Redis failed.
    #[cfg(feature = "redis")]
    #[error("inbox storage (redis): {0}")]
    Redis(::redis::RedisError),
    /// The store is set up wrongly (e.g. a missing table).
    #[error("inbox storage: {0}")]
    Setup(String),
}

// The texts are printed, not chained as sources, so an error report shows them once.
impl From<sqlx::Error> for InboxError {
    fn from(e: sqlx::Error) -> Self {
        InboxError::Sql(e)
    }
}

#[cfg(feature = "redis")]
impl From<::redis::RedisError> for InboxError {
    fn from(e: ::redis::RedisError) -> Self {
        InboxError::Redis(e)
    }
}

/// The identity of one delivery on one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxKey {
    /// The endpoint (a handler binding).
    pub endpoint: String,
    /// The delivery's MessageId, byte-exact.
    pub message_id: String,
    /// SHA-256 of the length-delimited (endpoint, MessageId) encoding.
    pub hash: [u8; 32],
}

impl InboxKey {
    /// The key of `message_id` on `endpoint`, or why it cannot be deduplicated.
    pub fn new(endpoint: &str, message_id: &str) -> Result<InboxKey, Unusable> {
        if endpoint.is_empty() || endpoint.chars().count() > MAX_ENDPOINT {
            return Err(Unusable::Endpoint);
        }
        if message_id.trim().is_empty() {
            return Err(Unusable::BlankId);
        }
        if message_id.chars().count() > MAX_MESSAGE_ID {
            return Err(Unusable::LongId);
        }
        Ok(InboxKey {
            endpoint: endpoint.to_string(),
            message_id: message_id.to_string(),
            hash: crate::queue::inbox_hash(endpoint.as_bytes(), message_id.as_bytes()),
        })
    }
}

/// Why a delivery bypasses the inbox (the handler still runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// Missing or blank MessageId.
    #[error("the message id is missing or blank")]
    BlankId,
    /// MessageId longer than 512 characters.
    #[error("the message id is longer than 512 characters")]
    LongId,
    /// Endpoint empty or longer than 260 characters.
    #[error("the endpoint name is empty or longer than 260 characters")]
    Endpoint,
}

/// Storage of inbox records.
#[async_trait]
pub trait InboxStore: Send + Sync + 'static {
    /// Whether `key` was recorded (and has not expired).
    async fn is_processed(&self, key: &InboxKey) -> Result<bool, InboxError>;

    /// Record `key` as processed, kept for `retention_ms`. Idempotent: recording a key that
    /// exists (also concurrently) succeeds.
    async fn record(&self, key: &InboxKey, retention_ms: i64) -> Result<(), InboxError>;

    /// Delete at most `batch` records of `endpoint` created before `cutoff_ms`. Returns how
    /// many were deleted.
    async fn purge_expired(
        &self,
        endpoint: &str,
        cutoff_ms: i64,
        batch: u32,
    ) -> Result<u64, InboxError>;

    /// Check several keys at once (one round trip where the store can); returns, for each
    /// key in order, whether it was processed.
    async fn check_many(&self, keys: &[InboxKey]) -> Result<Vec<bool>, InboxError> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.is_processed(key).await?);
        }
        Ok(out)
    }

    /// Record several keys at once (one round trip where the store can).
    async fn record_many(&self, keys: &[InboxKey], retention_ms: i64) -> Result<(), InboxError> {
        for key in keys {
            self.record(key, retention_ms).await?;
        }
        Ok(())
    }

    /// The table this store keeps its records in, when that table lives in the queue's own
    /// SQL database: records can then be written by the settlement's transaction (one
    /// round trip and one commit; recorded exactly when settled). `None` for other stores.
    fn queue_database_table(&self) -> Option<Arc<str>> {
        None
    }
}

impl From<&InboxKey> for crate::queue::InboxRow {
    fn from(key: &InboxKey) -> Self {
        crate::queue::InboxRow {
            hash: key.hash,
            endpoint: key.endpoint.clone(),
            message_id: key.message_id.clone(),
        }
    }
}

/// The inbox stores the configuration's queues select, opened once each.
#[derive(Default, Clone)]
pub struct InboxStores {
    sql: Option<Arc<dyn InboxStore>>,
    redis: Option<Arc<dyn InboxStore>>,
    memory: Option<Arc<dyn InboxStore>>,
}

impl InboxStores {
    /// Open every store some queue selects.
    pub async fn open(config: &Config) -> anyhow::Result<InboxStores> {
        let mut stores = InboxStores::default();
        for (name, queue) in &config.queues {
            let Some(inbox) = &queue.inbox else { continue };
            match inbox.store {
                InboxStoreKind::Sql if stores.sql.is_none() => {
                    let sql = &config.inbox.sql;
                    let url = &config.storage.url;
                    let store: Arc<dyn InboxStore> = if url.starts_with("sqlite:") {
                        Arc::new(
                            SqlInbox::open_sqlite(url, &sql.table, sql.auto_create_table).await?,
                        )
                    } else {
                        Arc::new(
                            SqlInbox::open_postgres(
                                url,
                                config.storage.schema.as_deref(),
                                &sql.table,
                                sql.auto_create_table,
                            )
                            .await?,
                        )
                    };
                    stores.sql = Some(store);
                }
                #[cfg(feature = "redis")]
                InboxStoreKind::Redis if stores.redis.is_none() => {
                    use anyhow::Context;
                    let redis = config
                        .inbox
                        .redis
                        .as_ref()
                        .context("[inbox.redis] is required")?;
                    let store = RedisInbox::open(&redis.url, &redis.key_prefix)
                        .await
                        .with_context(|| {
                            format!(
                                "connecting the inbox to Redis at {} (inbox.redis.url)",
                                crate::config::redacted_url(&redis.url)
                            )
                        })?;
                    stores.redis = Some(Arc::new(store));
                }
                InboxStoreKind::Memory if stores.memory.is_none() => {
                    tracing::warn!(queue = %name, "the in-memory inbox is not durable: duplicates are not detected across restarts");
                    stores.memory = Some(Arc::new(MemoryInbox::default()));
                }
                _ => {}
            }
        }
        Ok(stores)
    }

    /// The opened store of a kind.
    pub fn get(&self, kind: InboxStoreKind) -> Option<Arc<dyn InboxStore>> {
        match kind {
            InboxStoreKind::Sql => self.sql.clone(),
            InboxStoreKind::Redis => self.redis.clone(),
            InboxStoreKind::Memory => self.memory.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_byte_exact_and_unambiguous() {
        let k = |e: &str, m: &str| InboxKey::new(e, m).unwrap().hash;
        assert_ne!(k("billing", "A1"), k("billing", "a1"));
        assert_ne!(k("billing", "A1"), k("billing", "A1 "));
        assert_ne!(
            k("ab", "c"),
            k("a", "bc"),
            "length-delimited, not concatenated"
        );
        assert_eq!(k("billing", "A1"), k("billing", "A1"));
    }

    #[test]
    fn unusable_ids_are_refused() {
        assert_eq!(InboxKey::new("e", "  "), Err(Unusable::BlankId));
        assert_eq!(InboxKey::new("e", ""), Err(Unusable::BlankId));
        assert!(InboxKey::new("e", &"x".repeat(512)).is_ok());
        assert_eq!(InboxKey::new("e", &"x".repeat(513)), Err(Unusable::LongId));
        assert_eq!(
            InboxKey::new(&"e".repeat(261), "id"),
            Err(Unusable::Endpoint)
        );
    }
}

//! The inbox in Redis: one key per record, `{prefix}{hex hash}`, holding the endpoint and
//! MessageId for diagnostics, with the endpoint's retention as its expiry — Redis enforces
//! retention itself, so a purge pass has nothing to delete.

use async_trait::async_trait;
use redis::AsyncCommands;
use std::time::Duration;

use super::{InboxError, InboxKey, InboxStore};
use crate::redis_client::{RedisConnection, RedisTarget};

/// The Redis inbox store, on one server or a cluster (reconnects by itself). Each record is
/// one key, so every command touches one slot.
#[derive(Clone)]
pub struct RedisInbox {
    conn: RedisConnection,
    prefix: String,
}

impl RedisInbox {
    /// Connect to `url` (`redis+cluster://…` for a cluster); keys start with `prefix`.
    pub async fn open(url: &str, prefix: &str) -> Result<Self, InboxError> {
        let conn = RedisTarget::parse(url)?
            .connect(Duration::from_secs(5))
            .await?;
        Ok(RedisInbox {
            conn,
            prefix: prefix.to_string(),
        })
    }

    fn key(&self, key: &InboxKey) -> String {
        format!("{}{}", self.prefix, hex::encode(key.hash))
    }
}

#[async_trait]
impl InboxStore for RedisInbox {
    async fn is_processed(&self, key: &InboxKey) -> Result<bool, InboxError> {
        let mut conn = self.conn.clone();
        Ok(conn.exists(self.key(key)).await?)
    }

    async fn record(&self, key: &InboxKey, retention_ms: i64) -> Result<(), InboxError> {
        let mut conn = self.conn.clone();
        let value = serde_json::json!({ "endpoint": key.endpoint, "message_id": key.message_id })
            .to_string();
        // SET NX PX: a concurrent or repeated record keeps the first and succeeds.
        let _: Option<String> = redis::cmd("SET")
            .arg(self.key(key))
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(retention_ms.max(1))
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn purge_expired(
        &self,
        _endpoint: &str,
        _cutoff_ms: i64,
        _batch: u32,
    ) -> Result<u64, InboxError> {
        Ok(0)
    }
}

//! An in-memory inbox for tests and local runs. Not durable.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{InboxError, InboxKey, InboxStore};
use crate::clock::now_ms;

/// Records in a map: hash → (endpoint, created, expires).
#[derive(Default)]
pub struct MemoryInbox {
    records: Mutex<HashMap<[u8; 32], (String, i64, i64)>>,
}

#[async_trait]
impl InboxStore for MemoryInbox {
    async fn is_processed(&self, key: &InboxKey) -> Result<bool, InboxError> {
        let records = self.records.lock().expect("inbox map");
        Ok(records
            .get(&key.hash)
            .is_some_and(|(_, _, expires)| *expires > now_ms()))
    }

    async fn record(&self, key: &InboxKey, retention_ms: i64) -> Result<(), InboxError> {
        let now = now_ms();
        self.records
            .lock()
            .expect("inbox map")
            .entry(key.hash)
            .or_insert((key.endpoint.clone(), now, now + retention_ms));
        Ok(())
    }

    async fn purge_expired(
        &self,
        endpoint: &str,
        cutoff_ms: i64,
        batch: u32,
    ) -> Result<u64, InboxError> {
        let mut records = self.records.lock().expect("inbox map");
        let expired: Vec<[u8; 32]> = records
            .iter()
            .filter(|(_, (e, created, _))| e == endpoint && *created < cutoff_ms)
            .map(|(h, _)| *h)
            .take(batch as usize)
            .collect();
        for h in &expired {
            records.remove(h);
        }
        Ok(expired.len() as u64)
    }
}

//! The Redis provider. Per queue, with the configured prefix (default `nexus:queue:`) and
//! the queue name as a literal hash tag so every key lands in one Redis Cluster slot:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{prefix}{queue}` | sorted set | ready envelopes, score = priority |
//! | `{prefix}{queue}:readiness` | stream | one `queue <name>` record per ready enqueue |
//! | `{prefix}{queue}:delayed` | sorted set | scheduled envelopes, score = due Unix seconds |
//! | `{prefix}{queue}:ids` | hash | MessageId → its pending envelope (replacement, idempotency) |
//! | `{prefix}{queue}:leases` | sorted set | lease token → deadline (Unix ms) |
//! | `{prefix}{queue}:leased` | hash | lease token → `priority|envelope` |
//! | `{prefix}{queue}:attempts` | hash | envelope → deliveries so far |
//! | `{prefix}{queue}:lease-seq` | string | the fencing-token counter |
//!
//! Leasing pops the highest score first (`ZPOPMAX`), so higher priorities run first, like
//! the SQL queue; within one priority Redis orders members by their bytes, not by arrival.

mod bridge;
mod scripts;

use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub use bridge::RedisReadiness;
pub use scripts::DIRECT_PRODUCER;

use super::{Depth, Envelope, ExternalError, ExternalLeased, ExternalPendingStorage};
use crate::config::RedisProviderConfig;
use crate::queue::{EnqueueStatus, now_ms};

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
            leases: format!("{ready}:leases"),
            leased: format!("{ready}:leased"),
            attempts: format!("{ready}:attempts"),
            lease_seq: format!("{ready}:lease-seq"),
            ready,
        }
    }

    /// Every key, for checks (all must share one cluster slot).
    pub fn all(&self) -> [&str; 8] {
        [
            &self.ready,
            &self.readiness,
            &self.delayed,
            &self.ids,
            &self.leases,
            &self.leased,
            &self.attempts,
            &self.lease_seq,
        ]
    }
}

/// Open a reconnecting connection to `url`.
pub(crate) async fn connect(
    url: &str,
    response_timeout: Duration,
) -> Result<ConnectionManager, ExternalError> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(2);
    Ok(ConnectionManager::new_with_config(client, config).await?)
}

/// Pending messages in Redis.
pub struct RedisStorage {
    conn: ConnectionManager,
    prefix: String,
    enqueue: Script,
    lease: Script,
    settle: Script,
    return_expired: Script,
    release: Script,
}

impl RedisStorage {
    /// Connect with `config`.
    pub async fn open(config: &RedisProviderConfig) -> Result<Self, ExternalError> {
        Ok(RedisStorage {
            conn: connect(&config.url, Duration::from_secs(5)).await?,
            prefix: config.key_prefix.clone(),
            enqueue: Script::new(scripts::ENQUEUE),
            lease: Script::new(scripts::LEASE),
            settle: Script::new(scripts::SETTLE),
            return_expired: Script::new(scripts::RETURN_EXPIRED),
            release: Script::new(scripts::RELEASE),
        })
    }

    /// The keys of `queue`.
    pub fn keys(&self, queue: &str) -> Keys {
        Keys::new(&self.prefix, queue)
    }

    async fn enqueue_many(
        &self,
        queue: &str,
        items: &[(&Envelope, Option<i64>)],
        idempotent: bool,
    ) -> Result<Vec<EnqueueStatus>, ExternalError> {
        let keys = self.keys(queue);
        let mut call = self.enqueue.prepare_invoke();
        call.key(&keys.ready)
            .key(&keys.readiness)
            .key(&keys.delayed)
            .key(&keys.ids)
            .arg(queue)
            .arg(if idempotent { "1" } else { "0" });
        for (envelope, due_at_ms) in items {
            let score = match due_at_ms {
                // Seconds, rounded up: a message never runs before its time.
                Some(ms) => (ms + 999).div_euclid(1000),
                None => i64::from(envelope.priority),
            };
            call.arg(score)
                .arg(envelope.to_json())
                .arg(envelope.message_id.as_deref().unwrap_or(""))
                .arg(if due_at_ms.is_some() { "1" } else { "0" });
        }
        let statuses: Vec<String> = call.invoke_async(&mut self.conn.clone()).await?;
        statuses
            .iter()
            .map(|s| match s.as_str() {
                "added" => Ok(EnqueueStatus::Added),
                "updated" => Ok(EnqueueStatus::Updated),
                "discarded" => Ok(EnqueueStatus::Discarded),
                other => Err(ExternalError::Protocol(format!(
                    "the enqueue script answered `{other}`"
                ))),
            })
            .collect()
    }
}

#[async_trait]
impl ExternalPendingStorage for RedisStorage {
    async fn enqueue(
        &self,
        queue: &str,
        envelope: &Envelope,
        idempotent: bool,
    ) -> Result<EnqueueStatus, ExternalError> {
        let mut out = self
            .enqueue_many(queue, &[(envelope, None)], idempotent)
            .await?;
        out.pop()
            .ok_or_else(|| ExternalError::Protocol("the enqueue script answered nothing".into()))
    }

    async fn enqueue_batch(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        idempotent: bool,
    ) -> Result<Vec<EnqueueStatus>, ExternalError> {
        if envelopes.is_empty() {
            return Ok(Vec::new());
        }
        let items: Vec<(&Envelope, Option<i64>)> = envelopes.iter().map(|e| (e, None)).collect();
        self.enqueue_many(queue, &items, idempotent).await
    }

    async fn enqueue_delayed(
        &self,
        queue: &str,
        envelope: &Envelope,
        due_at_ms: i64,
        idempotent: bool,
    ) -> Result<EnqueueStatus, ExternalError> {
        let mut out = self
            .enqueue_many(queue, &[(envelope, Some(due_at_ms))], idempotent)
            .await?;
        out.pop()
            .ok_or_else(|| ExternalError::Protocol("the enqueue script answered nothing".into()))
    }

    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: i64,
    ) -> Result<Vec<ExternalLeased>, ExternalError> {
        let keys = self.keys(queue);
        let flat: Vec<redis::Value> = self
            .lease
            .key(&keys.ready)
            .key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.attempts)
            .key(&keys.lease_seq)
            .arg(max)
            .arg(now_ms() + lease_ms)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let mut out = Vec::with_capacity(flat.len() / 3);
        for triple in flat.chunks(3) {
            let [token, body, attempt] = triple else {
                return Err(ExternalError::Protocol(
                    "the lease script answered an incomplete entry".into(),
                ));
            };
            out.push(ExternalLeased {
                token: redis::from_redis_value_ref(token)?,
                body: redis::from_redis_value_ref(body)?,
                attempt: redis::from_redis_value_ref(attempt)?,
            });
        }
        Ok(out)
    }

    async fn settle(
        &self,
        queue: &str,
        settled: &[(String, Option<String>)],
    ) -> Result<Vec<bool>, ExternalError> {
        if settled.is_empty() {
            return Ok(Vec::new());
        }
        let keys = self.keys(queue);
        let mut call = self.settle.prepare_invoke();
        call.key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.attempts)
            .key(&keys.ids);
        for (token, id) in settled {
            call.arg(token).arg(id.as_deref().unwrap_or(""));
        }
        let held: Vec<i64> = call.invoke_async(&mut self.conn.clone()).await?;
        Ok(held.into_iter().map(|h| h == 1).collect())
    }

    async fn release(&self, queue: &str, tokens: &[String]) -> Result<u64, ExternalError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let keys = self.keys(queue);
        let mut call = self.release.prepare_invoke();
        call.key(&keys.ready)
            .key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.attempts)
            .key(&keys.readiness)
            .arg(queue);
        for token in tokens {
            call.arg(token);
        }
        Ok(call.invoke_async(&mut self.conn.clone()).await?)
    }

    async fn return_expired(&self, queue: &str, max: u32) -> Result<u64, ExternalError> {
        let keys = self.keys(queue);
        let n: u64 = self
            .return_expired
            .key(&keys.ready)
            .key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.readiness)
            .arg(now_ms())
            .arg(max)
            .arg(queue)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(n)
    }

    async fn depth(&self, queue: &str) -> Result<Depth, ExternalError> {
        let keys = self.keys(queue);
        let now = now_ms();
        let (ready, delayed, delayed_due, leased, expired): (u64, u64, u64, u64, u64) =
            redis::pipe()
                .zcard(&keys.ready)
                .zcard(&keys.delayed)
                .zcount(&keys.delayed, "-inf", now.div_euclid(1000))
                .zcard(&keys.leases)
                .zcount(&keys.leases, "-inf", now)
                .query_async(&mut self.conn.clone())
                .await?;
        Ok(Depth {
            ready,
            delayed,
            delayed_due,
            leased,
            expired,
        })
    }

    async fn ping(&self) -> Result<(), ExternalError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

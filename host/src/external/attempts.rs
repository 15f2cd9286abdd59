//! Host-side delivery counting for brokers that only flag a redelivery (RabbitMQ classic
//! queues: redeliveries are counted) or tell nothing (every delivery is counted): in the
//! `external_attempts` table of the `[storage]` database, keyed by queue and MessageId (or
//! the body's SHA-256 when it has none), so a message that keeps coming back — even across
//! host restarts — ends failed after `max_attempts`. The row is removed when the message is
//! settled; a message the host hands back itself is forgiven one count.

use super::{Delivery, DeliveryCount, Envelope, SqlActivations};
use crate::queue::now_ms;
use crate::sql::Pool;
use async_trait::async_trait;
use sha2::{Digest, Sha256};

/// Durable redelivery counts of external messages.
#[async_trait]
pub trait AttemptCounter: Send + Sync + 'static {
    /// Count one more (re)delivery of each of `keys` in `queue`; returns each key's count so
    /// far, this one included.
    async fn redelivered(&self, queue: &str, keys: &[String]) -> Result<Vec<u32>, sqlx::Error>;
    /// Forget `keys` (their messages were settled).
    async fn forget(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error>;
    /// The next redelivery of each of `keys` is not an attempt (the host handed the message
    /// back itself, at shutdown).
    async fn forgive(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error>;
    /// Delete counts untouched since `before_ms` (messages settled elsewhere, or gone).
    /// Returns how many.
    async fn purge(&self, before_ms: i64) -> Result<u64, sqlx::Error>;
}

/// Delete counts untouched for `max_age`, every `interval`, until `shutdown`.
pub async fn run_purge(
    counter: std::sync::Arc<dyn AttemptCounter>,
    max_age: std::time::Duration,
    interval: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match counter.purge(now_ms() - max_age.as_millis() as i64).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "deleted stale delivery counts"),
            Err(e) => tracing::debug!("deleting stale delivery counts failed: {e}"),
        }
    }
}

/// The key a message is counted under: its MessageId, or the SHA-256 of its body.
pub fn attempt_key(message_id: Option<&str>, body: &[u8]) -> String {
    match message_id {
        Some(id) => format!("id:{id}"),
        None => format!("sha256:{}", hex::encode(Sha256::digest(body))),
    }
}

/// The `external_attempts` table, on the activation store's connections.
pub struct SqlAttempts(Pool);

impl SqlAttempts {
    /// The counter in the same database as `activations`.
    pub fn beside(activations: &SqlActivations) -> Self {
        SqlAttempts(activations.0.clone())
    }
}

/// Count one more delivery of (`$1` queue, `$2` key) at `$3`; returns the count.
const REDELIVERED: &str = "
INSERT INTO external_attempts (queue, message_key, redeliveries, updated_at_ms) VALUES ($1, $2, 1, $3)
ON CONFLICT (queue, message_key) DO UPDATE
SET redeliveries = external_attempts.redeliveries + 1, updated_at_ms = $3
RETURNING CAST(redeliveries AS BIGINT)";
/// Take one count back from (`$1` queue, `$2` key) at `$3`.
const FORGIVE: &str = "
INSERT INTO external_attempts (queue, message_key, redeliveries, updated_at_ms) VALUES ($1, $2, -1, $3)
ON CONFLICT (queue, message_key) DO UPDATE
SET redeliveries = external_attempts.redeliveries - 1, updated_at_ms = $3";
const PURGE: &str = "DELETE FROM external_attempts WHERE updated_at_ms < $1";
const FORGET: &str = "DELETE FROM external_attempts WHERE queue = $1 AND message_key = $2";

#[async_trait]
impl AttemptCounter for SqlAttempts {
    async fn redelivered(&self, queue: &str, keys: &[String]) -> Result<Vec<u32>, sqlx::Error> {
        let now = now_ms();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let row = self.0.query(REDELIVERED).bind(queue).bind(key.as_str());
            let n: i64 = row.bind(now).fetch_one().await?.get(0)?;
            out.push(n.max(0) as u32);
        }
        Ok(out)
    }

    async fn forgive(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error> {
        let now = now_ms();
        for key in keys {
            let forgive = self.0.query(FORGIVE).bind(queue).bind(key.as_str());
            forgive.bind(now).execute().await?;
        }
        Ok(())
    }

    async fn purge(&self, before_ms: i64) -> Result<u64, sqlx::Error> {
        self.0.query(PURGE).bind(before_ms).execute().await
    }

    async fn forget(&self, queue: &str, keys: &[String]) -> Result<(), sqlx::Error> {
        for key in keys {
            let forget = self.0.query(FORGET).bind(queue).bind(key.as_str());
            forget.execute().await?;
        }
        Ok(())
    }
}

/// The key the host counts a message's deliveries under: the broker's identity of the
/// message, or its MessageId, or its body's SHA-256.
pub(crate) fn counting_key(delivery: &Delivery, envelope: Option<&Envelope>) -> String {
    let key = match &delivery.identity {
        Some(identity) => format!("delivery:{identity}"),
        None => attempt_key(
            envelope.and_then(|e| e.message_id.as_deref()),
            &delivery.body,
        ),
    };
    bounded(key)
}

/// Longest counting key stored as is; a longer one (a direct producer's long MessageId) is
/// stored as its SHA-256, so the table's index never meets an over-long key.
const MAX_COUNTING_KEY: usize = 256;

fn bounded(key: String) -> String {
    if key.len() <= MAX_COUNTING_KEY {
        return key;
    }
    format!("key-sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// The attempt of each delivery: the broker's count where it has one; otherwise the
/// host's durable count — of redeliveries where the broker flags them (a first delivery
/// is attempt 1 without a write), of every delivery where it tells nothing.
pub(crate) async fn attempts_of(
    counter: &dyn AttemptCounter,
    queue: &str,
    provider: &str,
    deliveries: &[(Delivery, Option<Envelope>, Option<String>)],
) -> Vec<(u32, Option<String>)> {
    let mut out: Vec<(u32, Option<String>)> = vec![(1, None); deliveries.len()];
    let mut counted: Vec<(usize, String, u32)> = Vec::new();
    for (i, (d, e, _)) in deliveries.iter().enumerate() {
        let key = || counting_key(d, e.as_ref());
        match d.count {
            DeliveryCount::Exact(n) => out[i].0 = n.max(1),
            DeliveryCount::Redelivered(false) => {}
            // The count so far is of redeliveries: this one is attempt count + 1.
            DeliveryCount::Redelivered(true) => counted.push((i, key(), 1)),
            // The count so far is of deliveries, this one included.
            DeliveryCount::Unknown => counted.push((i, key(), 0)),
        }
    }
    if counted.is_empty() {
        return out;
    }
    let keys: Vec<String> = counted.iter().map(|(_, k, _)| k.clone()).collect();
    match counter.redelivered(queue, &keys).await {
        Ok(counts) => {
            for ((i, key, extra), n) in counted.into_iter().zip(counts) {
                out[i] = ((n + extra).max(1), Some(key));
            }
        }
        Err(e) => {
            tracing::warn!(queue = %queue, provider = %provider, "counting deliveries failed; counting them as a second attempt: {e}");
            for (i, key, _) in counted {
                out[i] = (2, Some(key));
            }
        }
    }
    out
}

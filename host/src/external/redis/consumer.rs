//! The processing consumer of one Redis queue: leases by script (`ZPOPMAX` with a fencing
//! token and a delivery count per envelope), settles by token, releases with or without
//! counting the delivery.

use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use serde::Deserialize;

use super::{KIND, Keys, Lazy, error, protocol, scripts};
use crate::external::{Consumer, Delivery, DeliveryCount, Handle, Nack, ProviderError};
use crate::queue::now_ms;

/// What settles one Redis lease: its fencing token and the envelope's MessageId (whose
/// `:ids` entry the settlement removes).
#[derive(Debug, Clone)]
struct Lease {
    token: String,
    message_id: Option<String>,
    /// When the lease ends (Unix ms).
    deadline_ms: i64,
}

/// Only the MessageId of an envelope.
#[derive(Deserialize)]
struct IdOnly {
    #[serde(rename = "MessageId", default)]
    message_id: Option<String>,
}

/// The consumer of one queue.
pub struct RedisConsumer {
    conn: Lazy,
    keys: Keys,
    queue: String,
    lease: Duration,
    lease_script: Script,
    settle: Script,
    release: Script,
}

impl RedisConsumer {
    pub(super) fn new(conn: Lazy, keys: Keys, queue: &str, lease: Duration) -> Self {
        RedisConsumer {
            conn,
            keys,
            queue: queue.to_string(),
            lease,
            lease_script: Script::new(scripts::LEASE),
            settle: Script::new(scripts::SETTLE),
            release: Script::new(scripts::RELEASE),
        }
    }

    fn tokens(handles: &[Handle]) -> Result<Vec<&Lease>, ProviderError> {
        Handle::all(handles, KIND)
    }
}

#[async_trait]
impl Consumer for RedisConsumer {
    async fn receive(&self, max: u32) -> Result<Vec<Delivery>, ProviderError> {
        let keys = &self.keys;
        let deadline_ms = now_ms() + self.lease.as_millis() as i64;
        let flat: Vec<redis::Value> = self
            .lease_script
            .key(&keys.ready)
            .key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.attempts)
            .key(&keys.lease_seq)
            .arg(max)
            .arg(deadline_ms)
            .invoke_async(&mut self.conn.get().await?)
            .await
            .map_err(error)?;
        let mut out = Vec::with_capacity(flat.len() / 3);
        for triple in flat.chunks(3) {
            let [token, body, attempt] = triple else {
                return Err(protocol("the lease script answered an incomplete entry"));
            };
            let token: String = redis::from_redis_value_ref(token)
                .map_err(|e| protocol(format!("lease token: {e}")))?;
            let body: Vec<u8> = redis::from_redis_value_ref(body)
                .map_err(|e| protocol(format!("leased body: {e}")))?;
            let attempt: u32 = redis::from_redis_value_ref(attempt)
                .map_err(|e| protocol(format!("delivery count: {e}")))?;
            let message_id = serde_json::from_slice::<IdOnly>(&body)
                .ok()
                .and_then(|e| e.message_id);
            out.push(Delivery {
                handle: Handle::new(Lease {
                    token,
                    message_id,
                    deadline_ms,
                }),
                body: body.into(),
                count: DeliveryCount::Exact(attempt),
                identity: None,
                enqueued_at_ms: None,
                headers: Vec::new(),
                session: None,
            });
        }
        Ok(out)
    }

    fn leases_on_receive(&self) -> bool {
        // The lease script sets the deadline; a release without counting takes the
        // delivery's count back.
        true
    }

    fn holds(&self, handle: &Handle) -> bool {
        handle
            .get::<Lease>(KIND)
            .is_ok_and(|lease| now_ms() < lease.deadline_ms)
    }

    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        if handles.is_empty() {
            return Ok(Vec::new());
        }
        let keys = &self.keys;
        let mut call = self.settle.prepare_invoke();
        call.key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.attempts)
            .key(&keys.ids)
            .key(&keys.id_hashes);
        for lease in Self::tokens(handles)? {
            call.arg(&lease.token)
                .arg(lease.message_id.as_deref().unwrap_or(""));
        }
        let held: Vec<i64> = call
            .invoke_async(&mut self.conn.get().await?)
            .await
            .map_err(error)?;
        Ok(held.into_iter().map(|h| h == 1).collect())
    }

    async fn nack(&self, handles: &[Handle], nack: Nack) -> Result<(), ProviderError> {
        if handles.is_empty() {
            return Ok(());
        }
        let keys = &self.keys;
        let mut call = self.release.prepare_invoke();
        call.key(&keys.ready)
            .key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.attempts)
            .key(&keys.readiness)
            .arg(&self.queue)
            .arg(if nack.counted { "1" } else { "0" });
        for lease in Self::tokens(handles)? {
            call.arg(&lease.token);
        }
        if nack.requeue {
            let _: u64 = call
                .invoke_async(&mut self.conn.get().await?)
                .await
                .map_err(error)?;
            Ok(())
        } else {
            // Dropped for good: settled like a processed message.
            self.ack(handles).await.map(|_| ())
        }
    }
}

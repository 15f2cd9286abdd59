//! The Redis provider's background task: promoting due delayed messages and returning
//! expired leases, for every queue the provider serves.

use std::time::Duration;

use redis::Script;
use tokio_util::sync::CancellationToken;

use super::{KIND, Keys, Lazy, error};
use crate::external::ProviderError;
use crate::queue::now_ms;

/// The Redis provider's own housekeeping: promoting due delayed messages (with their
/// readiness record) and returning expired leases to the ready set (a host died holding
/// them).
#[derive(Clone)]
pub struct Maintenance {
    conn: Lazy,
    prefix: String,
    promote: Script,
    return_expired: Script,
}

impl Maintenance {
    pub(super) fn new(conn: Lazy, prefix: &str) -> Self {
        Maintenance {
            conn,
            prefix: prefix.to_string(),
            promote: Script::new(super::scripts::PROMOTE_DUE),
            return_expired: Script::new(super::scripts::RETURN_EXPIRED),
        }
    }

    /// Promote due delayed messages of `queue`; returns how many became ready.
    pub async fn promote_due(&self, queue: &str) -> Result<u64, ProviderError> {
        let keys = Keys::new(&self.prefix, queue);
        self.promote
            .key(&keys.delayed)
            .key(&keys.ready)
            .key(&keys.readiness)
            .arg(now_ms().div_euclid(1000))
            .arg(queue)
            .arg(1000)
            .invoke_async(&mut self.conn.get().await?)
            .await
            .map_err(error)
    }

    /// Return expired leases of `queue` to the ready set; returns how many.
    pub async fn return_expired(&self, queue: &str) -> Result<u64, ProviderError> {
        let keys = Keys::new(&self.prefix, queue);
        self.return_expired
            .key(&keys.ready)
            .key(&keys.leases)
            .key(&keys.leased)
            .key(&keys.readiness)
            .arg(now_ms())
            .arg(1000)
            .arg(queue)
            .invoke_async(&mut self.conn.get().await?)
            .await
            .map_err(error)
    }

    /// Both, for every queue, every `interval` until `shutdown`.
    pub(super) async fn run(
        self,
        queues: Vec<String>,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            for queue in &queues {
                let done = match self.promote_due(queue).await {
                    Ok(_) => self.return_expired(queue).await,
                    Err(e) => Err(e),
                };
                match done {
                    Ok(n) => {
                        if n > 0 {
                            tracing::warn!(%queue, provider = KIND, count = n, "returned messages whose lease expired");
                        }
                        if std::mem::take(&mut failing) {
                            tracing::info!(%queue, provider = KIND, "delayed-message promotion works again");
                        }
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(%queue, provider = KIND, "promoting delayed messages failed, retrying: {e}");
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

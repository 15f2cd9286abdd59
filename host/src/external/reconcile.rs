//! Reconciliation: a periodic pass over every external queue that returns expired leases
//! and activates queues holding work without an activation — recovering notifications that
//! were lost or deleted.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ActivationStore, ExternalPendingStorage};

/// One external queue as reconciliation sees it.
pub struct ReconciledQueue {
    /// The queue name.
    pub queue: String,
    /// Its provider name (for logs).
    pub provider: String,
    /// Its storage.
    pub storage: Arc<dyn ExternalPendingStorage>,
}

/// Run reconciliation every `interval` until `shutdown`.
pub async fn run_reconciliation(
    queues: Vec<ReconciledQueue>,
    activations: Arc<dyn ActivationStore>,
    interval: Duration,
    wake: Arc<dyn Fn(&str) + Send + Sync>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        for q in &queues {
            if let Err(e) = reconcile(q, activations.as_ref(), wake.as_ref()).await {
                tracing::warn!(queue = %q.queue, provider = %q.provider, "reconciliation failed, retried next pass: {e}");
            }
        }
    }
}

async fn reconcile(
    q: &ReconciledQueue,
    activations: &dyn ActivationStore,
    wake: &(dyn Fn(&str) + Send + Sync),
) -> Result<(), String> {
    let returned = q
        .storage
        .return_expired(&q.queue, 1000)
        .await
        .map_err(|e| e.to_string())?;
    if returned > 0 {
        tracing::warn!(queue = %q.queue, provider = %q.provider, count = returned, "returned messages whose lease expired");
    }
    let depth = q.storage.depth(&q.queue).await.map_err(|e| e.to_string())?;
    if depth.has_work()
        && !activations
            .is_requested(&q.queue)
            .await
            .map_err(|e| e.to_string())?
    {
        activations
            .request(std::slice::from_ref(&q.queue))
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(queue = %q.queue, provider = %q.provider, ready = depth.ready, due = depth.delayed_due, "reconciliation activated a queue that had work but no activation");
        wake(&q.queue);
    }
    Ok(())
}

//! Reconciliation: a periodic pass over every external queue that activates queues holding
//! work without an activation — recovering notifications that were lost or deleted. Queues
//! whose provider cannot tell its depth are activated on every pass instead.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ActivationStore, Provider};

/// One external queue as reconciliation sees it.
pub struct ReconciledQueue {
    /// The queue name.
    pub queue: String,
    /// Its provider name (for logs).
    pub provider: String,
    /// Its provider.
    pub broker: Arc<dyn Provider>,
}

/// Run reconciliation every `interval` until `shutdown`.
pub async fn run_reconciliation(
    queues: Vec<ReconciledQueue>,
    activations: Arc<dyn ActivationStore>,
    interval: Duration,
    wake: Arc<dyn Fn(&str) + Send + Sync>,
    shutdown: CancellationToken,
) {
    let mut failing = vec![false; queues.len()];
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        for (q, failing) in queues.iter().zip(failing.iter_mut()) {
            match reconcile(q, activations.as_ref(), wake.as_ref()).await {
                // Logged once per outage.
                Err(e) if !*failing => {
                    *failing = true;
                    tracing::warn!(queue = %q.queue, provider = %q.provider, "reconciliation failed, retried every pass: {e}");
                }
                Err(_) => {}
                Ok(()) => {
                    if std::mem::take(failing) {
                        tracing::info!(queue = %q.queue, provider = %q.provider, "reconciliation works again");
                    }
                }
            }
        }
    }
}

async fn reconcile(
    q: &ReconciledQueue,
    activations: &dyn ActivationStore,
    wake: &(dyn Fn(&str) + Send + Sync),
) -> Result<(), String> {
    // A provider that cannot tell its depth is activated on every pass.
    let depth = if q.broker.capabilities().depth {
        Some(q.broker.depth(&q.queue).await.map_err(|e| e.to_string())?)
    } else {
        None
    };
    let has_work = depth.is_none_or(|d| d.ready > 0);
    if has_work
        && !activations
            .is_requested(&q.queue)
            .await
            .map_err(|e| e.to_string())?
    {
        activations
            .request(std::slice::from_ref(&q.queue))
            .await
            .map_err(|e| e.to_string())?;
        if depth.is_some() {
            tracing::info!(queue = %q.queue, provider = %q.provider, ready = depth.map_or(0, |d| d.ready), "reconciliation activated a queue that had work but no activation");
        }
        wake(&q.queue);
    }
    Ok(())
}

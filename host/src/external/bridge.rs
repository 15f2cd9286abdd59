//! The bridge loop, the same for every provider: receive readiness notifications, make the
//! activation of their queues durable, only then acknowledge them, and wake this process's
//! processors. Failures mark the provider's health check and are retried.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ActivationStore, ProviderHealth, ReadinessBridge};

/// Run `bridge` for `queues` until `shutdown`. `wake` is called with each activated queue.
pub async fn run_bridge(
    bridge: Arc<dyn ReadinessBridge>,
    queues: Vec<String>,
    activations: Arc<dyn ActivationStore>,
    health: Arc<ProviderHealth>,
    wake: Arc<dyn Fn(&str) + Send + Sync>,
    shutdown: CancellationToken,
) {
    let mut started = false;
    while !shutdown.is_cancelled() {
        let step = async {
            if !started {
                bridge
                    .start()
                    .await
                    .map_err(|e| format!("starting the readiness consumer: {e}"))?;
                started = true;
            }
            let notes = bridge
                .receive()
                .await
                .map_err(|e| format!("reading readiness notifications: {e}"))?;
            if !notes.is_empty() {
                let mut activated: Vec<String> = notes.iter().map(|n| n.queue.clone()).collect();
                activated.sort();
                activated.dedup();
                activations.request(&activated).await.map_err(|e| {
                    format!("recording activations (notifications stay unacknowledged): {e}")
                })?;
                for queue in &activated {
                    wake(queue);
                }
                bridge
                    .acknowledge(&notes)
                    .await
                    .map_err(|e| format!("acknowledging readiness notifications: {e}"))?;
            }
            Ok::<_, String>(())
        };
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => break,
            outcome = step => outcome,
        };
        match outcome {
            Ok(()) => {
                health.succeeded(&format!("consuming readiness of {} queue(s)", queues.len()))
            }
            Err(reason) => {
                health.failed(reason);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
    bridge.close().await;
}

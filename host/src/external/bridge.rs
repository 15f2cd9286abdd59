//! The bridge loop, the same for every provider: receive readiness notifications, make the
//! activation of their queues durable, only then acknowledge them, and wake this process's
//! processors. Failures mark the provider's health check and are retried.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ActivationStore, Provider, ProviderHealth, ReadinessBridge};

/// Run `bridge` for `queues` until `shutdown`, first preparing them on `unprepared` when
/// start-up could not. `wake` is called with each activated queue. Failures are retried with
/// a growing pause (up to five seconds).
pub async fn run_bridge(
    unprepared: Option<Arc<dyn Provider>>,
    bridge: Arc<dyn ReadinessBridge>,
    queues: Vec<String>,
    activations: Arc<dyn ActivationStore>,
    health: Arc<ProviderHealth>,
    wake: Arc<dyn Fn(&str) + Send + Sync>,
    shutdown: CancellationToken,
) {
    let mut started = false;
    let mut unprepared = unprepared;
    let mut pause = MIN_PAUSE;
    while !shutdown.is_cancelled() {
        let step = async {
            if let Some(provider) = &unprepared {
                provider
                    .prepare(&queues)
                    .await
                    .map_err(|e| format!("declaring the queues: {e}"))?;
                unprepared = None;
            }
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
                pause = MIN_PAUSE;
                health.succeeded(&format!("consuming readiness of {} queue(s)", queues.len()))
            }
            Err(reason) => {
                health.failed(reason);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
    bridge.close().await;
}

/// First pause after a failure.
const MIN_PAUSE: Duration = Duration::from_millis(250);
/// Longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(5);

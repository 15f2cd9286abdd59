//! Starting the external machinery of a host: for every provider that serves a queue, its
//! declarations, its readiness bridge (with the `external_queue_readiness_{provider}` health
//! check) and its own background tasks; the reconciliation pass; and the wake-up signal of
//! each external queue. A queue without a handler is declared and kept (its provider's
//! background tasks include it) but never consumed: no bridge reads its readiness.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    ActivationStore, ErrorKind, ProviderError, ProviderHealth, Providers, ReconciledQueue,
    run_bridge, run_probe, run_reconciliation,
};
use crate::config::{Config, QueueStorage};
use crate::health::HealthRegistry;

/// What the processors of external queues need from the started machinery.
pub struct ExternalRuntime {
    /// Raised when a queue is activated in this process.
    pub wakes: BTreeMap<String, Arc<Notify>>,
    /// The readiness health of each provider that serves a queue.
    pub health: BTreeMap<String, Arc<ProviderHealth>>,
    /// The bridge, background and reconciliation tasks.
    pub tasks: Vec<JoinHandle<()>>,
}

/// The external queues of `config` with their provider names.
pub fn external_queues(config: &Config) -> Vec<(String, String)> {
    config
        .queues
        .iter()
        .filter(|(_, q)| q.storage == QueueStorage::External)
        .filter_map(|(name, q)| Some((name.clone(), q.provider.clone()?)))
        .collect()
}

/// Prepare and start every provider that serves a queue (registering
/// `external_queue_readiness_{provider}` for every provider) and the reconciliation pass.
/// Fails, naming the provider, when the broker refuses a declaration; a broker that does not
/// answer yet leaves its health check red until it does.
pub async fn start(
    config: &Config,
    providers: &Providers,
    activations: Arc<dyn ActivationStore>,
    health: &HealthRegistry,
    shutdown: &CancellationToken,
) -> Result<ExternalRuntime, (String, ProviderError)> {
    // Queues with a handler are consumed; the others only hold what is published to them.
    let (queues, held): (Vec<_>, Vec<_>) = external_queues(config)
        .into_iter()
        .partition(|(q, _)| config.queues[q].handler.is_some());
    let wakes: BTreeMap<String, Arc<Notify>> = queues
        .iter()
        .map(|(q, _)| (q.clone(), Arc::new(Notify::new())))
        .collect();
    let wake_map = wakes.clone();
    let wake: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(move |queue: &str| {
        if let Some(n) = wake_map.get(queue) {
            n.notify_one();
        }
    });
    let mut tasks = Vec::new();
    let mut states = BTreeMap::new();
    for (name, provider) in providers.iter() {
        let check = format!("external_queue_readiness_{name}");
        let of_provider = |queues: &[(String, String)]| -> Vec<String> {
            queues
                .iter()
                .filter(|(_, p)| p == name)
                .map(|(q, _)| q.clone())
                .collect()
        };
        let (mine, sinks) = (of_provider(&queues), of_provider(&held));
        let failed = |e| (name.clone(), e);
        let all: Vec<String> = mine.iter().chain(&sinks).cloned().collect();
        if mine.is_empty() {
            let idle = if sinks.is_empty() {
                ProviderHealth::idle(name)
            } else {
                ProviderHealth::holding(name)
            };
            health.register(check, Arc::new(idle));
            if !sinks.is_empty() {
                // Declared so that publications have somewhere to go; a broker that does not
                // answer yet is declared by the first publication.
                match provider.prepare(&sinks).await {
                    Ok(()) => {}
                    Err(e) if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Timeout) => {
                        tracing::info!(provider = %name, "the broker does not answer yet: {e}");
                    }
                    Err(e) => return Err(failed(e)),
                }
                tasks.extend(provider.background(&sinks, shutdown.clone()));
            }
            continue;
        }
        // A declaration the broker refuses stops start-up; a broker that does not answer yet
        // is prepared by the bridge task once it does.
        let prepared = match provider.prepare(&all).await {
            Ok(()) => true,
            Err(e) if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Timeout) => {
                tracing::info!(provider = %name, "the broker does not answer yet; its queues start when it does: {e}");
                false
            }
            Err(e) => return Err(failed(e)),
        };
        let bridge = provider.readiness(&mine).await.map_err(failed)?;
        let state = Arc::new(ProviderHealth::not_started(name));
        health.register(check, state.clone());
        states.insert(name.clone(), state.clone());
        tasks.push(tokio::spawn(run_bridge(
            (!prepared).then(|| provider.clone()),
            bridge,
            mine.clone(),
            activations.clone(),
            state.clone(),
            wake.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(run_probe(
            provider.clone(),
            mine.clone(),
            state,
            config.external.probe_interval,
            shutdown.clone(),
        )));
        tasks.extend(provider.background(&all, shutdown.clone()));
    }
    let reconciled: Vec<ReconciledQueue> = queues
        .iter()
        .filter_map(|(q, p)| {
            Some(ReconciledQueue {
                queue: q.clone(),
                provider: p.clone(),
                broker: providers.get(p)?.clone(),
            })
        })
        .collect();
    if !reconciled.is_empty() {
        tasks.push(tokio::spawn(run_reconciliation(
            reconciled,
            activations,
            config.external.reconcile_interval,
            wake,
            shutdown.clone(),
        )));
    }
    Ok(ExternalRuntime {
        wakes,
        health: states,
        tasks,
    })
}

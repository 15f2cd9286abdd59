//! Assembling a running host from a configuration: the store, the handler registry and its
//! watcher, the admin server, the providers, the settlement task and each queue's pipelines
//! ([`queues`]) — and taking them down in order on shutdown.

mod queues;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, HealthCheck, HealthRegistry};
use crate::config::{Config, HandlersSource};
use crate::dispatch::Settler;
use crate::enqueue::{QueueRouter, Relay};
use crate::external::{
    self, ActivationStore, AttemptCounter, ExternalRuntime, Providers, SqlActivations, SqlAttempts,
};
use crate::inbox::InboxStores;
use crate::queue::{self, QueueStore};
use crate::runtime::store_deploy::StoreDeploys;
use crate::runtime::{HandlerRegistry, deploy};
use crate::schedule::{self, Schedules};
use queues::QueueWiring;

/// A started host. Dropping it does not stop it: call [`RunningHost::shutdown`].
pub struct RunningHost {
    /// The admin server's bound address.
    pub admin_addr: SocketAddr,
    /// The deployed handlers.
    pub registry: Arc<HandlerRegistry>,
    /// The queue store.
    pub store: Arc<dyn QueueStore>,
    /// The host's enqueue path.
    pub router: Arc<QueueRouter>,
    /// Named health checks.
    pub health: Arc<HealthRegistry>,
    shutdown: CancellationToken,
    providers: Providers,
    workers: Vec<tokio::task::JoinHandle<()>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    settler_task: tokio::task::JoinHandle<()>,
    /// Stops the admin server, after the drain.
    admin_stop: CancellationToken,
    admin_task: JoinHandle<()>,
}

struct StoreHealth(Arc<dyn QueueStore>);

#[async_trait]
impl HealthCheck for StoreHealth {
    async fn check(&self) -> Result<String, String> {
        self.0
            .ping()
            .await
            .map(|_| "answering".to_string())
            .map_err(|e| e.to_string())
    }
}

/// Red while follow-ups for some external queue cannot be published from the outbox.
struct OutboxHealth(Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>);

#[async_trait]
impl HealthCheck for OutboxHealth {
    async fn check(&self) -> Result<String, String> {
        let failing = self.0.lock().expect("relay state");
        match failing.iter().next() {
            None => Ok("publishing".to_string()),
            Some((queue, error)) => Err(format!(
                "follow-ups for queue `{queue}` wait in the outbox ({} queue(s) failing): {error}",
                failing.len()
            )),
        }
    }
}

/// Replacements for parts a host would otherwise build from its configuration (for tests and
/// embedding applications).
#[derive(Default, Clone)]
pub struct StartOptions {
    /// Use this inbox store for every queue that enables the inbox.
    pub inbox_store: Option<Arc<dyn crate::inbox::InboxStore>>,
}

/// Start a host for `config`.
pub async fn start(config: Config) -> anyhow::Result<RunningHost> {
    start_with(config, StartOptions::default()).await
}

/// Read the configuration at `path` and check it as a host does before starting: the file
/// itself ([`Config::load`]), then every provider section and what each queue asks of its
/// provider ([`external::check_config`]).
pub fn load_config(path: &std::path::Path) -> Result<Config, crate::config::ConfigError> {
    let config = Config::load(path)?;
    external::check_config(&config, path)?;
    Ok(config)
}

/// Start a host for `config` with some parts replaced.
///
/// The start-up is boxed here, so its code (and everything the host spawns) is compiled once,
/// in this crate: an optimised build does not share an async function's code with the crates
/// that await it, so every test and benchmark binary compiled the whole host again.
#[inline(never)]
pub fn start_with(
    config: Config,
    options: StartOptions,
) -> BoxFuture<'static, anyhow::Result<RunningHost>> {
    Box::pin(assemble(config, options))
}

async fn assemble(config: Config, options: StartOptions) -> anyhow::Result<RunningHost> {
    external::check_config(&config, &config.source)?;
    if let Some(reason) = config.admin.refusal(config.host.admin_listen) {
        anyhow::bail!("{}: admin.token: {reason}", config.source.display());
    }
    let config = Arc::new(config);
    crate::metrics::install();
    let store = open_store(&config).await?;
    let dir = &config.host.handlers_dir;
    let shutdown = CancellationToken::new();
    let mut background = Vec::new();
    let (registry, initial_load) = start_handlers(&config, &store, &shutdown, &mut background)?;

    let health = Arc::new(HealthRegistry::default());
    health.register("sql_storage", Arc::new(StoreHealth(store.clone())));
    let admin_state = admin::AppState {
        health: health.clone(),
        registry: registry.clone(),
        store: store.clone(),
        config: config.clone(),
        router: Arc::default(),
        stopping: shutdown.clone(),
    };
    let admin_router = admin_state.router.clone();
    let admin_stop = CancellationToken::new();
    let (admin_addr, admin_task) =
        admin::serve(config.host.admin_listen, admin_state, admin_stop.clone())
            .await
            .with_context(|| {
                format!(
                    "binding the admin server to {} (host.admin_listen)",
                    config.host.admin_listen
                )
            })?;
    tracing::info!(%admin_addr, "admin server listening");

    let inboxes = InboxStores::open(&config)
        .await
        .context("opening the consumer inbox stores")?;
    let (providers, activations, attempts, external_runtime) =
        open_external(&config, &health, &shutdown, &mut background).await?;
    let router = Arc::new(QueueRouter::new(store.clone(), &config, &providers));
    let _ = admin_router.set(router.clone());
    let sampled = sampled(&config, &store, &providers, &health);
    background.push(tokio::spawn(crate::metrics::run_sampler(
        sampled,
        config.host.metrics_interval,
        shutdown.clone(),
    )));
    let wake_router = router.clone();
    if let Some(listener) = store.listen(
        Arc::new(move |queue| wake_router.wake(queue)),
        shutdown.clone(),
    ) {
        background.push(listener);
    }
    // Only external queues have follow-ups in the outbox, and only a host that has the queue
    // can publish them.
    if !external::external_queues(&config).is_empty() {
        let relay = Relay::new(store.clone(), router.clone());
        health.register("outbox", Arc::new(OutboxHealth(relay.failing())));
        background.push(tokio::spawn(relay.run(shutdown.clone())));
    }
    let host_id = config.host.host_id();
    let started_at_ms = crate::clock::now_ms();
    let others_alive = schedule::hosts::register(&store, &host_id, started_at_ms)
        .await
        .context("registering this host in the queue storage")?;
    tracing::info!(host = %host_id, "host id");
    background.push(schedule::hosts::beat(
        store.clone(),
        host_id.clone(),
        started_at_ms,
        shutdown.clone(),
    ));
    background.extend(
        Schedules {
            store: store.clone(),
            router: router.clone(),
            host: host_id,
            started_at_ms,
            others_alive,
        }
        .start(&config.schedules, &shutdown),
    );
    let (settler, settler_task) = Settler::start(store.clone());
    let mut wiring = QueueWiring {
        config: &config,
        registry: &registry,
        router: &router,
        store: &store,
        settler: &settler,
        providers: &providers,
        activations: &activations,
        attempts: &attempts,
        external: &external_runtime,
        inboxes: &inboxes,
        inbox_override: options.inbox_store.clone(),
        shutdown: &shutdown,
        cleaned: Default::default(),
    };
    let mut workers = Vec::new();
    for (name, queue_config) in &config.queues {
        workers.extend(wiring.start(name, queue_config, &mut background).await?);
    }
    drop(settler);
    let loaded = initial_load.await.unwrap_or(0);
    let from_store = config.host.handlers_source == HandlersSource::Store;
    if from_store {
        tracing::info!(handlers = loaded, "initial handlers loaded from the store");
    } else {
        tracing::info!(dir = %dir.display(), handlers = loaded, "initial handlers loaded");
    }
    for (queue, q) in &config.queues {
        if let Some(handler) = q.handler()
            && registry.get(handler).is_none()
        {
            if from_store {
                tracing::warn!(queue = %queue, "handler `{handler}` is not deployed yet: deploy it with `wharf handlers deploy FILE --name {handler}`");
            } else {
                tracing::warn!(queue = %queue, "handler `{handler}` is not deployed yet (expected {})", dir.join(format!("{handler}.wasm")).display());
            }
        }
    }
    tracing::info!(queues = config.queues.len(), "host started");
    Ok(RunningHost {
        admin_addr,
        registry,
        store,
        router,
        health,
        shutdown,
        providers,
        workers,
        background,
        settler_task,
        admin_stop,
        admin_task,
    })
}

/// Open the queue store `[storage]` names.
async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn QueueStore>> {
    queue::open(
        &config.storage.url,
        config.storage.schema.as_deref(),
        config.storage.max_connections,
    )
    .await
    .with_context(|| {
        format!(
            "opening the queue storage at {}",
            crate::config::redacted_url(&config.storage.url)
        )
    })
}

/// The handler registry, and the initial load of the handlers directory (or of the current
/// versions in the store), which compiles while the rest starts: the admin server answers and
/// each queue runs as soon as its handler is ready, not after the slowest compile. The task
/// returns how many handlers it loaded. The directory's watcher, or the store's follower,
/// goes to `background`.
fn start_handlers(
    config: &Arc<Config>,
    store: &Arc<dyn QueueStore>,
    shutdown: &CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(Arc<HandlerRegistry>, JoinHandle<usize>)> {
    let registry = Arc::new(
        HandlerRegistry::new(config.clone())
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .context("creating the WebAssembly engine")?,
    );
    registry.set_loading(true);
    if config.host.handlers_source == HandlersSource::Store {
        let deploys = Arc::new(StoreDeploys::new(
            registry.clone(),
            store.clone(),
            config.host.host_id(),
        ));
        let (synced, first_sync) = tokio::sync::oneshot::channel();
        let initial_load = tokio::spawn({
            let (registry, deploys) = (registry.clone(), deploys.clone());
            async move {
                let loaded = deploys.sync().await;
                registry.set_loading(false);
                let _ = synced.send(());
                loaded
            }
        });
        // Following starts once the first sync is done, and ends with the host.
        let shutdown = shutdown.clone();
        background.push(tokio::spawn(async move {
            if first_sync.await.is_ok() {
                let _ = deploys.follow(shutdown).await;
            }
        }));
        return Ok((registry, initial_load));
    }
    let dir = &config.host.handlers_dir;
    let files = deploy::handler_files(dir)
        .with_context(|| format!("reading the handlers directory {}", dir.display()))?;
    let initial_load = tokio::spawn({
        let registry = registry.clone();
        async move {
            let loaded = deploy::load(&registry, files).await;
            registry.set_loading(false);
            loaded
        }
    });
    background.push(
        deploy::watch(
            registry.clone(),
            dir.clone(),
            config.host.deploy_debounce,
            shutdown.clone(),
        )
        .with_context(|| format!("watching the handlers directory {}", dir.display()))?,
    );
    Ok((registry, initial_load))
}

/// The providers, the activation store and delivery counts in the `[storage]` database, and
/// the external runtime (readiness bridges, probes, reconciliation); their background tasks go
/// to `background`.
async fn open_external(
    config: &Arc<Config>,
    health: &Arc<HealthRegistry>,
    shutdown: &CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(
    Providers,
    Arc<dyn ActivationStore>,
    Arc<dyn AttemptCounter>,
    ExternalRuntime,
)> {
    let providers = Providers::open(config).await.map_err(|(name, e)| {
        anyhow::anyhow!("opening provider `{name}` ([providers.{name}]): {e}")
    })?;
    let sql_activations =
        SqlActivations::open(&config.storage.url, config.storage.schema.as_deref())
            .await
            .context("opening the activation store (external_activations)")?;
    let attempts: Arc<dyn AttemptCounter> = Arc::new(SqlAttempts::beside(&sql_activations));
    let activations: Arc<dyn ActivationStore> = Arc::new(sql_activations);
    if !external::external_queues(config).is_empty() {
        // Counts of messages settled elsewhere (or gone) are kept a week, then deleted.
        background.push(tokio::spawn(external::run_purge(
            attempts.clone(),
            std::time::Duration::from_secs(7 * 24 * 3600),
            std::time::Duration::from_secs(3600),
            shutdown.clone(),
        )));
    }
    let mut external_runtime =
        external::start(config, &providers, activations.clone(), health, shutdown)
            .await
            .map_err(|(name, e)| {
                anyhow::anyhow!("preparing provider `{name}` ([providers.{name}]): {e}")
            })?;
    background.append(&mut external_runtime.tasks);
    Ok((providers, activations, attempts, external_runtime))
}

/// What the metrics sampler reads: the store, and each queue with its provider if external.
fn sampled(
    config: &Config,
    store: &Arc<dyn QueueStore>,
    providers: &Providers,
    health: &Arc<HealthRegistry>,
) -> crate::metrics::Sampled {
    crate::metrics::Sampled {
        store: store.clone(),
        queues: config
            .queues
            .keys()
            .map(|name| {
                let external = external::external_queues(config)
                    .into_iter()
                    .find(|(queue, _)| queue == name)
                    .and_then(|(_, provider)| {
                        let opened = providers.get(&provider)?.clone();
                        Some((provider, opened))
                    });
                (name.clone(), external)
            })
            .collect(),
        health: health.clone(),
    }
}

impl RunningHost {
    /// A token that stops the host when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stop leasing, let in-flight messages finish within the grace period, release the
    /// rest, then stop the watcher and the admin server.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.wait().await;
    }

    /// Wait until the host has stopped (after its shutdown token was cancelled).
    /// (Boxed here for the reason [`start_with`] is.)
    #[inline(never)]
    pub fn wait(self) -> BoxFuture<'static, ()> {
        Box::pin(self.stop())
    }

    async fn stop(self) {
        self.shutdown.cancelled().await;
        for worker in self.workers {
            let _ = worker.await;
        }
        let _ = self.settler_task.await;
        for task in self.background {
            let _ = task.await;
        }
        // `/readyz` has answered `stopping` since the signal; the admin server goes last.
        self.admin_stop.cancel();
        let _ = self.admin_task.await;
        self.providers.close().await;
        tracing::info!("host stopped");
    }
}

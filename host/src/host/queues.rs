//! One queue's wiring ([`QueueWiring::start`]): its consumer-inbox binding (with one cleanup
//! task per inbox endpoint), one set of handler-call slots and one rate limit shared by all
//! its sources, and a pipeline per source — the SQL queue always, the broker too for an
//! external queue.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, InboxStoreKind, QueueConfig};
use crate::dispatch::{
    Budget, ExternalParts, ExternalSource, InboxBinding, Pipeline, RateLimit, Recorder, Settler,
    SqlSource,
};
use crate::enqueue::{ExternalRoute, QueueRouter};
use crate::external::{
    ActivationStore, AttemptCounter, ConsumerSettings, ExternalRuntime, Providers,
};
use crate::inbox::{self, InboxStore, InboxStores};
use crate::queue::QueueStore;
use crate::rate_limit::LocalBudget;
use crate::runtime::HandlerRegistry;

/// What every queue's pipelines are built from.
pub(super) struct QueueWiring<'a> {
    pub config: &'a Config,
    pub registry: &'a Arc<HandlerRegistry>,
    pub router: &'a Arc<QueueRouter>,
    pub store: &'a Arc<dyn QueueStore>,
    pub settler: &'a Settler,
    pub providers: &'a Providers,
    pub activations: &'a Arc<dyn ActivationStore>,
    pub attempts: &'a Arc<dyn AttemptCounter>,
    pub external: &'a ExternalRuntime,
    pub inboxes: &'a InboxStores,
    /// Replaces every configured inbox store (tests, embedding applications).
    pub inbox_override: Option<Arc<dyn InboxStore>>,
    pub shutdown: &'a CancellationToken,
    /// Inbox endpoints that have their cleanup task already.
    pub cleaned: HashSet<(InboxStoreKind, String)>,
}

impl QueueWiring<'_> {
    /// Start the pipelines of queue `name` (none for a queue without a handler: it only holds
    /// what is enqueued into it). Returns the pipelines' tasks; background tasks (inbox
    /// cleanup) go to `background`.
    pub async fn start(
        &mut self,
        name: &str,
        queue: &QueueConfig,
        background: &mut Vec<JoinHandle<()>>,
    ) -> anyhow::Result<Vec<JoinHandle<()>>> {
        let Some(handler) = queue.handler() else {
            return Ok(Vec::new());
        };
        let inbox = self.inbox(name, queue, background);
        // One set of handler-call slots for the queue, whatever source a message came from.
        let slots = Pipeline::slots_for(queue);
        let committer = Pipeline::committer_for(self.store.clone());
        let external = ExternalRoute::of(queue, self.providers);
        let rate_limit = self.rate_limit(name, queue, external.is_some());
        let pipeline = |inbox: Option<InboxBinding>| Pipeline {
            name: Arc::from(name),
            config: queue.clone(),
            handler: Arc::from(handler),
            registry: self.registry.clone(),
            enqueuer: self.router.clone(),
            state: self.store.clone(),
            committer: committer.clone(),
            inbox,
            slots: slots.clone(),
            rate_limit: rate_limit.clone(),
        };
        let grace = self.config.host.shutdown_grace;
        let mut tasks = Vec::new();
        if let Some(route) = &external {
            let source = self.broker_source(name, queue, route).await?;
            let run = pipeline(inbox.clone()).run(source, self.shutdown.clone(), grace);
            tasks.push(tokio::spawn(run));
        }
        let source = SqlSource {
            name: Arc::from(name),
            config: queue.clone(),
            store: self.store.clone(),
            settler: self.settler.clone(),
            wake: self.sql_wake(name),
            poll_interval: self.config.storage.poll_interval,
            publish_to: external.map(|r| (r.name, r.provider, r.options)),
        };
        let run = pipeline(inbox).run(source, self.shutdown.clone(), grace);
        tasks.push(tokio::spawn(run));
        Ok(tasks)
    }

    /// The queue's consumer-inbox binding, if it has one; the first queue of each inbox
    /// endpoint starts its cleanup.
    fn inbox(
        &mut self,
        name: &str,
        queue: &QueueConfig,
        background: &mut Vec<JoinHandle<()>>,
    ) -> Option<InboxBinding> {
        let settings = queue.inbox.as_ref()?;
        let store = self.inbox_override.clone().unwrap_or_else(|| {
            self.inboxes
                .get(settings.store)
                .expect("every selected inbox store is opened")
        });
        let endpoint = queue.endpoint.clone().unwrap_or_else(|| name.to_string());
        if self.cleaned.insert((settings.store, endpoint.clone())) {
            background.push(tokio::spawn(inbox::run_cleanup(
                store.clone(),
                endpoint.clone(),
                settings.retention,
                settings.cleanup_interval,
                self.shutdown.clone(),
            )));
        }
        let recorder = Recorder::start(store.clone(), settings.retention.as_millis() as i64);
        Some(InboxBinding {
            queue_table: store.queue_database_table(),
            store,
            recorder,
            endpoint,
            retention: settings.retention,
        })
    }

    /// The queue's rate limit, if it has one: a SQL queue's budget in the store (one for
    /// every host), an external queue's in this host (one for both its sources).
    fn rate_limit(
        &self,
        name: &str,
        queue: &QueueConfig,
        external: bool,
    ) -> Option<Arc<RateLimit>> {
        let limit = queue.limit()?;
        let budget = if external {
            Budget::Local(LocalBudget::new(limit, crate::clock::now_us()))
        } else {
            Budget::Shared {
                store: self.store.clone(),
                limit,
            }
        };
        Some(RateLimit::new(
            Arc::from(name),
            budget,
            self.shutdown.clone(),
        ))
    }

    /// The signal that wakes the queue's SQL processors in this process.
    fn sql_wake(&self, name: &str) -> Arc<tokio::sync::Notify> {
        self.router
            .wake_signal(name)
            .expect("every configured queue has a wake signal")
    }

    /// The broker side of an external queue: its consumer, as a pipeline source.
    async fn broker_source(
        &self,
        name: &str,
        queue: &QueueConfig,
        route: &ExternalRoute,
    ) -> anyhow::Result<ExternalSource> {
        let settings = ConsumerSettings {
            prefetch: queue.concurrency,
            lease: queue.lease,
        };
        let consumer = route.provider.consumer(name, settings).await.map_err(|e| {
            anyhow::anyhow!(
                "opening the consumer of queue `{name}` on provider `{}` ([providers.{}]): {e}",
                route.name,
                route.name
            )
        })?;
        Ok(ExternalSource::new(ExternalParts {
            name: Arc::from(name),
            provider: route.name.clone(),
            kind: route.provider.kind(),
            counts: route.provider.capabilities().delivery_count,
            config: queue.clone(),
            consumer,
            activations: self.activations.clone(),
            attempts: self.attempts.clone(),
            sql: self.store.clone(),
            sql_wake: self.sql_wake(name),
            wake: self.external.wakes[name].clone(),
            poll_interval: self.config.storage.poll_interval,
            health: self.external.health[&route.name].clone(),
        }))
    }
}

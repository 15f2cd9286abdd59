//! The host's enqueue path, shared by the CLI and the guest `enqueue` import: checks the
//! target queue and the payload, routes the message to the queue's storage, and wakes the
//! queue's processors in this process. For an external queue, the provider's capabilities
//! decide: a future-dated message goes to a provider with native delay as is, and otherwise
//! waits in the SQL queue until due, when the host publishes it into the broker.

mod group;
mod import;
mod relay;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

pub use import::{ImportError, Pointers, parse_lines};
pub use relay::Relay;

use crate::config::{Config, QueueStorage};
use crate::external::{Envelope, Provider, Providers, PublishOptions};
use crate::headers::DEFERRED_PUBLISH as DEFERRED_PUBLISH_HEADER;
pub use crate::runtime::{EnqueueError, Enqueuer, Staged};

use crate::queue::limits;
use crate::queue::{Enqueued, FollowUp, NewMessage, OutboxEntry, QueueStore, now_ms};

/// Most envelopes per publish call to a provider.
const PUBLISH_BATCH: usize = 500;

/// Most payload bytes per publish call (a single larger message goes alone).
const PUBLISH_BYTES: usize = 8 << 20;

/// Where one message of a batch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The SQL queue.
    Store,
    /// The SQL queue, sleeping until due, then published by the host (external queue whose
    /// provider has no native delay).
    StoreThenPublish,
    /// The external provider, delayed until `due` when set.
    Provider { due: Option<i64> },
}

/// Routes messages to the storage of each configured queue.
pub struct QueueRouter {
    store: Arc<dyn QueueStore>,
    queues: BTreeMap<String, Route>,
}

struct Route {
    wake: Arc<Notify>,
    idempotent: bool,
    max_payload: u64,
    /// Whether the queue keeps sessions; without, a message's session key is dropped.
    sessions: bool,
    /// For `storage = "external"`: the provider holding its pending messages.
    external: Option<ExternalRoute>,
    /// Single enqueues into the SQL queue, written together.
    group: Arc<group::Group>,
}

/// Where an external queue's pending messages go.
#[derive(Clone)]
pub struct ExternalRoute {
    /// The `[providers.NAME]` name.
    pub name: String,
    /// The provider.
    pub provider: Arc<dyn Provider>,
    /// How the queue publishes (idempotency and id replacement where the provider can).
    pub options: PublishOptions,
}

impl ExternalRoute {
    /// The route of queue `q` of `config`, when it is external and its provider is open.
    pub fn of(config: &crate::config::QueueConfig, providers: &Providers) -> Option<Self> {
        if config.storage != QueueStorage::External {
            return None;
        }
        let name = config.provider.clone()?;
        let provider = providers.get(&name)?.clone();
        let caps = provider.capabilities();
        let options = PublishOptions {
            due_at_ms: None,
            idempotent: config.idempotent && caps.idempotency,
            replace_by_id: config.replace_by_id.unwrap_or(caps.id_replacement)
                && caps.id_replacement,
        };
        Some(ExternalRoute {
            name,
            provider,
            options,
        })
    }
}

impl QueueRouter {
    /// A router for the queues of `config`, storing into `store`, or into the provider of
    /// an external queue (from `providers`, opened for `config`).
    pub fn new(store: Arc<dyn QueueStore>, config: &Config, providers: &Providers) -> Self {
        let queues = config
            .queues
            .iter()
            .map(|(name, q)| {
                let wake = Arc::new(Notify::new());
                let group = group::Group::new(name, store.clone(), q.idempotent, wake.clone());
                (
                    name.clone(),
                    Route {
                        wake,
                        idempotent: q.idempotent,
                        max_payload: q.max_payload.as_u64(),
                        sessions: q.sessions,
                        external: ExternalRoute::of(q, providers),
                        group: Arc::new(group),
                    },
                )
            })
            .collect();
        QueueRouter { store, queues }
    }

    /// The signal raised when a message of `queue` becomes ready.
    pub fn wake_signal(&self, queue: &str) -> Option<Arc<Notify>> {
        self.queues.get(queue).map(|r| r.wake.clone())
    }

    /// Wake the processors of `queue` (of every queue for `None`).
    pub fn wake(&self, queue: Option<&str>) {
        match queue {
            Some(q) => {
                if let Some(route) = self.queues.get(q) {
                    route.wake.notify_one();
                }
            }
            None => self.queues.values().for_each(|r| r.wake.notify_one()),
        }
    }

    /// Whether `message` is within the limits of `queue` (id length, `max_payload`, no NUL in
    /// its id or headers).
    pub fn check_limits(&self, queue: &str, message: &NewMessage) -> Result<(), EnqueueError> {
        let route = self.route(queue)?;
        limits::check(
            queue,
            message.id.as_deref(),
            &message.payload,
            route.max_payload,
        )
        .and_then(|()| limits::check_headers(&message.headers))
        .map_err(|limit| EnqueueError::Limit {
            queue: queue.to_string(),
            limit,
        })
    }

    fn route(&self, queue: &str) -> Result<&Route, EnqueueError> {
        self.queues
            .get(queue)
            .ok_or_else(|| EnqueueError::UnknownQueue {
                queue: queue.to_string(),
                known: self.queues.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// Where the pending messages of external queue `queue` go (`None` for a SQL queue or an
    /// unknown one).
    pub fn external_route(&self, queue: &str) -> Option<&ExternalRoute> {
        self.queues.get(queue)?.external.as_ref()
    }

    /// Record the sending of `message` by a producer outside any handler (the CLI) and write
    /// its trace context into its headers (a `traceparent` it already has is the parent).
    /// Nothing when traces are off.
    pub fn trace_send(&self, queue: &str, message: &mut NewMessage) {
        if crate::telemetry::enabled() {
            let to = crate::telemetry::Destination {
                queue,
                system: self.system(queue),
            };
            crate::telemetry::send(to, message.id.as_deref(), None, &mut message.headers);
        }
    }

    /// The store behind the queues.
    pub fn store(&self) -> &Arc<dyn QueueStore> {
        &self.store
    }
}

impl QueueRouter {
    /// Whether `message` can be enqueued into `queue`: limits, and JSON payload.
    fn check(&self, queue: &str, message: &NewMessage) -> Result<(), EnqueueError> {
        self.check_limits(queue, message)?;
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&message.payload) {
            return Err(EnqueueError::InvalidPayload {
                queue: queue.to_string(),
                reason: e.to_string(),
            });
        }
        Ok(())
    }

    /// Where `message` goes. External queues keep pending messages in their provider; a
    /// custom status is not pending, so it goes to the SQL queue like every other
    /// non-pending state.
    fn target(route: &Route, message: &NewMessage, now: i64) -> Target {
        let Some(external) = route.external.as_ref().filter(|_| message.status.is_none()) else {
            return Target::Store;
        };
        let due = message.process_at_ms.filter(|at| *at > now);
        if due.is_some() && message.session.is_some() {
            // Its session waits for it (it holds the session until due), so it waits in the
            // SQL queue and runs from there; later messages of the session queue up behind it.
            return Target::Store;
        }
        if due.is_none() || external.provider.capabilities().delay {
            Target::Provider { due }
        } else {
            Target::StoreThenPublish
        }
    }

    /// Enqueue a run of messages that share their target.
    async fn enqueue_run(
        &self,
        queue: &str,
        route: &Route,
        target: Target,
        mut run: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>, EnqueueError> {
        let external = route.external.as_ref();
        match (target, external) {
            (Target::Provider { due }, Some(external)) => {
                let options = PublishOptions {
                    due_at_ms: due,
                    ..external.options
                };
                let envelopes: Vec<Envelope> = run
                    .into_iter()
                    .map(|m| {
                        Envelope {
                            session: m.session,
                            ..Envelope::new(m.payload, m.id, m.priority)
                        }
                        .traced(&m.headers)
                    })
                    .collect();
                let mut results = Vec::with_capacity(envelopes.len());
                for part in
                    crate::queue::enqueue::cut(&envelopes, PUBLISH_BATCH, PUBLISH_BYTES, |e| {
                        e.message_json.len()
                    })
                {
                    let statuses = external
                        .provider
                        .publish(queue, part, options)
                        .await
                        .map_err(|e| EnqueueError::External {
                            queue: queue.to_string(),
                            reason: format!("provider `{}`: {e}", external.name),
                        })?;
                    if statuses.len() != part.len() {
                        return Err(EnqueueError::External {
                            queue: queue.to_string(),
                            reason: format!(
                                "provider `{}` answered {} statuses for {} messages",
                                external.name,
                                statuses.len(),
                                part.len()
                            ),
                        });
                    }
                    results.extend(
                        statuses
                            .into_iter()
                            .map(|status| Enqueued { key: 0, status }),
                    );
                }
                Ok(results)
            }
            (Target::StoreThenPublish, Some(external)) => {
                // No native delay: kept (sleeping) in the SQL queue, published when due.
                for message in &mut run {
                    message
                        .headers
                        .push((DEFERRED_PUBLISH_HEADER.to_string(), external.name.clone()));
                }
                Ok(self
                    .store
                    .enqueue_many(queue, run, route.idempotent)
                    .await?)
            }
            _ => {
                let done = self.store.enqueue_many(queue, run, route.idempotent).await;
                // On a failure, transactions before it may have committed: wake anyway (a
                // processor that finds nothing waits again).
                if done.as_ref().map_or(true, |done| {
                    done.iter()
                        .any(|d| d.status != crate::queue::EnqueueStatus::Discarded)
                }) {
                    route.wake.notify_one();
                }
                Ok(done?)
            }
        }
    }
}

#[async_trait]
impl Enqueuer for QueueRouter {
    /// Every follow-up is staged: into the SQL store, or (for an external queue's broker) into
    /// the outbox, published after the commit.
    fn stage(&self, queue: &str, mut message: NewMessage) -> Result<Staged, EnqueueError> {
        let route = self.route(queue)?;
        if !route.sessions {
            message.session = None;
        }
        let target = Self::target(route, &message, now_ms());
        self.check(queue, &message)?;
        let mut outbox = None;
        match (target, &route.external) {
            (Target::StoreThenPublish, Some(external)) => message
                .headers
                .push((DEFERRED_PUBLISH_HEADER.to_string(), external.name.clone())),
            (Target::Provider { due }, Some(external)) => {
                outbox = Some(OutboxEntry {
                    provider: external.name.clone(),
                    message_id: message.id.clone(),
                    due_at_ms: due,
                })
            }
            _ => {}
        }
        Ok(Staged::Store(FollowUp {
            queue: queue.to_string(),
            message,
            idempotent: route.idempotent,
            outbox,
        }))
    }

    fn ready(&self, queue: &str) {
        self.wake(Some(queue));
    }

    fn system(&self, queue: &str) -> &'static str {
        match self.external_route(queue) {
            Some(route) => route.provider.kind(),
            None => crate::telemetry::SQL_SYSTEM,
        }
    }

    /// A message for the SQL queue joins the queue's group commit: enqueues made at the same
    /// time (handlers' follow-ups) are written together.
    async fn enqueue(
        &self,
        queue: &str,
        mut message: NewMessage,
    ) -> Result<Enqueued, EnqueueError> {
        let route = self.route(queue)?;
        if !route.sessions {
            message.session = None;
        }
        if Self::target(route, &message, now_ms()) == Target::Store {
            self.check(queue, &message)?;
            return route.group.enqueue(message).await;
        }
        self.enqueue_many(queue, vec![message])
            .await?
            .pop()
            .ok_or_else(|| EnqueueError::External {
                queue: queue.to_string(),
                reason: "the enqueue returned no result".into(),
            })
    }

    /// The whole batch is checked first: a message beyond a limit or with a payload that is
    /// not JSON stops it before anything is enqueued.
    async fn enqueue_many(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>, EnqueueError> {
        let route = self.route(queue)?;
        for message in &messages {
            self.check(queue, message)?;
        }
        let now = now_ms();
        let mut results = Vec::with_capacity(messages.len());
        // Consecutive messages with one target go together, so the batch order holds.
        let mut run: Vec<NewMessage> = Vec::new();
        let mut run_target = Target::Store;
        for mut message in messages {
            if !route.sessions {
                message.session = None;
            }
            let target = Self::target(route, &message, now);
            if target != run_target && !run.is_empty() {
                let part = std::mem::take(&mut run);
                results.extend(self.enqueue_run(queue, route, run_target, part).await?);
            }
            run_target = target;
            run.push(message);
        }
        if !run.is_empty() {
            results.extend(self.enqueue_run(queue, route, run_target, run).await?);
        }
        Ok(results)
    }
}

//! An external queue as a source of the pipeline. Deliveries come from the provider's
//! consumer when the queue was activated (or the broker pushed them); the attempt is the
//! broker's delivery count, or the host's durable count where the broker only flags a
//! redelivery. Success acknowledges the broker message without touching SQL; every other
//! outcome (retry later, transient failure, failure, a body that is not an envelope, a
//! message that came back with no attempts left) first moves the message into the SQL queue
//! of the same name — with its envelope, provider, MessageId and attempt count — and only
//! then acknowledges it. A failed move hands the message back to the broker explicitly.
//! In a queue with sessions, the messages of a session pass one at a time ([`sessions`]).

mod acker;
mod move_to_sql;
mod receive;
mod sessions;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use self::acker::start_acker;
use crate::config::QueueConfig;
use crate::dispatch::{InboxBinding, Settled, Source, Verdict, Work};
use crate::external::{
    ActivationStore, AttemptCounter, Consumer, CountKind, DeliveryCount, Envelope, Handle, Nack,
    ProviderHealth, counting_key,
};
use crate::queue::{Disposition, QueueStore, Status, now_ms};

/// One received broker message while it is processed.
pub struct Item {
    handle: Handle,
    body: bytes::Bytes,
    envelope: Option<Envelope>,
    /// The key the host counts this message's deliveries under.
    key: String,
    /// Whether the host counted this delivery (its count is forgotten on settlement).
    counted: bool,
    /// Whether handing it back forgives one count (the broker flags or counts nothing, so
    /// the next delivery would be counted as an attempt).
    forgive: bool,
    /// Its session key, in a queue with sessions.
    session: Option<String>,
}

/// One external queue.
pub struct ExternalSource {
    name: Arc<str>,
    provider: String,
    kind: &'static str,
    counts: CountKind,
    config: QueueConfig,
    consumer: Arc<dyn Consumer>,
    activations: Arc<dyn ActivationStore>,
    attempts: Arc<dyn AttemptCounter>,
    sql: Arc<dyn QueueStore>,
    sql_wake: Arc<Notify>,
    wake: Arc<Notify>,
    poll_interval: Duration,
    health: Arc<ProviderHealth>,
    /// How the health check names this queue's consumer.
    part: String,
    acks: mpsc::Sender<(Handle, oneshot::Sender<bool>)>,
    /// The sessions with a message handed out (queues with sessions).
    gate: sessions::SessionGate,
}

/// Everything an external queue's source is made of.
pub struct ExternalParts {
    /// Queue name.
    pub name: Arc<str>,
    /// The `[providers.NAME]` name.
    pub provider: String,
    /// The provider type, for metrics.
    pub kind: &'static str,
    /// How the provider counts deliveries.
    pub counts: CountKind,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// The queue's processing consumer.
    pub consumer: Arc<dyn Consumer>,
    /// Where its activations live.
    pub activations: Arc<dyn ActivationStore>,
    /// Where redeliveries are counted when the broker does not count them.
    pub attempts: Arc<dyn AttemptCounter>,
    /// The SQL queue that receives failures and other non-pending states.
    pub sql: Arc<dyn QueueStore>,
    /// Raised for the SQL queue of the same name when a message moved into it.
    pub sql_wake: Arc<Notify>,
    /// Raised when this queue was activated in this process.
    pub wake: Arc<Notify>,
    /// How often it looks for activations made by other hosts.
    pub poll_interval: Duration,
    /// The provider's readiness health, which failing receives and acknowledgements turn red.
    pub health: Arc<ProviderHealth>,
}

impl ExternalSource {
    /// Wait for an activation, a push from the broker or a wake.
    async fn wait_for_broker(&self, shutdown: &CancellationToken) {
        loop {
            match self.activations.claim(&self.name).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(queue = %self.name, "claiming the activation failed, retrying: {e}")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.consumer.pushed() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }

    /// Assemble the source (and start its acknowledgement task).
    pub fn new(parts: ExternalParts) -> Self {
        let acks = start_acker(
            parts.consumer.clone(),
            parts.name.to_string(),
            parts.health.clone(),
        );
        ExternalSource {
            part: format!("consumer of queue `{}`", parts.name),
            name: parts.name,
            provider: parts.provider,
            kind: parts.kind,
            counts: parts.counts,
            config: parts.config,
            consumer: parts.consumer,
            activations: parts.activations,
            attempts: parts.attempts,
            sql: parts.sql,
            sql_wake: parts.sql_wake,
            wake: parts.wake,
            poll_interval: parts.poll_interval,
            health: parts.health,
            acks,
            gate: sessions::SessionGate::default(),
        }
    }

    /// Whether as many messages wait behind their sessions as may (see [`HELD_PER_SLOT`]).
    fn gate_full(&self) -> bool {
        self.gate.held() >= HELD_PER_SLOT * self.config.concurrency as usize
    }

    /// Note that `items` go back to the broker unprocessed: where the broker flags (or does
    /// not count) the next delivery, it is not an attempt.
    async fn forgive(&self, items: &[Arc<Item>]) {
        let keys: Vec<String> = items
            .iter()
            .filter(|i| i.forgive)
            .map(|i| i.key.clone())
            .collect();
        if keys.is_empty() {
            return;
        }
        if let Err(e) = self.attempts.forgive(&self.name, &keys).await {
            tracing::warn!(queue = %self.name, provider = %self.provider, "could not note the hand-back; the next delivery counts as an attempt: {e}");
        }
    }

    /// Acknowledge a delivery (batched with others); false when its lease or lock was lost.
    async fn ack(&self, item: &Item) -> bool {
        let (reply, rx) = oneshot::channel();
        if self.acks.send((item.handle.clone(), reply)).await.is_err() {
            return false;
        }
        let held = rx.await.unwrap_or(false);
        if held && item.counted {
            let _ = self
                .attempts
                .forget(&self.name, std::slice::from_ref(&item.key))
                .await;
        }
        held
    }
}

#[async_trait]
impl Source for ExternalSource {
    type Handle = Arc<Item>;

    fn provider(&self) -> &'static str {
        self.kind
    }

    fn consumer_group(&self) -> Option<&str> {
        self.consumer.group()
    }

    /// The envelope's MessageId (the identity the inbox knows a message by; a broker's own
    /// delivery identity, such as a Kafka offset, would be reused by a re-created topic).
    fn commit_mark(&self, handle: &Arc<Item>) -> Option<String> {
        let id = handle.envelope.as_ref()?.message_id.as_ref()?;
        (!id.is_empty()).then(|| id.clone())
    }

    async fn receive(
        &self,
        max: u32,
        inbox: Option<&InboxBinding>,
    ) -> Result<Vec<Work<Arc<Item>>>, String> {
        if !self.config.sessions {
            return self.receive_from_broker(max, inbox).await;
        }
        let mut works = Vec::new();
        for work in self.gate.take_ready(max as usize) {
            if self.consumer.holds(&work.handle.handle) {
                works.push(work);
            } else if let Some(session) = &work.handle.session {
                // Taken back by the broker (so is everything after it): delivered again.
                self.gate.settled(session);
            }
        }
        // Messages waiting behind their session are received already: at most a few rounds'
        // worth are held here.
        let room = (max as usize).saturating_sub(works.len());
        if room > 0 && !self.gate_full() {
            let received = match self.receive_from_broker(room as u32, inbox).await {
                Ok(received) => received,
                Err(e) if works.is_empty() => return Err(e),
                Err(_) => Vec::new(),
            };
            works.extend(self.gate.admit(received));
        }
        self.vet(works, inbox).await
    }

    async fn wait_for_work(&self, shutdown: &CancellationToken) {
        if self.config.sessions {
            let ready = self.gate.ready.notified();
            if self.gate_full() {
                // Nothing more is received until a waiting message can go.
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = ready => {}
                }
                return;
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = ready => {}
                _ = self.wait_for_broker(shutdown) => {}
            }
        } else {
            self.wait_for_broker(shutdown).await
        }
    }

    async fn settle(&self, item: Arc<Item>, verdict: Verdict) -> Settled {
        let attempt = verdict.attempt;
        let settled = match verdict.disposition_in(item.session.is_some()) {
            // A pending handoff blocks its session: it waits in the SQL queue, handed off,
            // until an operator settles it.
            Disposition::HandOff => {
                self.move_and_ack(
                    &item,
                    Some(Status::HandedOff),
                    now_ms(),
                    None,
                    attempt,
                    "handed-off",
                )
                .await
            }
            Disposition::Complete => {
                if !self.ack(&item).await {
                    tracing::warn!(queue = %self.name, provider = %self.provider, "the broker message's lease or lock was lost before it was acknowledged: the broker delivers it again");
                }
                true
            }
            Disposition::Retry { at_ms, error } => {
                // Sleeping is where the SQL queue keeps a message due later.
                self.move_and_ack(&item, None, at_ms, error, attempt, "retry")
                    .await
            }
            Disposition::Fail { error } => {
                self.move_and_ack(
                    &item,
                    Some(Status::Failed),
                    now_ms(),
                    Some(error),
                    attempt,
                    "failed",
                )
                .await
            }
            Disposition::Release => {
                self.release(vec![item]).await;
                return Settled::NotApplied;
            }
        };
        if settled && let Some(session) = &item.session {
            self.gate.settled(session);
        }
        match settled {
            true => Settled::Applied,
            false => Settled::NotApplied,
        }
    }

    fn reads_ahead(&self) -> bool {
        // A queue with sessions already holds messages behind their sessions.
        !self.config.sessions && self.consumer.leases_on_receive()
    }

    async fn stop_receiving(&self) {
        let pushed = self.consumer.stop().await;
        let waiting = self.gate.take_all();
        if !waiting.is_empty() {
            self.release(waiting).await;
        }
        if pushed.is_empty() {
            return;
        }
        let items = pushed
            .into_iter()
            .map(|d| {
                let envelope = std::str::from_utf8(&d.body)
                    .ok()
                    .and_then(|text| Envelope::parse(text).ok());
                Arc::new(Item {
                    key: counting_key(&d, envelope.as_ref()),
                    counted: false,
                    // Never handed out: a redelivered one was not counted by this host, so
                    // only a first delivery's flagged return needs forgiving.
                    forgive: d.count == DeliveryCount::Redelivered(false),
                    handle: d.handle,
                    body: d.body,
                    envelope,
                    session: None,
                })
            })
            .collect();
        self.release(items).await;
    }

    async fn finish(&self) {
        self.consumer.close().await;
    }

    async fn release(&self, mut items: Vec<Arc<Item>>) {
        // What waits behind a released message of a session goes back with it, after it.
        let waiting: Vec<Arc<Item>> = items
            .iter()
            .filter_map(|i| i.session.as_deref())
            .flat_map(|session| self.gate.give_up(session))
            .collect();
        items.extend(waiting);
        self.forgive(&items).await;
        let handles: Vec<Handle> = items.iter().map(|i| i.handle.clone()).collect();
        let nack = Nack {
            requeue: true,
            counted: false,
        };
        match self.consumer.nack(&handles, nack).await {
            Ok(()) => {
                tracing::info!(queue = %self.name, provider = %self.provider, count = handles.len(), "handed unfinished messages back to the broker")
            }
            Err(e) => {
                tracing::error!(queue = %self.name, provider = %self.provider, "could not hand messages back; the broker redelivers them when their lease or connection ends: {e}")
            }
        }
    }
}

/// How many messages per unit of concurrency may wait behind their session before the queue
/// stops receiving more.
const HELD_PER_SLOT: usize = 4;

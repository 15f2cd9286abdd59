//! The one processing pipeline, the same for every source of messages (the SQL queue and
//! every external provider's consumer), in this order: receive up to the free concurrency
//! (and a rate-limited queue's budget, [`rate_limit`]) → inbox check for the whole batch →
//! invoke the handler on a fresh instance → decide the outcome → record the inbox entry
//! (only after the guest succeeded) → settle. A queue whose handler is not deployed receives
//! nothing. A busy queue whose source allows it receives
//! its next batch while the current one runs ([`ahead`]). On shutdown it stops receiving,
//! lets in-flight messages finish within the grace period, and hands the rest back to their
//! source.
//!
//! A source ([`Source`]) only knows how to receive, settle and release its own messages.
//! A queue fed by two sources (an external queue: its broker and the SQL queue of its
//! retries) runs one pipeline per source over one set of handler-call slots, so its
//! `concurrency` bounds its calls whatever source they came from.

mod ahead;
mod broker;
pub mod commit_group;
mod deliver;
mod effects;
mod outcome;
mod rate_limit;
mod receiving;
mod recorder;
mod settle;
mod sql;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use broker::{ExternalParts, ExternalSource};
pub use deliver::{InboxBinding, MOVED_FROM_HEADER};
pub use effects::{MAX_FOLLOW_UP_BYTES, MAX_FOLLOW_UPS};
pub use outcome::{decide, transient};
pub use rate_limit::{Budget, RateLimit};
pub use recorder::Recorder;
pub use settle::Settler;
pub use sql::{DEFERRED_PUBLISH_HEADER, SqlSource};

use self::receiving::{Outage, gather_slots};
use crate::config::QueueConfig;
use crate::queue::Disposition;
use crate::queue::{FollowUp, InboxWrite, QueueStore, StateWrite};
use crate::runtime::Enqueuer;
use crate::runtime::{HandlerRegistry, Message};

/// One message received from a source, ready to be processed.
pub struct Work<H> {
    /// What settles it with its source.
    pub handle: H,
    /// What the guest sees.
    pub message: Message,
    /// Already decided without running the guest (a body that cannot be read, no attempts
    /// left); the message is settled with this at once.
    pub decided: Option<Disposition>,
    /// The ids the consumer inbox checks and records, `None` to bypass the inbox.
    pub inbox: Option<InboxIds>,
    /// How logs name the message (`key=42`, `message_id=…`).
    pub label: String,
}

/// The consumer-inbox ids of one delivery.
#[derive(Debug, Clone)]
pub struct InboxIds {
    /// The MessageId checked before the guest runs.
    pub check: String,
    /// Whether the source already checked it while receiving (`None`: not checked yet).
    pub seen: Option<bool>,
    /// The MessageIds recorded after the guest succeeded.
    pub record: Vec<String>,
}

/// Whether a verdict was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Applied.
    Applied,
    /// Not applied (a lost lease or lock, an outage; the source logged why).
    NotApplied,
    /// Its key-value changes conflicted (`BUCKET/KEY`): its `on_conflict` was applied
    /// instead, none of its effects.
    StateConflict(String),
}

/// What happens to one message.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The outcome.
    pub disposition: Disposition,
    /// On completion, how (`completed`, `pending-handoff`, `skipped: duplicate`).
    pub outcome: Option<&'static str>,
    /// Inbox records the source writes with the settlement itself.
    pub inbox: Option<InboxWrite>,
    /// On a success, the follow-ups the handler staged, for a source that writes them with
    /// its settlement ([`Source::settles_follow_ups`]).
    pub follow_ups: Vec<FollowUp>,
    /// On a success, the key-value changes the handler staged, for such a source too.
    pub state: Vec<StateWrite>,
    /// What the source applies instead when they conflict.
    pub on_conflict: Disposition,
    /// The attempt that ended (kept when the message moves to another store).
    pub attempt: u32,
}

impl Verdict {
    /// The disposition for a message in a session (`in_session`) or not: in a session, a
    /// pending handoff blocks the session until an operator settles it
    /// ([`Disposition::HandOff`]); elsewhere it completes the message.
    pub fn disposition_in(&self, in_session: bool) -> Disposition {
        match &self.disposition {
            Disposition::Complete
                if in_session && self.outcome == Some(deliver::PENDING_HANDOFF) =>
            {
                Disposition::HandOff
            }
            other => other.clone(),
        }
    }
}

/// Where a queue's messages come from and are settled: the SQL queue, or one provider's
/// consumer.
#[async_trait]
pub trait Source: Send + Sync + 'static {
    /// What settles one message.
    type Handle: Clone + Send + Sync + 'static;

    /// The source for metrics labels: `sql` or the provider type.
    fn provider(&self) -> &'static str;

    /// The consumer group its deliveries come through, where the broker has them.
    fn consumer_group(&self) -> Option<&str> {
        None
    }

    /// Up to `max` messages (checked against `inbox` while receiving where it can).
    async fn receive(
        &self,
        max: u32,
        inbox: Option<&InboxBinding>,
    ) -> Result<Vec<Work<Self::Handle>>, String>;

    /// Wait until there may be work again after a receive found none.
    async fn wait_for_work(&self, shutdown: &CancellationToken);

    /// Whether [`Verdict::inbox`] records are written by [`Source::settle`] (an inbox table
    /// in the queue's own database); otherwise the pipeline records them first.
    fn records_inbox(&self, inbox: &InboxBinding) -> bool {
        let _ = inbox;
        false
    }

    /// Whether [`Verdict::follow_ups`] are written by [`Source::settle`] (a source settling
    /// in the SQL store); otherwise the pipeline commits them before settling.
    fn settles_follow_ups(&self) -> bool {
        false
    }

    /// An identity of `handle`'s delivery that is the same on every redelivery and tells it
    /// from every other message (its MessageId; never a hash of the body), for a source
    /// whose follow-ups the pipeline commits: with it, a
    /// redelivery of a committed success commits nothing again ([`crate::queue::CommitMark`]).
    fn commit_mark(&self, handle: &Self::Handle) -> Option<String> {
        let _ = handle;
        None
    }

    /// Apply a verdict; returns whether it was applied. Logs what went wrong itself.
    async fn settle(&self, handle: Self::Handle, verdict: Verdict) -> Settled;

    /// Hand messages back untouched (shutdown): available again, where the source allows
    /// without counting the attempt.
    async fn release(&self, handles: Vec<Self::Handle>);

    /// Whether the pipeline may receive the next batch while the current one runs (the
    /// source's leases run while a message waits for a slot, and it can hand messages back
    /// untouched).
    fn reads_ahead(&self) -> bool {
        false
    }

    /// Housekeeping between receives (expired leases, retention).
    async fn housekeeping(&self) {}

    /// Shutdown begins: receive nothing more (and hand back what arrived unasked).
    async fn stop_receiving(&self) {}

    /// Shutdown ends: every message is settled or handed back.
    async fn finish(&self) {}
}

/// Everything one queue's pipeline needs besides its source.
pub struct Pipeline {
    /// Queue name.
    pub name: Arc<str>,
    /// Its configuration.
    pub config: QueueConfig,
    /// The handler that processes it (a queue without one has no pipeline).
    pub handler: Arc<str>,
    /// Where its handler comes from.
    pub registry: Arc<HandlerRegistry>,
    /// What guest `enqueue` calls go to.
    pub enqueuer: Arc<dyn Enqueuer>,
    /// Where handlers' key-value state is read (the SQL store).
    pub state: Arc<dyn QueueStore>,
    /// Where a broker message's effects commit, with the queue's others at the same time.
    pub committer: Arc<commit_group::CommitGroup>,
    /// The consumer inbox of this queue's endpoint, when enabled.
    pub inbox: Option<InboxBinding>,
    /// The queue's handler-call slots (`concurrency` of them), shared by every source of
    /// the queue ([`Pipeline::slots_for`]).
    pub slots: Arc<Semaphore>,
    /// The queue's rate limit, if it has one (shared by every source of the queue).
    pub rate_limit: Option<Arc<RateLimit>>,
}

impl Pipeline {
    /// The slots of a queue with `config`: one set for all of its sources, so its
    /// `concurrency` bounds its handler calls whatever source they came from.
    pub fn slots_for(config: &QueueConfig) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(config.concurrency as usize))
    }

    /// The group commit of a queue's broker-message effects on `store`: one for all of the
    /// queue's sources.
    pub fn committer_for(store: Arc<dyn QueueStore>) -> Arc<commit_group::CommitGroup> {
        commit_group::CommitGroup::new(store)
    }
}

pub(crate) struct Shared<S: Source> {
    pub(crate) pipeline: Pipeline,
    pub(crate) source: S,
    /// Messages being processed, by a sequence number, for the release at shutdown.
    pub(crate) in_flight: Mutex<HashMap<u64, S::Handle>>,
    /// Settlements under way (never aborted).
    pub(crate) settling: tokio_util::task::TaskTracker,
    /// Outcomes waiting for their write or being written ([`SETTLING_PER_SLOT`] per unit of
    /// concurrency).
    pub(crate) settling_slots: Arc<Semaphore>,
    /// How long this queue's handler calls take lately (whether reading ahead pays).
    pub(crate) call_time: ahead::CallTime,
    /// Messages whose key-value changes conflicted, and how often.
    pub(crate) state_conflicts: effects::StateConflicts,
}

impl Pipeline {
    /// Run over `source` until `shutdown`, then drain within `grace`.
    pub async fn run<S: Source>(self, source: S, shutdown: CancellationToken, grace: Duration) {
        let concurrency = self.config.concurrency as usize;
        // A read for free slots takes at most what is free; a read ahead takes up to `batch`,
        // which may be more than the concurrency: the fewer round trips (and, on SQLite,
        // commits) per message, the faster a fast queue drains.
        let batch = (self.config.batch as usize).min(concurrency).max(1);
        let read_ahead = self.config.batch.max(1);
        let shared = Arc::new(Shared {
            pipeline: self,
            source,
            in_flight: Mutex::new(HashMap::new()),
            settling: tokio_util::task::TaskTracker::new(),
            settling_slots: Arc::new(Semaphore::new(concurrency * SETTLING_PER_SLOT)),
            call_time: ahead::CallTime::default(),
            state_conflicts: effects::StateConflicts::default(),
        });
        let p = &shared.pipeline;
        let slots = p.slots.clone();
        let mut tasks = JoinSet::new();
        let mut changes = p.registry.subscribe();
        let mut waiting_logged = false;
        let mut outage = Outage::default();
        let sweep_every = (p.config.lease / 2).min(Duration::from_secs(5));
        let mut next_sweep = Instant::now();
        let mut last_short = true;
        let mut seq: u64 = 0;
        let mut ahead = ahead::ReadAhead::new(
            shared.source.reads_ahead(),
            p.config.lease,
            p.config.timeout,
            ahead::refill_level(read_ahead as usize, concurrency),
        );

        loop {
            while tasks.try_join_next().is_some() {}
            if shutdown.is_cancelled() {
                break;
            }
            let Some(handler) = p.registry.get(&p.handler) else {
                // Still compiling at start: not worth a warning yet.
                if !waiting_logged && !p.registry.loading() {
                    tracing::warn!(queue = %p.name, handler = %p.handler, "handler is not deployed: messages wait until it is");
                    waiting_logged = true;
                }
                // Nothing runs them now: received ahead, they go back to the source.
                ahead.hand_back(&shared.source).await;
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = changes.changed() => continue,
                }
            };
            waiting_logged = false;

            let Some(first) = ahead.slot(&slots, &shared.source, &shutdown).await else {
                break;
            };
            let mut permits = gather_slots(&slots, first, batch, last_short).await;

            if Instant::now() >= next_sweep {
                next_sweep = Instant::now() + sweep_every;
                shared.source.housekeeping().await;
            }

            // The batch to run: what waited for slots, else what the read under way (or a
            // read now) returns.
            if !ahead.has_held() {
                let (received, asked) = match ahead.finish_reading().await {
                    Some(read) => read,
                    None => ahead::receive(&shared, permits.len() as u32).await,
                };
                let received = match received {
                    Ok(received) => {
                        outage.over(&p.name, shared.source.provider());
                        received
                    }
                    Err(e) => {
                        drop(permits);
                        outage.failed(&p.name, shared.source.provider(), &e);
                        if outage.wait(&shutdown).await {
                            continue;
                        }
                        break;
                    }
                };
                // A short batch means the source is drained: do not wait to batch next time.
                last_short = (received.len() as u32) < asked;
                if received.is_empty() {
                    drop(permits);
                    shared.source.wait_for_work(&shutdown).await;
                    continue;
                }
                ahead.hold(received);
            }
            let (run, stale) = ahead.take(permits.len());
            if !stale.is_empty() {
                tracing::debug!(queue = %p.name, count = stale.len(), "handing back messages that waited too long for a free slot");
                shared.source.release(stale).await;
            }
            // While this batch runs, the next one is received.
            ahead.read_next(&shared, read_ahead, !last_short);
            // The version serving now: a deploy while this batch waited for slots or was
            // received applies to it (calls already running finish on theirs).
            let handler = p.registry.get(&p.handler).unwrap_or(handler);
            for (ready, permit) in run.into_iter().zip(permits.drain(..)) {
                seq += 1;
                shared
                    .in_flight
                    .lock()
                    .expect("in-flight set")
                    .insert(seq, ready.work.handle.clone());
                tasks.spawn(deliver::process(
                    shared.clone(),
                    handler.clone(),
                    seq,
                    ready.work,
                    ready.check,
                    ready.received,
                    permit,
                ));
            }
            drop(permits);
        }

        // Received ahead and never run: back to the source at once.
        ahead.hand_back(&shared.source).await;
        stop(&shared, tasks, grace).await;
        shared.source.finish().await;
    }
}

/// Outcomes that may wait for their write per unit of a queue's concurrency. Outcomes are
/// written in batches, one batch at a time per store: while one is written, the handlers go
/// on and the next batch gathers. With room for only as many outcomes as the concurrency,
/// the handlers stalled until each write returned (on PostgreSQL a backlog drained 20–30 %
/// slower with one than with four, and about 12 % slower with four than with eight: a batch
/// with its inbox records takes a few milliseconds to write, and the outcomes gathering
/// meanwhile filled four slots' worth before it returned).
const SETTLING_PER_SLOT: usize = 8;

/// How long settlements already under way may still take after the grace period.
const SETTLING_GRACE: Duration = Duration::from_secs(10);

/// Shut a pipeline down: stop receiving, let running calls finish within `grace` (then abort
/// them), wait for their settlements, and hand back what never settled.
async fn stop<S: Source>(shared: &Arc<Shared<S>>, mut tasks: JoinSet<()>, grace: Duration) {
    shared.source.stop_receiving().await;
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    shared.settling.close();
    if tokio::time::timeout(SETTLING_GRACE, shared.settling.wait())
        .await
        .is_err()
    {
        tracing::error!(queue = %shared.pipeline.name, provider = shared.source.provider(), "settlements still running {SETTLING_GRACE:?} after the grace period; their messages return by lease expiry or redelivery");
    }
    let leftover: Vec<S::Handle> = shared
        .in_flight
        .lock()
        .expect("in-flight set")
        .drain()
        .map(|(_, handle)| handle)
        .collect();
    if !leftover.is_empty() {
        tracing::warn!(queue = %shared.pipeline.name, provider = shared.source.provider(), count = leftover.len(), "handing back messages still running after the shutdown grace period");
        for _ in &leftover {
            crate::metrics::message(
                &shared.pipeline.name,
                crate::metrics::MessageOutcome::Released,
            );
        }
        shared.source.release(leftover).await;
    }
}

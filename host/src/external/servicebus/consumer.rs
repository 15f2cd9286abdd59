//! The processing consumer of one queue: peek-locks from the queue's processing
//! subscription, holds the locks, renews them while handlers run, completes after the
//! settlement is durable and unlocks what is handed back.
//!
//! The REST API hands out one message per request, so receiving runs ahead of the pipeline:
//! a set of receivers ([`super::receivers`], one per unit of prefetch, at most
//! [`MAX_RECEIVERS`]) each keeps a peek-lock request open while there is room. When the
//! subscription is empty only the first receiver waits (a long poll of [`IDLE_WAIT`]); the
//! others park until a message arrives, so an idle queue costs one request per
//! [`IDLE_WAIT`]. Every lock taken counts against the prefetch until it is completed,
//! unlocked or gone ([`super::locks`] renews and forgets them).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::KIND;
use super::locks::keep_locks;
use super::receivers::receiver;
use super::rest::{LockAction, Rest};
use crate::external::{Consumer, Delivery, Handle, Nack, ProviderError};

/// Most peek-lock requests one consumer keeps open at once.
pub const MAX_RECEIVERS: u32 = 64;
/// How long the first receiver waits for a message on an idle subscription.
pub const IDLE_WAIT: Duration = Duration::from_secs(10);
/// How long the other receivers wait before parking again.
pub(super) const BUSY_WAIT: Duration = Duration::from_secs(1);
/// How long a peek-lock request still open at shutdown may take to answer: a message it
/// brings is unlocked then, instead of staying locked until its lock expires.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(1);
/// How often held locks are looked at for renewal.
pub(super) const RENEW_TICK: Duration = Duration::from_millis(250);
/// Receiving pauses (and buffered messages are unlocked) when nothing asked for messages
/// this long: the queue's handler was removed. A queue that waits for work is still asked
/// at every reconciliation pass.
pub const PAUSE_AFTER: Duration = Duration::from_secs(120);

/// The right to settle one delivery: the key of its lock in [`State::locks`].
pub(super) struct LockId(pub(super) u64);

/// One lock the consumer holds.
pub(super) struct HeldLock {
    pub(super) url: String,
    pub(super) lock_for: Duration,
    pub(super) expires: Instant,
    /// Renewal or completion found it gone (expired or taken back).
    pub(super) lost: bool,
    /// A completion was attempted: never renewed again, dropped once expired.
    pub(super) settling: bool,
    /// Completed, for a retried acknowledgement of the same batch.
    pub(super) completed: bool,
    pub(super) _room: OwnedSemaphorePermit,
}

/// What the receivers, the lock keeper and the consumer share.
pub(super) struct State {
    pub(super) rest: Arc<Rest>,
    pub(super) topic: String,
    pub(super) subscription: String,
    pub(super) renew: bool,
    pub(super) room: Arc<Semaphore>,
    pub(super) buffer: Mutex<VecDeque<Delivery>>,
    pub(super) locks: Mutex<HashMap<u64, HeldLock>>,
    pub(super) next: AtomicU64,
    pub(super) arrived: Notify,
    /// Raised for each message received: one parked receiver joins.
    pub(super) busy: Notify,
    /// When `receive` was last called, and raised when it is.
    pub(super) last_receive: Mutex<Instant>,
    pub(super) demand: Notify,
    /// The last receive failure, reported by `receive` once nothing is buffered.
    pub(super) failure: Mutex<Option<ProviderError>>,
    pub(super) stopping: CancellationToken,
}

impl State {
    /// Nothing asked for messages for [`PAUSE_AFTER`].
    pub(super) fn idle(&self) -> bool {
        self.last_receive.lock().expect("last receive").elapsed() > PAUSE_AFTER
    }
}

/// The processing consumer of one Service Bus queue.
pub struct ServiceBusConsumer {
    state: Arc<State>,
    receivers: u32,
    /// The receiver tasks, awaited at `close` so what they received goes back first.
    running: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Receiving starts with the first `receive` (the queue's handler is deployed): no
    /// lock is taken for a queue nothing processes yet.
    started: std::sync::Once,
}

impl ServiceBusConsumer {
    /// A consumer of `topic/subscription` holding at most `prefetch` locks.
    pub fn new(
        rest: Arc<Rest>,
        topic: String,
        subscription: String,
        prefetch: u32,
        renew: bool,
    ) -> Self {
        let prefetch = prefetch.max(1);
        let state = Arc::new(State {
            rest,
            topic,
            subscription,
            renew,
            room: Arc::new(Semaphore::new(prefetch as usize)),
            buffer: Mutex::new(VecDeque::new()),
            locks: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            arrived: Notify::new(),
            busy: Notify::new(),
            last_receive: Mutex::new(Instant::now()),
            demand: Notify::new(),
            failure: Mutex::new(None),
            stopping: CancellationToken::new(),
        });
        ServiceBusConsumer {
            state,
            receivers: prefetch.min(MAX_RECEIVERS),
            running: Mutex::new(Vec::new()),
            started: std::sync::Once::new(),
        }
    }

    fn start_receiving(&self) {
        self.started.call_once(|| {
            let mut running = self.running.lock().expect("receivers");
            for index in 0..self.receivers {
                running.push(tokio::spawn(receiver(self.state.clone(), index)));
            }
            tokio::spawn(keep_locks(self.state.clone()));
        });
    }
}

#[async_trait]
impl Consumer for ServiceBusConsumer {
    async fn receive(&self, max: u32) -> Result<Vec<Delivery>, ProviderError> {
        *self.state.last_receive.lock().expect("last receive") = Instant::now();
        self.state.demand.notify_waiters();
        self.start_receiving();
        let mut out = Vec::new();
        {
            let mut buffer = self.state.buffer.lock().expect("buffer");
            let mut locks = self.state.locks.lock().expect("locks");
            let now = Instant::now();
            while out.len() < max as usize
                && let Some(delivery) = buffer.pop_front()
            {
                // A lock that is gone already: the broker delivers the message again.
                let id = delivery
                    .handle
                    .get::<LockId>(KIND)
                    .map_or(u64::MAX, |l| l.0);
                match locks.get(&id) {
                    Some(l) if !l.lost && l.expires > now => out.push(delivery),
                    _ => {
                        locks.remove(&id);
                    }
                }
            }
        }
        if out.is_empty()
            && let Some(failure) = self.state.failure.lock().expect("failure").take()
        {
            return Err(failure);
        }
        Ok(out)
    }

    async fn pushed(&self) {
        loop {
            let arrived = self.state.arrived.notified();
            if !self.state.buffer.lock().expect("buffer").is_empty()
                || self.state.failure.lock().expect("failure").is_some()
            {
                return;
            }
            arrived.await;
        }
    }

    fn holds(&self, handle: &Handle) -> bool {
        let Ok(id) = handle.get::<LockId>(KIND) else {
            return false;
        };
        let locks = self.state.locks.lock().expect("locks");
        locks
            .get(&id.0)
            .is_some_and(|l| !l.lost && l.expires > Instant::now())
    }

    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        let ids = Handle::all::<LockId>(handles, KIND)?;
        let mut work = Vec::new();
        let mut held = vec![false; handles.len()];
        {
            let mut locks = self.state.locks.lock().expect("locks");
            for (i, id) in ids.iter().map(|l| l.0).enumerate() {
                match locks.get_mut(&id) {
                    Some(l) if l.completed => held[i] = true,
                    Some(l) => {
                        l.settling = true;
                        work.push((i, id, l.url.clone()));
                    }
                    None => {}
                }
            }
        }
        let outcomes = join_all(
            work.iter()
                .map(|(_, _, url)| self.state.rest.on_lock(url, LockAction::Complete)),
        )
        .await;
        let mut failure = None;
        let mut locks = self.state.locks.lock().expect("locks");
        for ((i, id, _), outcome) in work.into_iter().zip(outcomes) {
            match outcome {
                Ok(done) => {
                    held[i] = done;
                    if let Some(l) = locks.get_mut(&id) {
                        l.completed = done;
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            // Completed ones answer `true` when the batch is acknowledged again.
            return Err(e);
        }
        for id in ids {
            locks.remove(&id.0);
        }
        Ok(held)
    }

    async fn nack(&self, handles: &[Handle], nack: Nack) -> Result<(), ProviderError> {
        // Service Bus unlocks (the delivery stays counted); without requeue the lock is
        // left to expire, which also makes the message available again.
        let mut urls: Vec<(u64, String)> = Vec::new();
        for handle in handles {
            urls.extend(self.state.lock_url(handle)?);
        }
        let outcomes = if nack.requeue {
            join_all(
                urls.iter()
                    .map(|(_, url)| self.state.rest.on_lock(url, LockAction::Unlock)),
            )
            .await
        } else {
            Vec::new()
        };
        let mut locks = self.state.locks.lock().expect("locks");
        for (id, _) in &urls {
            locks.remove(id);
        }
        match outcomes.into_iter().find_map(Result::err) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn stop(&self) -> Vec<Delivery> {
        self.state.stopping.cancel();
        self.state
            .buffer
            .lock()
            .expect("buffer")
            .drain(..)
            .collect()
    }

    async fn close(&self) {
        self.state.stopping.cancel();
        // Each ends within STOP_WAIT plus one unlock (bounded by the request timeout).
        let running = std::mem::take(&mut *self.running.lock().expect("receivers"));
        join_all(running).await;
        let left: Vec<String> = {
            let mut locks = self.state.locks.lock().expect("locks");
            locks
                .drain()
                .filter(|(_, l)| !l.settling)
                .map(|(_, l)| l.url)
                .collect()
        };
        join_all(
            left.iter()
                .map(|url| self.state.rest.on_lock(url, LockAction::Unlock)),
        )
        .await;
    }
}

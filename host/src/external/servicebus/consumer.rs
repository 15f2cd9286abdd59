//! The processing consumer of one queue: peek-locks from the queue's processing
//! subscription, holds the locks, renews them while handlers run, completes after the
//! settlement is durable and unlocks what is handed back.
//!
//! The REST API hands out one message per request, so receiving runs ahead of the pipeline:
//! a set of receivers (one per unit of prefetch, at most [`MAX_RECEIVERS`]) each keeps a
//! peek-lock request open while there is room. When the subscription is empty only the
//! first receiver waits (a long poll of [`IDLE_WAIT`]); the others park until it receives a
//! message, so an idle queue costs one request per [`IDLE_WAIT`]. Every lock taken counts
//! against the prefetch until it is completed, unlocked or lost.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rest::{LockAction, Locked, Rest, parse_date};
use crate::external::{Consumer, Delivery, DeliveryCount, Handle, Nack, ProviderError};

/// Most peek-lock requests one consumer keeps open at once.
pub const MAX_RECEIVERS: u32 = 64;
/// How long the first receiver waits for a message on an idle subscription.
pub const IDLE_WAIT: Duration = Duration::from_secs(10);
/// How long the other receivers wait before parking again.
const BUSY_WAIT: Duration = Duration::from_secs(1);
/// How often held locks are looked at for renewal.
const RENEW_TICK: Duration = Duration::from_millis(250);

/// The right to settle one delivery: the key of its lock in [`State::locks`].
struct LockId(u64);

/// One lock the consumer holds.
struct HeldLock {
    url: String,
    lock_for: Duration,
    expires: Instant,
    /// Renewal found it gone (expired or taken back).
    lost: bool,
    /// A completion was attempted: never renewed again, dropped once expired.
    settling: bool,
    /// Completed, for a retried acknowledgement of the same batch.
    completed: bool,
    _room: OwnedSemaphorePermit,
}

struct State {
    rest: Arc<Rest>,
    topic: String,
    subscription: String,
    renew: bool,
    room: Arc<Semaphore>,
    buffer: Mutex<VecDeque<Delivery>>,
    locks: Mutex<HashMap<u64, HeldLock>>,
    next: AtomicU64,
    arrived: Notify,
    /// Raised when the first receiver got a message (the others start receiving).
    busy: Notify,
    /// The last receive failure, reported once by `receive`.
    failure: Mutex<Option<ProviderError>>,
    stopping: CancellationToken,
}

/// The processing consumer of one Service Bus queue.
pub struct ServiceBusConsumer {
    state: Arc<State>,
    receivers: u32,
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
            failure: Mutex::new(None),
            stopping: CancellationToken::new(),
        });
        ServiceBusConsumer {
            state,
            receivers: prefetch.min(MAX_RECEIVERS),
            started: std::sync::Once::new(),
        }
    }

    fn start_receiving(&self) {
        self.started.call_once(|| {
            for index in 0..self.receivers {
                tokio::spawn(receiver(self.state.clone(), index));
            }
            tokio::spawn(keep_locks(self.state.clone()));
        });
    }
}

/// One receiver: peek-lock while there is room; park when the subscription is empty
/// (except the first receiver, which keeps a long poll open).
async fn receiver(state: Arc<State>, index: u32) {
    let mut pause = Duration::from_millis(250);
    loop {
        let room = tokio::select! {
            _ = state.stopping.cancelled() => return,
            room = state.room.clone().acquire_owned() => room.expect("never closed"),
        };
        let wait = if index == 0 { IDLE_WAIT } else { BUSY_WAIT };
        let received = tokio::select! {
            _ = state.stopping.cancelled() => return,
            r = state.rest.peek_lock(&state.topic, &state.subscription, wait) => r,
        };
        match received {
            Ok(Some(locked)) => {
                pause = Duration::from_millis(250);
                state.hold(locked, room);
                if index == 0 {
                    state.busy.notify_waiters();
                }
            }
            Ok(None) => {
                drop(room);
                if index > 0 {
                    tokio::select! {
                        _ = state.stopping.cancelled() => return,
                        _ = state.busy.notified() => {}
                    }
                }
            }
            Err(e) => {
                drop(room);
                *state.failure.lock().expect("failure") = Some(e);
                state.arrived.notify_waiters();
                tokio::select! {
                    _ = state.stopping.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

impl State {
    /// Keep the lock of a received message and buffer it for `receive`.
    fn hold(&self, locked: Locked, room: OwnedSemaphorePermit) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let b = &locked.broker;
        let mut headers = locked.properties;
        if let Some(message_id) = &b.message_id {
            headers.push(("message-id".to_string(), message_id.clone()));
        }
        if let Some(sequence) = b.sequence_number {
            headers.push((
                "servicebus-sequence-number".to_string(),
                sequence.to_string(),
            ));
        }
        if let Some(enqueued) = &b.enqueued_time_utc {
            headers.push(("servicebus-enqueued-time-utc".to_string(), enqueued.clone()));
        }
        let enqueued_at_ms = b
            .enqueued_time_utc
            .as_deref()
            .and_then(parse_date)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64);
        let delivery = Delivery {
            handle: Handle::new(LockId(id)),
            body: locked.body,
            count: DeliveryCount::Exact(b.delivery_count.max(1)),
            identity: None,
            enqueued_at_ms,
            headers,
        };
        self.locks.lock().expect("locks").insert(
            id,
            HeldLock {
                url: locked.lock_url,
                lock_for: locked.lock_for,
                expires: Instant::now() + locked.lock_for,
                lost: false,
                settling: false,
                completed: false,
                _room: room,
            },
        );
        self.buffer.lock().expect("buffer").push_back(delivery);
        self.arrived.notify_waiters();
    }

    fn lock_url(&self, handle: &Handle) -> Option<(u64, String)> {
        let id = handle.get::<LockId>()?.0;
        let locks = self.locks.lock().expect("locks");
        locks.get(&id).map(|l| (id, l.url.clone()))
    }
}

/// Renew held locks at half their duration (when renewal is on) and drop the ones whose
/// completion was attempted and that have expired since.
async fn keep_locks(state: Arc<State>) {
    let mut warned = false;
    loop {
        tokio::select! {
            _ = state.stopping.cancelled() => {}
            _ = tokio::time::sleep(RENEW_TICK) => {}
        }
        if state.stopping.is_cancelled() && state.locks.lock().expect("locks").is_empty() {
            return;
        }
        let now = Instant::now();
        let due: Vec<(u64, String)> = {
            let mut locks = state.locks.lock().expect("locks");
            locks.retain(|_, l| !(l.settling && l.expires + RENEW_TICK < now));
            if !state.renew {
                continue;
            }
            locks
                .iter()
                .filter(|(_, l)| !l.lost && !l.settling && l.expires < now + l.lock_for / 2)
                .map(|(id, l)| (*id, l.url.clone()))
                .collect()
        };
        let renewed = join_all(
            due.iter()
                .map(|(_, url)| state.rest.on_lock(url, LockAction::Renew)),
        )
        .await;
        let mut locks = state.locks.lock().expect("locks");
        for ((id, _), outcome) in due.into_iter().zip(renewed) {
            let Some(lock) = locks.get_mut(&id) else {
                continue;
            };
            match outcome {
                Ok(true) => lock.expires = now + lock.lock_for,
                Ok(false) => lock.lost = true,
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(topic = %state.topic, "renewing message locks failed, retrying: {e}");
                }
                Err(_) => {}
            }
        }
    }
}

#[async_trait]
impl Consumer for ServiceBusConsumer {
    async fn receive(&self, max: u32) -> Result<Vec<Delivery>, ProviderError> {
        self.start_receiving();
        if let Some(failure) = self.state.failure.lock().expect("failure").take() {
            return Err(failure);
        }
        let mut buffer = self.state.buffer.lock().expect("buffer");
        let n = (max as usize).min(buffer.len());
        Ok(buffer.drain(..n).collect())
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
        let Some(id) = handle.get::<LockId>() else {
            return false;
        };
        let locks = self.state.locks.lock().expect("locks");
        locks
            .get(&id.0)
            .is_some_and(|l| !l.lost && l.expires > Instant::now())
    }

    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        let mut work = Vec::new();
        let mut held = vec![false; handles.len()];
        {
            let mut locks = self.state.locks.lock().expect("locks");
            for (i, handle) in handles.iter().enumerate() {
                let Some(id) = handle.get::<LockId>().map(|l| l.0) else {
                    continue;
                };
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
                        l.lost = !done;
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            // Completed ones answer `true` when the batch is acknowledged again.
            return Err(e);
        }
        for handle in handles {
            if let Some(id) = handle.get::<LockId>() {
                locks.remove(&id.0);
            }
        }
        Ok(held)
    }

    async fn nack(&self, handles: &[Handle], nack: Nack) -> Result<(), ProviderError> {
        // Service Bus unlocks (the delivery stays counted); without requeue the lock is
        // left to expire, which also makes the message available again.
        let urls: Vec<(u64, String)> = handles
            .iter()
            .filter_map(|h| self.state.lock_url(h))
            .collect();
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

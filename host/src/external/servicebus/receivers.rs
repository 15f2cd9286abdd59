//! The receivers of a Service Bus consumer: each keeps one peek-lock request open while the
//! consumer has room, and turns a locked message into a buffered [`Delivery`] whose lock is
//! held in [`State::locks`]. At shutdown a request still open gets [`STOP_WAIT`] to answer,
//! and a message it brings is unlocked at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::KIND;
use super::consumer::{BUSY_WAIT, HeldLock, IDLE_WAIT, LockId, STOP_WAIT, State};
use super::rest::{LockAction, Locked, parse_date};
use crate::external::{Delivery, DeliveryCount, Handle, ProviderError};

/// One receiver: peek-lock while there is room; park when the subscription is empty
/// (except the first receiver, which keeps a long poll open).
pub(super) async fn receiver(state: Arc<State>, index: u32) {
    let mut pause = Duration::from_millis(250);
    loop {
        // Nothing asked for messages lately (the handler is gone): wait until something does.
        let demand = state.demand.notified();
        if state.idle() {
            tokio::select! {
                _ = state.stopping.cancelled() => return,
                _ = demand => continue,
            }
        }
        let room = tokio::select! {
            _ = state.stopping.cancelled() => return,
            room = state.room.clone().acquire_owned() => room.expect("never closed"),
        };
        let wait = if index == 0 { IDLE_WAIT } else { BUSY_WAIT };
        let request = state
            .rest
            .peek_lock(&state.topic, &state.subscription, wait);
        tokio::pin!(request);
        let received = tokio::select! {
            r = &mut request => r,
            _ = state.stopping.cancelled() => {
                // An answer may already be on its way: a message it locked goes back now
                // instead of staying locked until the lock expires.
                if let Ok(Ok(Some(locked))) = tokio::time::timeout(STOP_WAIT, request).await {
                    let _ = state.rest.on_lock(&locked.lock_url, LockAction::Unlock).await;
                }
                return;
            }
        };
        match received {
            Ok(Some(locked)) => {
                pause = Duration::from_millis(250);
                state.hold(locked, room);
                // One more receiver joins per message received: a burst ramps up to every
                // receiver within a few round trips, a trickle wakes one.
                state.busy.notify_one();
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
    pub(super) fn hold(&self, locked: Locked, room: OwnedSemaphorePermit) {
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
            session: None,
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

    pub(super) fn lock_url(&self, handle: &Handle) -> Result<Option<(u64, String)>, ProviderError> {
        let id = handle.get::<LockId>(KIND)?.0;
        let locks = self.locks.lock().expect("locks");
        Ok(locks.get(&id).map(|l| (id, l.url.clone())))
    }
}

//! The Service Bus readiness bridge: the readiness subscription of every served queue's
//! topic. Each copy a producer's send put there is one notification, and the REST API
//! hands them out one per request, so a round takes one **guard** per queue — a peek-locked
//! notification — and then removes the other notifications already waiting with
//! receive-and-delete. The guard is completed only after the queue's activation is
//! durable: if the host stops before that, the guard's lock expires and the broker hands it
//! out again, so a removed notification is never the only trace of waiting work (an
//! activation is per queue, not per message). Guards handed out and not acknowledged (the
//! activation failed) are handed out again on the next receive.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;

use super::KIND;
use super::rest::{LockAction, Rest};
use crate::external::{Handle, Notification, ProviderError, ReadinessBridge};

/// How long one `receive` waits for a notification.
const WAIT: Duration = Duration::from_secs(1);
/// Most notifications removed per queue and round (the rest wait for the next round).
const DRAIN_LIMIT: usize = 4096;
/// Receive-and-delete requests in flight at once per queue.
const DRAIN_PARALLEL: usize = 4;

/// The lock of a guard notification.
struct Guard(String);

/// The readiness bridge of one Service Bus provider.
pub struct ServiceBusReadiness {
    rest: Arc<Rest>,
    /// (queue, topic) of every served queue.
    queues: Vec<(String, String)>,
    subscription: String,
    handed_out: Mutex<Vec<Notification>>,
}

impl ServiceBusReadiness {
    pub(super) fn new(
        rest: Arc<Rest>,
        queues: Vec<(String, String)>,
        subscription: String,
    ) -> Self {
        ServiceBusReadiness {
            rest,
            queues,
            subscription,
            handed_out: Mutex::new(Vec::new()),
        }
    }

    /// One queue's round: a guard, then the notifications waiting behind it removed.
    async fn round(&self, queue: &str, topic: &str) -> Result<Option<Notification>, ProviderError> {
        let Some(guard) = self.rest.peek_lock(topic, &self.subscription, WAIT).await? else {
            return Ok(None);
        };
        let notification = Notification {
            queue: queue.to_string(),
            handle: Handle::new(Guard(guard.lock_url)),
        };
        // Held before the others are removed: handed out again if removing them fails.
        self.handed_out
            .lock()
            .expect("handed out")
            .push(notification.clone());
        // Removal stops well before the guard's lock could expire.
        let until = tokio::time::Instant::now() + guard.lock_for / 2;
        let removed = std::sync::atomic::AtomicUsize::new(0);
        let drain = || async {
            while removed.load(std::sync::atomic::Ordering::Relaxed) < DRAIN_LIMIT
                && tokio::time::Instant::now() < until
            {
                if !self
                    .rest
                    .receive_and_delete(topic, &self.subscription)
                    .await?
                {
                    break;
                }
                removed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, ProviderError>(())
        };
        for outcome in join_all((0..DRAIN_PARALLEL).map(|_| drain())).await {
            outcome?;
        }
        Ok(Some(notification))
    }
}

impl ServiceBusReadiness {
    /// The guards handed out before and not acknowledged (their activation failed), with
    /// their locks renewed; the ones whose lock is gone are forgotten (the broker hands them
    /// out again). `None` when there are none.
    async fn renew_handed_out(&self) -> Result<Option<Vec<Notification>>, ProviderError> {
        let waiting = self.handed_out.lock().expect("handed out").clone();
        if waiting.is_empty() {
            return Ok(None);
        }
        let renewed = join_all(waiting.iter().map(|n| async {
            let guard = n.handle.get::<Guard>(KIND)?;
            self.rest.on_lock(&guard.0, LockAction::Renew).await
        }))
        .await;
        let mut kept = Vec::new();
        for (notification, renewed) in waiting.into_iter().zip(renewed) {
            if renewed? {
                kept.push(notification);
            }
        }
        *self.handed_out.lock().expect("handed out") = kept.clone();
        Ok((!kept.is_empty()).then_some(kept))
    }
}

#[async_trait]
impl ReadinessBridge for ServiceBusReadiness {
    async fn start(&self) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn receive(&self) -> Result<Vec<Notification>, ProviderError> {
        if let Some(waiting) = self.renew_handed_out().await? {
            return Ok(waiting);
        }
        let rounds = join_all(self.queues.iter().map(|(q, t)| self.round(q, t))).await;
        let mut notifications = Vec::new();
        for round in rounds {
            notifications.extend(round?);
        }
        Ok(notifications)
    }

    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ProviderError> {
        let urls: Vec<String> =
            Handle::all::<Guard>(notifications.iter().map(|n| &n.handle), KIND)?
                .into_iter()
                .map(|g| g.0.clone())
                .collect();
        // A guard whose lock expired meanwhile is handed out again by the broker and costs
        // one more activation: nothing to do about it here.
        let outcomes = join_all(
            urls.iter()
                .map(|url| self.rest.on_lock(url, LockAction::Complete)),
        )
        .await;
        if let Some(e) = outcomes.into_iter().find_map(Result::err) {
            return Err(e);
        }
        self.handed_out
            .lock()
            .expect("handed out")
            .retain(|n| !matches!(n.handle.get::<Guard>(KIND), Ok(g) if urls.contains(&g.0)));
        Ok(())
    }
}

//! The processing loop of one queue: lease in batches up to the queue's concurrency,
//! invoke the handler on a fresh instance per message, decide the outcome, settle. A queue
//! whose handler is not deployed leases nothing (its messages stay pending). On shutdown it
//! stops leasing, lets in-flight messages finish within the grace period, and releases the
//! rest so nothing stays stuck in processing.

mod deliver;
mod outcome;
mod recorder;
mod settle;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use deliver::{InboxBinding, MOVED_FROM_HEADER};
pub(crate) use deliver::{Precheck, check_keys};
pub use outcome::{decide, transient};
pub use recorder::Recorder;
pub use settle::Settler;

use crate::config::QueueConfig;
use crate::enqueue::Enqueuer;
use crate::queue::{Disposition, Lease, QueueStore, Retention, Settlement};
use crate::runtime::HandlerRegistry;

/// Everything one queue's loop needs.
pub struct QueueWorker {
    /// Queue name.
    pub name: Arc<str>,
    /// Its configuration.
    pub config: QueueConfig,
    /// Where its messages live.
    pub store: Arc<dyn QueueStore>,
    /// Where its handler comes from.
    pub registry: Arc<HandlerRegistry>,
    /// Batched settlement.
    pub settler: Settler,
    /// What guest `enqueue` calls go to.
    pub enqueuer: Arc<dyn Enqueuer>,
    /// Raised when a message is enqueued into this queue in this process.
    pub wake: Arc<Notify>,
    /// How often an idle queue looks for due messages.
    pub poll_interval: Duration,
    /// The consumer inbox of this queue's endpoint, when enabled.
    pub inbox: Option<InboxBinding>,
}

pub(crate) struct Shared {
    pub(crate) worker: QueueWorker,
    pub(crate) in_flight: Mutex<HashSet<Lease>>,
}

impl QueueWorker {
    /// Run until `shutdown`, then drain within `grace`.
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let concurrency = self.config.concurrency as usize;
        let batch = (self.config.batch as usize).min(concurrency).max(1);
        let shared = Arc::new(Shared {
            worker: self,
            in_flight: Mutex::new(HashSet::new()),
        });
        let w = &shared.worker;
        let slots = Arc::new(Semaphore::new(concurrency));
        let mut tasks = JoinSet::new();
        let mut changes = w.registry.subscribe();
        let mut waiting_logged = false;
        let mut store_failing_since: Option<Instant> = None;
        let sweep_every = (w.config.lease / 2).min(Duration::from_secs(5));
        let mut next_sweep = Instant::now();
        let mut last_lease_short = true;

        loop {
            while tasks.try_join_next().is_some() {}
            if shutdown.is_cancelled() {
                break;
            }
            let Some(handler) = w.registry.get(&w.config.handler) else {
                if !waiting_logged {
                    tracing::warn!(queue = %w.name, handler = %w.config.handler, "handler is not deployed: messages wait until it is");
                    waiting_logged = true;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = changes.changed() => continue,
                }
            };
            waiting_logged = false;

            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => permit.expect("semaphore never closed"),
                _ = shutdown.cancelled() => break,
            };
            // Gather free slots for a moment so a busy queue leases in batches rather than
            // one message per round trip as single slots free up.
            let mut permits = vec![first];
            let gather_until = tokio::time::Instant::now() + GATHER;
            while permits.len() < batch {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) if permits.len() >= batch / 4 || last_lease_short => break,
                    Err(_) => {
                        match tokio::time::timeout_at(gather_until, slots.clone().acquire_owned())
                            .await
                        {
                            Ok(p) => permits.push(p.expect("semaphore never closed")),
                            Err(_) => break,
                        }
                    }
                }
            }

            if Instant::now() >= next_sweep {
                next_sweep = Instant::now() + sweep_every;
                w.sweep().await;
            }

            let (leased, checks) = match deliver::lease_and_check(&shared, permits.len() as u32)
                .await
            {
                Ok(leased) => {
                    if let Some(since) = store_failing_since.take() {
                        tracing::info!(queue = %w.name, "queue storage is answering again after {:?}", since.elapsed());
                    }
                    leased
                }
                Err(e) => {
                    if store_failing_since.is_none() {
                        tracing::error!(queue = %w.name, "leasing failed, retrying every second: {e}");
                        store_failing_since = Some(Instant::now());
                    }
                    drop(permits);
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            let got = leased.len();
            // A lease that came back short means the queue is drained: do not wait to batch.
            last_lease_short = got < permits.len();
            for ((message, check), permit) in leased.into_iter().zip(checks).zip(permits.drain(..))
            {
                shared
                    .in_flight
                    .lock()
                    .expect("in-flight set")
                    .insert(message.lease);
                tasks.spawn(deliver::process(
                    shared.clone(),
                    handler.clone(),
                    message,
                    check,
                    permit,
                ));
            }
            drop(permits);
            if got == 0 {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = w.wake.notified() => {}
                    _ = tokio::time::sleep(w.poll_interval) => {}
                }
            }
        }

        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        let leftover: Vec<Lease> = shared
            .in_flight
            .lock()
            .expect("in-flight set")
            .drain()
            .collect();
        if !leftover.is_empty() {
            let releases: Vec<Settlement> = leftover
                .iter()
                .map(|lease| Settlement::new(*lease, Disposition::Release))
                .collect();
            match w.store.settle(&releases).await {
                Ok(_) => {
                    tracing::warn!(queue = %w.name, count = releases.len(), "released messages still running after the shutdown grace period")
                }
                Err(e) => {
                    tracing::error!(queue = %w.name, "could not release in-flight messages, their leases will expire: {e}")
                }
            }
        }
    }
}

impl QueueWorker {
    /// Housekeeping between leases: expired leases, then retention.
    async fn sweep(&self) {
        let c = &self.config;
        match self
            .store
            .expire_leases(&self.name, c.max_attempts, c.retry_abandoned)
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(queue = %self.name, count = n, "handled messages whose lease expired")
            }
            Err(e) => tracing::debug!(queue = %self.name, "expired-lease sweep failed: {e}"),
        }
        let retention = Retention {
            max_age_ms: c.retention.age.map(|d| d.as_millis() as i64),
            max_count: c.retention.count,
            history_versions: c.retention.history_versions,
        };
        for _ in 0..10 {
            match self.store.purge(&self.name, &retention, PURGE_BATCH).await {
                Ok(n) if n == u64::from(PURGE_BATCH) => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(queue = %self.name, "retention pass failed: {e}");
                    break;
                }
            }
        }
    }
}

/// Longest a busy queue waits for more free slots before leasing.
const GATHER: Duration = Duration::from_millis(2);

/// Most processed messages deleted per retention statement.
const PURGE_BATCH: u32 = 1000;

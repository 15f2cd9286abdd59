//! The processing loop of one external queue: woken by activations (not by tight polling),
//! it claims the queue's activation and drains the provider's processing channel in
//! batches. Success settles the broker message without touching SQL; every other outcome
//! (retry later, transient failure, failure, a body that is not an envelope, a message
//! whose leases kept expiring) first moves the message into the SQL queue of the same name —
//! with its envelope, provider and MessageId — and only then settles it in the broker.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use super::settler::{SettleRequest, start_settler};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{ActivationStore, Envelope, EnvelopeError, ExternalLeased, ExternalPendingStorage};
use crate::config::QueueConfig;
use crate::dispatch::{InboxBinding, MOVED_FROM_HEADER, Precheck, check_keys, decide, transient};
use crate::enqueue::Enqueuer;
use crate::inbox::InboxKey;
use crate::queue::{Backoff, Disposition, NewMessage, QueueStore, Status, now_ms};
use crate::runtime::{HandlerRegistry, LoadedHandler, Message, Outcome};

/// Everything one external queue's loop needs.
pub struct ExternalWorker {
    /// Queue name.
    pub name: Arc<str>,
    /// The `[providers.NAME]` name.
    pub provider: String,
    /// The provider type, for metrics.
    pub kind: &'static str,
    /// Its configuration.
    pub config: QueueConfig,
    /// Where its pending messages live.
    pub storage: Arc<dyn ExternalPendingStorage>,
    /// Where its activations live.
    pub activations: Arc<dyn ActivationStore>,
    /// The SQL queue that receives failures and other non-pending states.
    pub sql: Arc<dyn QueueStore>,
    /// Raised for the SQL queue of the same name when a message moved into it.
    pub sql_wake: Arc<Notify>,
    /// Raised when this queue was activated in this process.
    pub wake: Arc<Notify>,
    /// Where its handler comes from.
    pub registry: Arc<HandlerRegistry>,
    /// What guest `enqueue` calls go to.
    pub enqueuer: Arc<dyn Enqueuer>,
    /// How often it looks for activations made by other hosts.
    pub poll_interval: Duration,
    /// The consumer inbox of this queue's endpoint, when enabled.
    pub inbox: Option<InboxBinding>,
}

impl ExternalWorker {
    /// Run until `shutdown`; in-flight messages get `grace` to finish (the rest return to
    /// the broker when their lease expires).
    pub async fn run(self, shutdown: CancellationToken, grace: Duration) {
        let me = Arc::new(self);
        let settler = start_settler(me.storage.clone(), me.name.to_string());
        let slots = Arc::new(Semaphore::new(me.config.concurrency.max(1) as usize));
        let batch = me.config.batch.min(me.config.concurrency).max(1);
        let mut tasks = JoinSet::new();
        let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut changes = me.registry.subscribe();
        'outer: loop {
            let Some(handler) = me.registry.get(&me.config.handler) else {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = changes.changed() => continue,
                }
            };
            match me.activations.claim(&me.name).await {
                Ok(true) => {}
                Ok(false) => {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = me.wake.notified() => {}
                        _ = tokio::time::sleep(me.poll_interval) => {}
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(queue = %me.name, "claiming the activation failed, retrying: {e}");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
            }
            // Drain until the processing channel is empty.
            loop {
                while tasks.try_join_next().is_some() {}
                let first = tokio::select! {
                    permit = slots.clone().acquire_owned() => permit.expect("semaphore never closed"),
                    _ = shutdown.cancelled() => break 'outer,
                };
                let mut permits = vec![first];
                while permits.len() < batch as usize {
                    match slots.clone().try_acquire_owned() {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                let lease_ms = me.config.lease.as_millis() as i64;
                let leased = match me
                    .storage
                    .lease(&me.name, permits.len() as u32, lease_ms)
                    .await
                {
                    Ok(leased) => leased,
                    Err(e) => {
                        tracing::warn!(queue = %me.name, provider = %me.provider, "leasing failed; the activation is retried: {e}");
                        let _ = me.activations.request(&[me.name.to_string()]).await;
                        tokio::select! {
                            _ = shutdown.cancelled() => break 'outer,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                        break;
                    }
                };
                if leased.is_empty() {
                    break;
                }
                let parsed: Vec<_> = leased
                    .into_iter()
                    .map(|m| {
                        let envelope = Envelope::parse(&m.body);
                        (m, envelope)
                    })
                    .collect();
                let checks = me.precheck(&parsed).await;
                for (((message, envelope), check), permit) in
                    parsed.into_iter().zip(checks).zip(permits.drain(..))
                {
                    let me = me.clone();
                    let handler = handler.clone();
                    let settler = settler.clone();
                    let in_flight = in_flight.clone();
                    let token = message.token.clone();
                    in_flight
                        .lock()
                        .expect("in-flight set")
                        .insert(token.clone());
                    tasks.spawn(async move {
                        me.process(&handler, message, envelope, check, &settler)
                            .await;
                        in_flight.lock().expect("in-flight set").remove(&token);
                        drop(permit);
                    });
                }
            }
        }
        let _ =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        // What did not finish goes back to the broker now, not when its lease expires.
        let leftover: Vec<String> = in_flight.lock().expect("in-flight set").drain().collect();
        if !leftover.is_empty() {
            match me.storage.release(&me.name, &leftover).await {
                Ok(n) => {
                    tracing::warn!(queue = %me.name, provider = %me.provider, count = n, "released messages still running after the shutdown grace period")
                }
                Err(e) => {
                    tracing::error!(queue = %me.name, provider = %me.provider, "could not release in-flight messages, their leases will expire: {e}")
                }
            }
        }
    }

    /// The inbox check of a leased batch, keyed on each envelope's MessageId: one round trip.
    async fn precheck(
        &self,
        batch: &[(ExternalLeased, Result<Envelope, EnvelopeError>)],
    ) -> Vec<Precheck> {
        let Some(binding) = &self.inbox else {
            return batch.iter().map(|_| Precheck::Bypass).collect();
        };
        let keys = batch
            .iter()
            .map(|(_, envelope)| {
                let id = envelope.as_ref().ok()?.message_id.as_deref();
                let Some(id) = id else {
                    tracing::warn!(queue = %self.name, endpoint = %binding.endpoint, "inbox bypassed: the envelope has no MessageId; the handler runs without deduplication");
                    return None;
                };
                match InboxKey::new(&binding.endpoint, id) {
                    Ok(key) => Some((key, None)),
                    Err(reason) => {
                        tracing::warn!(queue = %self.name, endpoint = %binding.endpoint, "inbox bypassed: {reason}; the handler runs without deduplication");
                        None
                    }
                }
            })
            .collect();
        check_keys(binding, keys).await
    }

    async fn process(
        &self,
        handler: &Arc<LoadedHandler>,
        leased: ExternalLeased,
        envelope: Result<Envelope, EnvelopeError>,
        check: Precheck,
        settler: &mpsc::Sender<SettleRequest>,
    ) {
        let envelope = match envelope {
            Ok(envelope) => envelope,
            Err(e) => {
                tracing::error!(queue = %self.name, provider = %self.provider, "moving a message that is not a valid envelope into the SQL queue as failed: {e}");
                self.move_and_settle(
                    &leased,
                    None,
                    Status::Failed,
                    None,
                    Some(e.to_string()),
                    settler,
                )
                .await;
                return;
            }
        };
        let max = self.config.max_attempts;
        if leased.attempt > max {
            let error = format!(
                "lease expired before the message was settled (attempt {} of {max}, no attempts left)",
                leased.attempt - 1
            );
            self.move_and_settle(
                &leased,
                Some(&envelope),
                Status::Failed,
                None,
                Some(error),
                settler,
            )
            .await;
            return;
        }
        let backoff = Backoff {
            base: self.config.backoff,
            max: self.config.max_backoff,
        };

        // The inbox check (made for the whole batch before the guests ran).
        let key = match check {
            Precheck::Bypass => None,
            Precheck::Failed(error) => {
                let disposition = transient(error, leased.attempt, max, backoff);
                self.apply(&leased, &envelope, disposition, settler).await;
                return;
            }
            Precheck::Checked(key, true) => {
                let binding = self
                    .inbox
                    .as_ref()
                    .expect("checked against the queue's inbox");
                tracing::info!(
                    name: "duplicate_detected", target: "wharf::inbox",
                    queue = %self.name, endpoint = %binding.endpoint, provider = self.kind,
                    message_id = %key.message_id,
                    "duplicate_detected: already processed on this endpoint, skipped without invoking the handler"
                );
                crate::metrics::duplicate_detected(&binding.endpoint, &self.name, self.kind);
                self.settle(&leased, &envelope, settler).await;
                return;
            }
            Precheck::Checked(key, false) => self.inbox.as_ref().map(|b| (b, key)),
        };

        let message = Message {
            queue: self.name.to_string(),
            id: envelope.message_id.clone(),
            delivery_id: envelope.message_id.clone().unwrap_or_default(),
            payload: envelope.message_json.clone(),
            priority: envelope.priority,
            attempt: leased.attempt,
            max_attempts: max,
            enqueued_at_ms: 0,
            headers: Vec::new(),
        };
        let result =
            crate::runtime::invoke(handler, message, self.config.timeout, self.enqueuer.clone())
                .await;
        let mut disposition = decide(&result, leased.attempt, max, backoff);
        if let (Some((binding, key)), Ok(Ok(Outcome::Completed))) = (&key, &result)
            && let Err(e) = binding.recorder.record(vec![key.clone()]).await
        {
            disposition = transient(
                format!("inbox record failed after the handler succeeded: {e}"),
                leased.attempt,
                max,
                backoff,
            );
        }
        self.apply(&leased, &envelope, disposition, settler).await;
    }

    async fn apply(
        &self,
        leased: &ExternalLeased,
        envelope: &Envelope,
        disposition: Disposition,
        settler: &mpsc::Sender<SettleRequest>,
    ) {
        match disposition {
            Disposition::Complete => self.settle(leased, envelope, settler).await,
            // Left leased: the message returns to the broker when its lease expires.
            Disposition::Release => {}
            Disposition::Retry { at_ms, error } => {
                self.move_and_settle(
                    leased,
                    Some(envelope),
                    Status::Sleeping,
                    Some(at_ms),
                    error,
                    settler,
                )
                .await
            }
            Disposition::Fail { error } => {
                self.move_and_settle(
                    leased,
                    Some(envelope),
                    Status::Failed,
                    None,
                    Some(error),
                    settler,
                )
                .await
            }
        }
    }

    async fn settle(
        &self,
        leased: &ExternalLeased,
        envelope: &Envelope,
        settler: &mpsc::Sender<SettleRequest>,
    ) {
        let (reply, rx) = oneshot::channel();
        if settler
            .send(((leased.token.clone(), envelope.message_id.clone()), reply))
            .await
            .is_err()
        {
            return;
        }
        if let Ok(false) = rx.await {
            tracing::warn!(queue = %self.name, provider = %self.provider, "lease was lost (it expired and the message returned): this outcome was not applied");
        }
    }

    /// Move the message into the SQL queue (`status`, due at `at_ms`, with `error`), then
    /// settle it in the broker. If the move fails the broker message stays leased and
    /// returns when its lease expires: nothing is lost.
    async fn move_and_settle(
        &self,
        leased: &ExternalLeased,
        envelope: Option<&Envelope>,
        status: Status,
        at_ms: Option<i64>,
        error: Option<String>,
        settler: &mpsc::Sender<SettleRequest>,
    ) {
        let payload = match envelope {
            Some(e) => e.message_json.clone(),
            // The raw body, kept as a JSON string so the SQL queue can hold it.
            None => serde_json::Value::String(leased.body.clone()).to_string(),
        };
        let id = envelope.and_then(|e| e.message_id.clone());
        let status = match status {
            // Sleeping is where the SQL queue puts a message due later; pending when due.
            Status::Sleeping => None,
            other => Some(other),
        };
        let message = NewMessage {
            id: id.clone(),
            payload,
            priority: envelope.map_or(0, |e| e.priority),
            process_at_ms: Some(at_ms.unwrap_or_else(now_ms)),
            headers: vec![
                (MOVED_FROM_HEADER.to_string(), self.provider.clone()),
                ("wharf.envelope".to_string(), leased.body.clone()),
            ],
            status,
            last_error: error,
            source_delivery_id: id.clone(),
        };
        match self.sql.enqueue(&self.name, message, false).await {
            Ok(_) => {
                self.sql_wake.notify_one();
                let (reply, rx) = oneshot::channel();
                if settler
                    .send(((leased.token.clone(), id), reply))
                    .await
                    .is_ok()
                {
                    let _ = rx.await;
                }
            }
            Err(e) => {
                tracing::error!(queue = %self.name, provider = %self.provider, "could not move a message into the SQL queue; it returns to the broker when its lease expires: {e}");
            }
        }
    }
}

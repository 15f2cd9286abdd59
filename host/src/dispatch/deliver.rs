//! One delivery of a received message: consumer-inbox check, guest call, outcome, inbox
//! record (only after the guest succeeded), settlement. The inbox is consulted by the host, never by
//! the guest; a store failure at the check or the record is a transient failure of the
//! attempt, never a duplicate.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::effects::{self, CommitError, ForSettlement, STATE_RERUNS, Staging};
use super::outcome::{decide, transient};
use super::recorder::Recorder;
use super::{Pipeline, Settled, Shared, Source, Verdict, Work};
use crate::inbox::{InboxKey, InboxStore};
use crate::metrics::MessageOutcome;
use crate::queue::{Backoff, Disposition};
use crate::runtime::{CallEffects, InvokeError, LoadedHandler, Outcome, StateCall};
use crate::telemetry::{Delivery, Destination, Processing, SQL_SYSTEM, SpanId, TraceId};

/// How a completion by a pending handoff is named (the message's `outcome`).
pub(crate) const PENDING_HANDOFF: &str = "pending-handoff";

/// A queue's consumer inbox.
#[derive(Clone)]
pub struct InboxBinding {
    /// Where records live.
    pub store: Arc<dyn InboxStore>,
    /// Batches records into the store.
    pub recorder: Recorder,
    /// The endpoint the records are keyed on.
    pub endpoint: String,
    /// How long a record is kept.
    pub retention: Duration,
    /// The store's table when it lives in the queue database
    /// ([`InboxStore::queue_database_table`], asked once).
    pub queue_table: Option<std::sync::Arc<str>>,
}

/// The inbox check of one message, done for the whole leased batch at once.
#[derive(Debug, Clone)]
pub(crate) enum Precheck {
    /// The queue has no inbox, or the message id cannot be deduplicated.
    Bypass,
    /// Checked: whether it was already processed.
    Checked(InboxKey, bool),
    /// The check failed.
    Failed(String),
}

pub use crate::headers::MOVED_FROM as MOVED_FROM_HEADER;

/// Check a received batch against the queue's inbox: with what the source already knew, and
/// the rest in one round trip.
pub(crate) async fn precheck<S: Source>(
    shared: &Shared<S>,
    batch: &[Work<S::Handle>],
) -> Vec<Precheck> {
    let p = &shared.pipeline;
    let Some(binding) = &p.inbox else {
        return batch.iter().map(|_| Precheck::Bypass).collect();
    };
    let keys: Vec<Option<(InboxKey, Option<bool>)>> = batch
        .iter()
        .map(|work| {
            let ids = work.inbox.as_ref()?;
            match InboxKey::new(&binding.endpoint, &ids.check) {
                Ok(key) => Some((key, ids.seen)),
                Err(reason) => {
                    tracing::warn!(queue = %p.name, endpoint = %binding.endpoint, delivery = %work.label, "inbox bypassed: {reason}; the handler runs without deduplication");
                    None
                }
            }
        })
        .collect();
    check_keys(binding, keys).await
}

/// Resolve the inbox check of a batch: `keys` holds, per message, its key and whether it
/// was already checked (`Some(seen)`), or `None` for a message that bypasses the inbox.
/// Unchecked keys are checked in one round trip; a failure fails only those.
pub(crate) async fn check_keys(
    binding: &InboxBinding,
    keys: Vec<Option<(InboxKey, Option<bool>)>>,
) -> Vec<Precheck> {
    let unchecked: Vec<InboxKey> = keys
        .iter()
        .flatten()
        .filter(|(_, seen)| seen.is_none())
        .map(|(key, _)| key.clone())
        .collect();
    let checked = if unchecked.is_empty() {
        Ok(Vec::new())
    } else {
        binding.store.check_many(&unchecked).await
    };
    let mut found = match checked {
        Ok(found) => found.into_iter(),
        Err(e) => {
            let text = format!("inbox check failed: {e}");
            return keys
                .iter()
                .map(|k| match k {
                    Some((_, None)) => Precheck::Failed(text.clone()),
                    Some((key, Some(seen))) => Precheck::Checked(key.clone(), *seen),
                    None => Precheck::Bypass,
                })
                .collect();
        }
    };
    keys.into_iter()
        .map(|k| match k {
            Some((key, Some(seen))) => Precheck::Checked(key, seen),
            Some((key, None)) => Precheck::Checked(key, found.next().unwrap_or(false)),
            None => Precheck::Bypass,
        })
        .collect()
}

/// Process one received message and settle it, under its `process` span when traces are
/// on (the delivery's log lines then carry its trace and span ids).
pub(crate) async fn process<S: Source>(
    shared: Arc<Shared<S>>,
    handler: Arc<LoadedHandler>,
    seq: u64,
    work: Work<S::Handle>,
    check: Precheck,
    received: Instant,
    permit: OwnedSemaphorePermit,
) {
    let p = &shared.pipeline;
    let provider = shared.source.provider();
    let at = Destination {
        queue: &p.name,
        system: if provider == "sql" {
            SQL_SYSTEM
        } else {
            provider
        },
    };
    let delivery = Delivery {
        message_id: work.message.id.as_deref(),
        headers: &work.message.headers,
        attempt: work.message.attempt,
        group: shared.source.consumer_group(),
    };
    let trace = Processing::start(at, &delivery);
    deliver(shared, handler, seq, work, check, received, permit, trace).await
}

/// [`process`], its span started.
#[allow(clippy::too_many_arguments)]
async fn deliver<S: Source>(
    shared: Arc<Shared<S>>,
    handler: Arc<LoadedHandler>,
    seq: u64,
    mut work: Work<S::Handle>,
    check: Precheck,
    received: Instant,
    permit: OwnedSemaphorePermit,
    trace: Option<Processing>,
) {
    let p = &shared.pipeline;
    let attempt = work.message.attempt;
    let enqueued_at_ms = work.message.enqueued_at_ms;
    let max = p.config.max_attempts;
    let backoff = Backoff {
        base: p.config.backoff,
        max: p.config.max_backoff,
    };
    let failed = |error: String| transient(error, attempt, max, backoff);
    let verdict = |disposition: Disposition, outcome: Option<&'static str>| Verdict {
        disposition,
        outcome,
        inbox: None,
        follow_ups: Vec::new(),
        state: Vec::new(),
        on_conflict: Disposition::Release,
        attempt,
    };

    // 0–1. Decided without running the guest: by the source, or by the inbox.
    let inbox = match before_the_guest(
        &shared,
        &work.label,
        work.decided.take(),
        check,
        attempt,
        trace.as_ref(),
        &failed,
    ) {
        Ok(inbox) => inbox,
        Err(disposition) => {
            let (disposition, outcome) = disposition;
            if let Some(trace) = &trace {
                trace_outcome(trace, &disposition, outcome, None);
            }
            finish(
                &shared,
                seq,
                work.handle,
                verdict(disposition, outcome),
                permit,
                trace,
            )
            .await;
            return;
        }
    };

    // 2. The guest, its follow-ups staged.
    let record_ids = work.inbox.map(|ids| ids.record).unwrap_or_default();
    let started = std::time::Instant::now();
    let start_by = start_by(received, p.config.lease, p.config.timeout);
    let mark = shared.source.commit_mark(&work.handle);
    let delivery = match (work.message.delivery_id.as_str(), &mark) {
        ("", Some(mark)) => mark.as_str(),
        (id, _) => id,
    };
    let staging = Staging::new(p.enqueuer.clone(), delivery);
    let delivery = delivery.to_string();
    let state = (!handler.grants.keyvalue.is_empty()).then(|| {
        StateCall::new(
            p.state.clone(),
            handler.name.clone(),
            handler.grants.keyvalue.clone(),
        )
    });
    let effects = CallEffects {
        enqueuer: staging.clone(),
        state: state.clone(),
        trace: trace.as_ref().map(|t| t.context().clone()),
    };
    let result = crate::runtime::invoke_starting_by(
        &handler,
        work.message,
        p.config.timeout,
        start_by,
        effects,
    )
    .await;
    crate::metrics::handler_call(&p.name, started.elapsed());
    shared.call_time.observe(started.elapsed());
    let mut disposition = decide(&result, attempt, max, backoff);
    if let Err(e @ InvokeError::NoInstance(_)) = &result {
        tracing::warn!(queue = %p.name, handler = %p.handler, delivery = %work.label, attempt, "{e}: the message goes back without counting the attempt (raise host.max_instances, or lower the concurrency of the queues that share it)");
    }
    let outcome = match &result {
        Ok(Ok(Outcome::PendingHandoff)) => Some(PENDING_HANDOFF),
        Ok(Ok(Outcome::Completed)) => Some("completed"),
        _ => None,
    };

    // 3. Effects, only after the guest succeeded: its follow-ups, and the inbox record
    // (not for a pending handoff).
    let mut effects = ForSettlement::default();
    let mut error_type = error_type(&result);
    // A state conflict runs the message again uncounted, up to a bound; then it is counted.
    let reruns = shared.state_conflicts.reruns(&delivery);
    let on_conflict = |key: &str| match reruns < STATE_RERUNS {
        true => Disposition::Release,
        false => failed(format!("state conflict on {key}")),
    };
    if outcome.is_some() {
        let record_into = inbox.filter(|_| outcome == Some("completed"));
        let writes = state.map(|s| s.take()).unwrap_or_default();
        match effects::commit(
            &shared,
            record_into,
            &record_ids,
            mark,
            staging.take(),
            writes,
        )
        .await
        {
            Ok(left) => effects = left,
            Err(CommitError::StateConflict(key)) => {
                shared.state_conflicts.conflicted(&p.name, &delivery, &key);
                disposition = on_conflict(&key);
                error_type = Some("state-conflict");
            }
            Err(CommitError::Failed(e)) => {
                disposition = failed(e);
                error_type = Some("commit-failed");
            }
        }
    }

    // 4. Settle.
    log(p, &work.label, attempt, &disposition, trace.as_ref());
    if let Some(trace) = &trace {
        trace_outcome(trace, &disposition, outcome, error_type);
    }
    let complete = disposition == Disposition::Complete;
    if let (true, Some(binding)) = (complete && effects.recorded > 0, inbox) {
        crate::metrics::inbox_recorded(&binding.endpoint, effects.recorded);
    }
    if matches!(
        disposition,
        Disposition::Complete | Disposition::Fail { .. }
    ) {
        crate::metrics::settled(&p.name, enqueued_at_ms);
    }
    let after = After {
        targets: effects.follow_ups.iter().map(|f| f.queue.clone()).collect(),
        record: inbox.cloned().zip(Some(effects.record_after)),
        delivery,
    };
    let verdict = Verdict {
        disposition,
        outcome: outcome.filter(|_| complete),
        inbox: effects.inbox.filter(|_| complete),
        follow_ups: effects.follow_ups,
        on_conflict: on_conflict("{key}"),
        state: effects.state,
        attempt,
    };
    finish_then(&shared, seq, work.handle, verdict, permit, after, trace).await;
}

/// The `error.type` of a call that did not succeed.
fn error_type(result: &crate::runtime::InvokeResult) -> Option<&'static str> {
    Some(match result {
        Ok(Ok(_)) => return None,
        Ok(Err(_)) => "handler-error",
        Err(InvokeError::Trap(_)) => "trap",
        Err(InvokeError::Timeout(_)) => "timeout",
        Err(InvokeError::MemoryLimit(_)) => "memory-limit",
        Err(InvokeError::Instantiate(_)) => "instantiate",
        Err(InvokeError::NoInstance(_)) => "no-instance",
    })
}

/// Record a delivery's outcome on its `process` span.
fn trace_outcome(
    trace: &Processing,
    disposition: &Disposition,
    outcome: Option<&'static str>,
    error_type: Option<&'static str>,
) {
    let (word, error) = match disposition {
        Disposition::Complete => (outcome.unwrap_or("completed"), None),
        Disposition::HandOff => ("handed-off", None),
        Disposition::Release => ("released", None),
        Disposition::Retry { error, .. } => ("retried", error.as_deref()),
        Disposition::Fail { error } => ("failed", Some(error.as_str())),
    };
    let error = error.map(|text| (error_type.unwrap_or("error"), text));
    trace.outcome(word, error);
}

/// What follows an applied settlement that wrote follow-ups: waking their queues in this
/// process, and the inbox records left for after it.
#[derive(Default)]
struct After {
    /// The follow-ups' queues.
    targets: Vec<String>,
    /// An inbox outside the queue database and the keys to record there.
    record: Option<(InboxBinding, Vec<InboxKey>)>,
    /// The delivery (its state conflicts are counted under it).
    delivery: String,
}

/// Steps 0 and 1, before the guest: what the source decided (unless the inbox knows the
/// message already succeeded here — its settlement was lost after its last attempt: a
/// duplicate is skipped, never failed), then the inbox check made for the whole batch. `Ok`
/// runs the guest (with the inbox binding to record into); `Err` settles with that
/// disposition and outcome without running it.
fn before_the_guest<'s, S: Source>(
    shared: &'s Shared<S>,
    label: &str,
    decided: Option<Disposition>,
    check: Precheck,
    attempt: u32,
    trace: Option<&Processing>,
    failed: &dyn Fn(String) -> Disposition,
) -> Result<Option<&'s InboxBinding>, (Disposition, Option<&'static str>)> {
    let p = &shared.pipeline;
    let duplicate = matches!(check, Precheck::Checked(_, true));
    if let (false, Some(disposition)) = (duplicate, decided) {
        log(p, label, attempt, &disposition, trace);
        return Err((disposition, None));
    }
    match check {
        Precheck::Bypass => Ok(None),
        Precheck::Failed(error) => {
            let disposition = failed(error);
            log(p, label, attempt, &disposition, trace);
            Err((disposition, None))
        }
        Precheck::Checked(key, true) => {
            let binding = p.inbox.as_ref().expect("checked against the queue's inbox");
            crate::metrics::inbox_checked(&binding.endpoint, 1);
            let provider = shared.source.provider();
            tracing::info!(
                name: "duplicate_detected", target: "wharf::inbox",
                queue = %p.name, endpoint = %binding.endpoint, provider,
                delivery = %label, message_id = %key.message_id,
                "duplicate_detected: already processed on this endpoint, skipped without invoking the handler"
            );
            crate::metrics::duplicate_detected(&binding.endpoint, &p.name, provider);
            crate::metrics::message(&p.name, MessageOutcome::Duplicate);
            Err((Disposition::Complete, Some("skipped: duplicate")))
        }
        Precheck::Checked(_, false) => {
            let binding = p.inbox.as_ref().expect("checked against the queue's inbox");
            crate::metrics::inbox_checked(&binding.endpoint, 1);
            Ok(Some(binding))
        }
    }
}

/// The latest moment a message received at `received` may start its handler call: three
/// quarters of what its `lease` leaves beyond the handler's `timeout`, so a call that waited
/// for a free instance until then still ends, and is settled, before the lease runs out.
fn start_by(received: Instant, lease: Duration, timeout: Duration) -> Instant {
    received + lease.saturating_sub(timeout) * 3 / 4
}

/// Settle in a task of its own that the end of the shutdown grace does not abort: a
/// settlement cut in half (moved into SQL, not yet acknowledged) would leave the message in
/// two places. Once settling, the message is no longer handed back at shutdown.
///
/// The processing slot (`permit`) is handed back as soon as a settling slot is free, so the
/// next message starts while this outcome is written: a queue's `concurrency` bounds the
/// handlers running, and at most [`super::SETTLING_PER_SLOT`] times as many outcomes wait for
/// their write.
async fn finish<S: Source>(
    shared: &Arc<Shared<S>>,
    seq: u64,
    handle: S::Handle,
    verdict: Verdict,
    permit: OwnedSemaphorePermit,
    trace: Option<Processing>,
) {
    finish_then(
        shared,
        seq,
        handle,
        verdict,
        permit,
        After::default(),
        trace,
    )
    .await
}

/// [`finish`], then what follows an applied settlement ([`After`]). The `settle {queue}`
/// span lasts until the source applied the outcome; the `process` span ends with it.
async fn finish_then<S: Source>(
    shared: &Arc<Shared<S>>,
    seq: u64,
    handle: S::Handle,
    verdict: Verdict,
    permit: OwnedSemaphorePermit,
    after: After,
    trace: Option<Processing>,
) {
    shared.in_flight.lock().expect("in-flight set").remove(&seq);
    let settling = shared.clone();
    let task = shared.settling.spawn(async move {
        let _settling_slot = settling
            .settling_slots
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        // The outcome takes its place in the source's settlement line (the first poll hands
        // it over) before the slot goes to the next message: so one slot's outcomes, and
        // their follow-ups, are written in the order the handler ran them, even when this
        // thread is descheduled right after the slot is given back.
        let p = &settling.pipeline;
        let settle_span = trace
            .as_ref()
            .and_then(|t| crate::telemetry::child(t.context(), crate::telemetry::name("settle ", &p.name)));
        let mut settle = std::pin::pin!(settling.source.settle(handle, verdict));
        let first = std::future::poll_fn(|cx| Poll::Ready(settle.as_mut().poll(cx))).await;
        drop(permit);
        let settled = match first {
            Poll::Ready(settled) => settled,
            Poll::Pending => settle.await,
        };
        drop(settle_span);
        if let Some(trace) = trace {
            trace.end();
        }
        match settled {
            Settled::Applied => settling.state_conflicts.settled(&after.delivery),
            Settled::NotApplied => return,
            Settled::StateConflict(key) => {
                return settling
                    .state_conflicts
                    .conflicted(&p.name, &after.delivery, &key);
            }
        }
        for queue in &after.targets {
            p.enqueuer.ready(queue);
        }
        if let Some((binding, keys)) = after.record.filter(|(_, keys)| !keys.is_empty())
            && let Err(e) = binding.recorder.record(keys).await
        {
            tracing::warn!(queue = %p.name, endpoint = %binding.endpoint, "inbox record failed after the message and its follow-ups were settled; it is processed, but a resubmission would run it again: {e}");
        }
    });
    let _ = task.await;
}

/// Log a delivery's disposition and count it in `wharf_messages_total`.
fn log(
    p: &Pipeline,
    label: &str,
    attempt: u32,
    disposition: &Disposition,
    trace: Option<&Processing>,
) {
    // Written only for a line that is logged.
    let trace_id = trace.map(|t| tracing::field::display(TraceId(t.context())));
    let span_id = trace.map(|t| tracing::field::display(SpanId(t.context())));
    let queue = &p.name;
    crate::metrics::message(
        queue,
        match disposition {
            Disposition::Complete | Disposition::HandOff => MessageOutcome::Processed,
            Disposition::Retry { .. } => MessageOutcome::Retried,
            Disposition::Fail { .. } => MessageOutcome::Failed,
            Disposition::Release => MessageOutcome::Released,
        },
    );
    let handler = &*p.handler;
    match disposition {
        Disposition::Complete => {
            tracing::debug!(%queue, handler, delivery = %label, attempt, trace_id, span_id, "message processed")
        }
        Disposition::Retry {
            error: Some(error),
            at_ms,
        } => {
            tracing::warn!(%queue, handler, delivery = %label, attempt, trace_id, span_id, retry_at_ms = at_ms, "attempt failed, will retry: {error}")
        }
        Disposition::Retry { error: None, at_ms } => {
            tracing::debug!(%queue, handler, delivery = %label, attempt, trace_id, span_id, retry_at_ms = at_ms, "handler asked to run again later")
        }
        Disposition::Fail { error } => {
            tracing::error!(%queue, handler, delivery = %label, attempt, trace_id, span_id, "message failed: {error}")
        }
        Disposition::Release => {
            tracing::debug!(%queue, handler, delivery = %label, attempt, trace_id, span_id, "message released unprocessed")
        }
        Disposition::HandOff => {
            tracing::info!(%queue, handler, delivery = %label, attempt, trace_id, span_id, "message handed off: its session waits until it is settled")
        }
    }
}

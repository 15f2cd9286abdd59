//! The poll thread of a processing consumer: it keeps the consumer in its group while
//! handlers run, fetches messages into the buffer (waiting while the buffer is full, pausing
//! the partitions only when the host stops taking messages or shuts down), stores the
//! delivered marks before fetched messages can be handed out, and commits the settled
//! prefix of each partition.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};

use super::consumer::Shared;
use super::error;
use super::rebalance::Context;
use crate::external::{Delivery, DeliveryCount, Handle};

/// How long one poll waits for a message (and so how soon settled offsets are committed).
pub(super) const POLL: Duration = Duration::from_millis(50);
/// Most messages fetched before they are registered and buffered together.
pub(super) const CHUNK: usize = 512;
/// How often a consumer in trouble checks whether the broker answers again.
const RECHECK: Duration = Duration::from_secs(1);
/// Longest the poll thread waits for the host to take buffered messages before it polls
/// again (it must poll now and then to stay in its group and serve rebalances).
const ROOM_WAIT: Duration = Duration::from_millis(100);

/// One fetched message; its handle, enough to hand it out again.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) generation: u64,
    body: Bytes,
    headers: Vec<(String, String)>,
    timestamp_ms: Option<i64>,
    identity: String,
}

impl Record {
    pub(super) fn delivery(self: &Arc<Self>, replay: bool) -> Delivery {
        Delivery {
            handle: Handle::new(self.clone()),
            body: self.body.clone(),
            count: DeliveryCount::Redelivered(replay),
            identity: Some(self.identity.clone()),
            enqueued_at_ms: self.timestamp_ms,
            headers: self.headers.clone(),
            // The record key: what picked the partition, so one key keeps its order.
            session: self
                .headers
                .iter()
                .find(|(k, _)| k == KEY_HEADER)
                .map(|(_, v)| v.clone()),
        }
    }
}

/// The header that carries a record's key, as text.
const KEY_HEADER: &str = "kafka-key";

/// A fetched message not registered yet.
struct Fetched {
    partition: i32,
    offset: i64,
    body: Bytes,
    headers: Vec<(String, String)>,
    timestamp_ms: Option<i64>,
}

fn fetched(m: &BorrowedMessage<'_>) -> Fetched {
    let mut headers = Vec::new();
    if let Some(key) = m.key() {
        headers.push((
            KEY_HEADER.to_string(),
            String::from_utf8_lossy(key).into_owned(),
        ));
    }
    headers.push(("kafka-partition".to_string(), m.partition().to_string()));
    headers.push(("kafka-offset".to_string(), m.offset().to_string()));
    if let Some(hs) = m.headers() {
        for h in hs.iter() {
            let value = h.value.map(String::from_utf8_lossy).unwrap_or_default();
            headers.push((h.key.to_string(), value.into_owned()));
        }
    }
    Fetched {
        partition: m.partition(),
        offset: m.offset(),
        body: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
        headers,
        timestamp_ms: m.timestamp().to_millis(),
    }
}

/// The poll thread's loop, until the consumer closes.
pub(super) fn poll_loop(consumer: BaseConsumer<Context>, shared: Arc<Shared>) {
    let mut flow_state = Flow::default();
    let mut last_check = Instant::now();
    while !shared.closing.load(Ordering::Acquire) {
        wait_for_room(&shared);
        flow(&consumer, &shared, &mut flow_state);
        let mut chunk = Vec::new();
        let mut wait = POLL;
        while chunk.len() < CHUNK {
            match consumer.poll(wait) {
                Some(Ok(m)) => chunk.push(fetched(&m)),
                Some(Err(e)) => {
                    shared.failed(&error(e));
                    break;
                }
                None => break,
            }
            wait = Duration::ZERO;
        }
        if !chunk.is_empty() {
            shared.recovered();
            // Fetched after shutdown began (already on its way when the partitions were
            // paused): left uncommitted and unmarked, for the next run.
            if !shared.stopped.load(Ordering::Acquire) {
                accept(&consumer, &shared, chunk);
            }
        }
        let commits = shared.tracker.lock().expect("tracker").commits();
        shared.commit(&consumer, commits, CommitMode::Async);
        if shared.has_error() && last_check.elapsed() >= RECHECK {
            last_check = Instant::now();
            if consumer
                .fetch_metadata(Some(&shared.topic), RECHECK)
                .is_ok_and(|m| m.topics().iter().any(|t| t.error().is_none()))
            {
                shared.recovered();
            }
        }
    }
    let commits = shared.tracker.lock().expect("tracker").commits();
    shared.commit(&consumer, commits, CommitMode::Sync);
    consumer.unsubscribe();
    // Dropping the consumer leaves the group (its revocation finds nothing running).
}

/// Wait (briefly) while the buffer is full: the host takes messages faster than a paused
/// partition would resume fetching.
fn wait_for_room(shared: &Shared) {
    let buffer = shared.buffer.lock().expect("buffer");
    if buffer.len() >= shared.cap {
        let _ = shared.taken.wait_timeout_while(buffer, ROOM_WAIT, |b| {
            b.len() >= shared.cap / 2 && !shared.closing.load(Ordering::Acquire)
        });
    }
}

/// Whether the poll thread paused its partitions, and for which assignment it last made
/// sure they fetch.
#[derive(Default)]
struct Flow {
    /// Paused, at this count of assignments.
    paused: Option<u64>,
    /// The count of assignments when the partitions were last resumed.
    resumed: u64,
}

/// Pause the partitions while the host is shutting down, or while the buffer is far over its
/// size (the host stopped taking messages: a handler hangs, or none is deployed); resume
/// once it is back under it. A partition revoked while paused and assigned again keeps the
/// pause librdkafka recorded (it would never fetch again), so every new assignment that
/// should flow is resumed once.
fn flow(consumer: &BaseConsumer<Context>, shared: &Shared, state: &mut Flow) {
    let buffered = shared.buffer.lock().expect("buffer").len();
    let limit = if state.paused.is_some() {
        shared.cap
    } else {
        shared.cap * 4
    };
    let want = shared.stopped.load(Ordering::Acquire) || buffered >= limit;
    let generations = shared.tracker.lock().expect("tracker").generations();
    let Ok(assignment) = consumer.assignment() else {
        return;
    };
    match (state.paused, want) {
        (Some(g), true) if g == generations => {}
        (_, true) => {
            let _ = consumer.pause(&assignment);
            state.paused = Some(generations);
        }
        (Some(_), false) => {
            let _ = consumer.resume(&assignment);
            state.paused = None;
            state.resumed = generations;
        }
        (None, false) if state.resumed != generations => {
            let _ = consumer.resume(&assignment);
            state.resumed = generations;
        }
        (None, false) => {}
    }
}

/// Register fetched messages, store the delivered marks, then buffer them.
fn accept(consumer: &BaseConsumer<Context>, shared: &Shared, chunk: Vec<Fetched>) {
    let mut tracker = shared.tracker.lock().expect("tracker");
    let records: Vec<(Arc<Record>, bool)> = chunk
        .into_iter()
        .filter_map(|f| {
            let known = tracker.fetched(f.partition, f.offset)?;
            let record = Record {
                identity: format!("{}/{}/{}", shared.topic, f.partition, f.offset),
                partition: f.partition,
                offset: f.offset,
                generation: known.generation,
                body: f.body,
                headers: f.headers,
                timestamp_ms: f.timestamp_ms,
            };
            Some((Arc::new(record), known.replay))
        })
        .collect();
    let behind = tracker.marks_behind();
    drop(tracker);
    if !behind.is_empty() {
        let marks = &consumer.context().marks;
        if let Err(e) = marks.commit(&shared.tpl(behind), CommitMode::Sync) {
            tracing::warn!(queue = %shared.queue, "storing how far the group fetched failed; a crash now would not count these deliveries: {e}");
        }
    }
    shared.buffer.lock().expect("buffer").extend(records);
    shared.arrived.notify_one();
}

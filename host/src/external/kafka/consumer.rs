//! The processing consumer of one Kafka queue. A poll thread of its own keeps the consumer
//! in its group while handlers run: it fetches messages into a buffer (pausing its
//! partitions while the buffer is full or the host is shutting down), stores the delivered
//! marks before a fetched message can be handed out, commits the settled prefix of each
//! partition, and serves rebalances — on revocation it drops the partition's buffered
//! messages, waits up to the grace for its running ones, commits what is contiguous and
//! releases it. `receive` hands buffered messages out; `ack`, `nack` and `holds` work on the
//! [`Tracker`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::offsets::{Commit, Tracker};
use super::{ADMIN_TIMEOUT, KafkaSettings, Quiet, error, is_outage};
use crate::external::{Consumer, Delivery, DeliveryCount, ErrorKind, Handle, Nack, ProviderError};

/// How long one poll waits for a message (and so how soon settled offsets are committed).
const POLL: Duration = Duration::from_millis(50);
/// Most messages fetched before they are registered and buffered together.
const CHUNK: usize = 512;
/// How often a consumer in trouble checks whether the broker answers again.
const RECHECK: Duration = Duration::from_secs(1);
/// Longest the poll thread waits for the host to take buffered messages before it polls
/// again (it must poll now and then to stay in its group and serve rebalances).
const ROOM_WAIT: Duration = Duration::from_millis(100);

/// One fetched message; its handle, enough to hand it out again.
#[derive(Debug)]
struct Record {
    partition: i32,
    offset: i64,
    generation: u64,
    body: Bytes,
    headers: Vec<(String, String)>,
    timestamp_ms: Option<i64>,
    identity: String,
}

impl Record {
    fn delivery(self: &Arc<Self>, replay: bool) -> Delivery {
        Delivery {
            handle: Handle::new(self.clone()),
            body: self.body.clone(),
            count: DeliveryCount::Redelivered(replay),
            identity: Some(self.identity.clone()),
            enqueued_at_ms: self.timestamp_ms,
            headers: self.headers.clone(),
        }
    }
}

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
            "kafka-key".to_string(),
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

/// What the poll thread, the rebalance callbacks and the host share.
struct Shared {
    topic: String,
    queue: String,
    grace: Duration,
    /// Buffered messages above which the poll thread waits for the host to take some.
    cap: usize,
    tracker: Mutex<Tracker>,
    /// Signalled when a handed-out message is settled or handed back.
    settled: Condvar,
    /// Fetched messages not handed out, with whether each is a replay.
    buffer: Mutex<VecDeque<(Arc<Record>, bool)>>,
    /// Signalled when the host took buffered messages.
    taken: Condvar,
    arrived: Notify,
    stopped: AtomicBool,
    closing: AtomicBool,
    error: Mutex<Option<(ErrorKind, String)>>,
}

impl Shared {
    fn failed(&self, e: &ProviderError) {
        let mut error = self.error.lock().expect("error");
        if error.is_none() {
            tracing::debug!(queue = %self.queue, "kafka consumer: {e}");
        }
        *error = Some((e.kind, e.message.clone()));
        drop(error);
        self.arrived.notify_one();
    }

    fn recovered(&self) {
        self.error.lock().expect("error").take();
    }

    fn has_error(&self) -> bool {
        self.error.lock().expect("error").is_some()
    }

    fn tpl(&self, offsets: impl IntoIterator<Item = (i32, i64)>) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in offsets {
            tpl.add_partition_offset(&self.topic, partition, Offset::Offset(offset))
                .expect("a valid offset");
        }
        tpl
    }

    fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        commits: Vec<Commit>,
        mode: CommitMode,
    ) {
        if commits.is_empty() {
            return;
        }
        let tpl = self.tpl(commits.iter().map(|c| (c.partition, c.offset)));
        if let Err(e) = consumer.commit(&tpl, mode) {
            tracing::warn!(queue = %self.queue, "committing processing offsets failed (the messages are delivered again): {e}");
            let mut tracker = self.tracker.lock().expect("tracker");
            for c in commits {
                tracker.commit_failed(c.partition);
            }
        }
    }

    /// Partitions were revoked: drop their buffered messages, give their running ones the
    /// grace, commit the settled prefix and forget them.
    fn revoke<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, partitions: &[i32]) {
        self.buffer
            .lock()
            .expect("buffer")
            .retain(|(r, _)| !partitions.contains(&r.partition));
        let deadline = Instant::now() + self.grace;
        let mut tracker = self.tracker.lock().expect("tracker");
        while tracker.out(partitions) > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            tracker = self.settled.wait_timeout(tracker, left).expect("tracker").0;
        }
        let running = tracker.out(partitions);
        let commits = tracker.revoke(partitions);
        drop(tracker);
        if running > 0 {
            tracing::info!(queue = %self.queue, running, "partitions revoked while messages still run: they are delivered again to the new owner");
        }
        tracing::info!(queue = %self.queue, topic = %self.topic, partitions = ?partitions, "kafka partitions revoked");
        self.commit(consumer, commits, CommitMode::Sync);
    }

    /// Partitions were assigned: read where the group stands and how far it fetched.
    fn assign(&self, consumer: &BaseConsumer<Context>, partitions: &[i32]) {
        let query = self.tpl(partitions.iter().map(|p| (*p, 0)));
        let read = |tpl: KafkaResult<TopicPartitionList>| -> Vec<Option<i64>> {
            let tpl = tpl.unwrap_or_else(|e| {
                tracing::warn!(queue = %self.queue, "reading committed offsets failed; replays of uncommitted messages are not counted this time: {e}");
                TopicPartitionList::new()
            });
            partitions
                .iter()
                .map(
                    |p| match tpl.find_partition(&self.topic, *p).map(|e| e.offset()) {
                        Some(Offset::Offset(n)) => Some(n),
                        _ => None,
                    },
                )
                .collect()
        };
        let committed = read(consumer.committed_offsets(query.clone(), ADMIN_TIMEOUT));
        let marks = read(
            consumer
                .context()
                .marks
                .committed_offsets(query, ADMIN_TIMEOUT),
        );
        let mut tracker = self.tracker.lock().expect("tracker");
        for ((p, c), m) in partitions.iter().zip(committed).zip(marks) {
            tracker.assign(*p, c, m);
        }
        let mut held = tracker.partitions();
        held.sort_unstable();
        tracing::info!(queue = %self.queue, topic = %self.topic, partitions = ?held, "kafka partitions assigned");
    }
}

/// The consumer's librdkafka context: rebalances and client errors.
struct Context {
    shared: Arc<Shared>,
    /// The client of the delivered-marks group.
    marks: BaseConsumer<Quiet>,
}

impl ClientContext for Context {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        Quiet.log(level, facility, message);
    }
    fn error(&self, e: KafkaError, reason: &str) {
        if !is_outage(&e) {
            return Quiet.error(e, reason);
        }
        let mut e = error(e);
        e.message = format!("{} ({reason})", e.message);
        self.shared.failed(&e);
    }
}

impl Context {
    fn ours(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.shared.topic)
            .iter()
            .map(|e| e.partition())
            .collect()
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.shared.revoke(consumer, &self.ours(tpl));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.shared.assign(consumer, &self.ours(tpl)),
            Rebalance::Error(e) => self.shared.failed(&error(e.clone())),
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::debug!(queue = %self.shared.queue, "an offset commit failed, retried with the next one: {e}");
            let mut tracker = self.shared.tracker.lock().expect("tracker");
            for p in self.ours(offsets) {
                tracker.commit_failed(p);
            }
        }
    }
}

/// The poll thread's loop, until the consumer closes.
fn poll_loop(consumer: BaseConsumer<Context>, shared: Arc<Shared>) {
    let mut paused: Option<u64> = None;
    let mut last_check = Instant::now();
    while !shared.closing.load(Ordering::Acquire) {
        wait_for_room(&shared);
        flow(&consumer, &shared, &mut paused);
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

/// Pause the partitions while the host is shutting down, or while the buffer is far over its
/// size (the host stopped taking messages: a handler hangs, or none is deployed); resume
/// once it is back under it.
fn flow(consumer: &BaseConsumer<Context>, shared: &Shared, paused: &mut Option<u64>) {
    let buffered = shared.buffer.lock().expect("buffer").len();
    let limit = if paused.is_some() {
        shared.cap
    } else {
        shared.cap * 4
    };
    let want = shared.stopped.load(Ordering::Acquire) || buffered >= limit;
    let generations = shared.tracker.lock().expect("tracker").generations();
    let Ok(assignment) = consumer.assignment() else {
        return;
    };
    match (*paused, want) {
        (Some(g), true) if g == generations => {}
        (_, true) => {
            let _ = consumer.pause(&assignment);
            *paused = Some(generations);
        }
        (Some(_), false) => {
            let _ = consumer.resume(&assignment);
            *paused = None;
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

/// The consumer of one queue.
pub struct KafkaConsumer {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl KafkaConsumer {
    /// Subscribe to `queue`'s topic in the processing group and start polling; `prefetch`
    /// sizes the buffer.
    pub(super) fn start(
        settings: &KafkaSettings,
        provider: &str,
        queue: &str,
        prefetch: u32,
    ) -> Result<Self, ProviderError> {
        let topic = settings.topic(queue);
        let shared = Arc::new(Shared {
            topic: topic.clone(),
            queue: queue.to_string(),
            grace: settings.rebalance_grace,
            cap: (prefetch as usize * 4).max(CHUNK),
            tracker: Mutex::new(Tracker::default()),
            settled: Condvar::new(),
            buffer: Mutex::new(VecDeque::new()),
            taken: Condvar::new(),
            arrived: Notify::new(),
            stopped: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let marks = settings
            .consumer(&settings.delivered_group())
            .create_with_context(Quiet)
            .map_err(error)?;
        let mut config = settings.consumer(&settings.processing_group);
        config.set("client.id", format!("wharf {provider} {queue}"));
        let consumer: BaseConsumer<Context> = config
            .create_with_context(Context {
                shared: shared.clone(),
                marks,
            })
            .map_err(error)?;
        consumer.subscribe(&[&topic]).map_err(error)?;
        let poller = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kafka {queue}"))
            .spawn(move || poll_loop(consumer, poller))
            .map_err(|e| ProviderError::with_source(super::KIND, ErrorKind::Unavailable, e))?;
        Ok(KafkaConsumer {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.shared.tracker.lock().expect("tracker")
    }
}

fn record(handle: &Handle) -> Option<&Arc<Record>> {
    handle.get::<Arc<Record>>()
}

#[async_trait]
impl Consumer for KafkaConsumer {
    async fn receive(&self, max: u32) -> Result<Vec<Delivery>, ProviderError> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        {
            let mut buffer = self.shared.buffer.lock().expect("buffer");
            let mut tracker = self.tracker();
            while out.len() < max as usize
                && let Some((r, replay)) = buffer.pop_front()
            {
                if tracker.hand_out(r.partition, r.generation, r.offset) {
                    out.push(r.delivery(replay));
                }
            }
            if buffer.len() < self.shared.cap / 2 {
                self.shared.taken.notify_one();
            }
        }
        if out.is_empty()
            && let Some((kind, message)) = self.shared.error.lock().expect("error").clone()
        {
            return Err(ProviderError::new(super::KIND, kind, message));
        }
        Ok(out)
    }

    async fn pushed(&self) {
        loop {
            let arrived = self.shared.arrived.notified();
            if !self.shared.buffer.lock().expect("buffer").is_empty() || self.shared.has_error() {
                return;
            }
            arrived.await;
        }
    }

    fn holds(&self, handle: &Handle) -> bool {
        record(handle).is_some_and(|r| self.tracker().holds(r.partition, r.generation, r.offset))
    }

    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        let held = {
            let mut tracker = self.tracker();
            handles
                .iter()
                .map(|h| {
                    record(h).is_some_and(|r| tracker.settle(r.partition, r.generation, r.offset))
                })
                .collect()
        };
        self.shared.settled.notify_all();
        Ok(held)
    }

    async fn nack(&self, handles: &[Handle], nack: Nack) -> Result<(), ProviderError> {
        if !nack.requeue {
            // Kafka drops nothing: the offset is passed like a settled one.
            self.ack(handles).await?;
            return Ok(());
        }
        let stopped = self.shared.stopped.load(Ordering::Acquire);
        let mut again = Vec::new();
        {
            let mut tracker = self.tracker();
            for r in handles.iter().filter_map(record) {
                if tracker.hand_back(r.partition, r.generation, r.offset) && !stopped {
                    again.push((r.clone(), true));
                }
            }
        }
        self.shared.settled.notify_all();
        if !again.is_empty() {
            // Handed out again by this consumer; its offset is not committed meanwhile.
            let mut buffer = self.shared.buffer.lock().expect("buffer");
            for entry in again.into_iter().rev() {
                buffer.push_front(entry);
            }
            drop(buffer);
            self.shared.arrived.notify_one();
        }
        Ok(())
    }

    async fn stop(&self) -> Vec<Delivery> {
        self.shared.stopped.store(true, Ordering::Release);
        let buffered: Vec<_> = self
            .shared
            .buffer
            .lock()
            .expect("buffer")
            .drain(..)
            .collect();
        buffered
            .into_iter()
            .map(|(r, replay)| r.delivery(replay))
            .collect()
    }

    async fn close(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.shared.closing.store(true, Ordering::Release);
        self.shared.taken.notify_one();
        let thread = self.thread.lock().expect("thread").take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for KafkaConsumer {
    fn drop(&mut self) {
        // The poll thread ends (and leaves the group) when the consumer is dropped unclosed.
        self.shared.closing.store(true, Ordering::Release);
    }
}

//! The processing consumer of one Kafka queue: the state its poll thread ([`super::poll`]),
//! its rebalance callbacks ([`super::rebalance`]) and the host share — the buffer of fetched
//! messages and the [`Tracker`] of offsets — and the [`Consumer`] the host calls: `receive`
//! hands buffered messages out, `ack` settles them (the poll thread commits the contiguous
//! prefix), `nack` hands them back (buffered again, their offsets not committed), `stop`
//! returns what was not handed out, and `close` ends the poll thread, which commits and
//! leaves the group.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::offsets::{Commit, Tracker};
use super::poll::{CHUNK, Record, poll_loop};
use super::rebalance::Context;
use super::{KIND, KafkaSettings, Quiet, error};
use crate::external::{Consumer, Delivery, ErrorKind, Handle, Nack, ProviderError};

/// What the poll thread, the rebalance callbacks and the host share.
pub(super) struct Shared {
    pub(super) topic: String,
    pub(super) queue: String,
    pub(super) grace: Duration,
    /// Buffered messages above which the poll thread waits for the host to take some.
    pub(super) cap: usize,
    pub(super) tracker: Mutex<Tracker>,
    /// Signalled when a handed-out message is settled or handed back.
    pub(super) settled: Condvar,
    /// Fetched messages not handed out, with whether each is a replay.
    pub(super) buffer: Mutex<VecDeque<(Arc<Record>, bool)>>,
    /// Signalled when the host took buffered messages.
    pub(super) taken: Condvar,
    pub(super) arrived: Notify,
    pub(super) stopped: AtomicBool,
    pub(super) closing: AtomicBool,
    pub(super) error: Mutex<Option<(ErrorKind, String)>>,
}

impl Shared {
    pub(super) fn failed(&self, e: &ProviderError) {
        let mut error = self.error.lock().expect("error");
        if error.is_none() {
            tracing::debug!(queue = %self.queue, "kafka consumer: {e}");
        }
        *error = Some((e.kind, e.message.clone()));
        drop(error);
        self.arrived.notify_one();
    }

    pub(super) fn recovered(&self) {
        self.error.lock().expect("error").take();
    }

    pub(super) fn has_error(&self) -> bool {
        self.error.lock().expect("error").is_some()
    }

    pub(super) fn tpl(&self, offsets: impl IntoIterator<Item = (i32, i64)>) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in offsets {
            tpl.add_partition_offset(&self.topic, partition, Offset::Offset(offset))
                .expect("a valid offset");
        }
        tpl
    }

    pub(super) fn commit<C: ConsumerContext>(
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
}

/// The consumer of one queue.
pub struct KafkaConsumer {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The processing group it consumes in.
    group: String,
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
            group: settings.processing_group.clone(),
        })
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.shared.tracker.lock().expect("tracker")
    }
}

#[async_trait]
impl Consumer for KafkaConsumer {
    fn group(&self) -> Option<&str> {
        Some(&self.group)
    }

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
        handle
            .get::<Arc<Record>>(KIND)
            .is_ok_and(|r| self.tracker().holds(r.partition, r.generation, r.offset))
    }

    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        let records = Handle::all::<Arc<Record>>(handles, KIND)?;
        let held = {
            let mut tracker = self.tracker();
            records
                .iter()
                .map(|r| tracker.settle(r.partition, r.generation, r.offset))
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
            for r in Handle::all::<Arc<Record>>(handles, KIND)? {
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

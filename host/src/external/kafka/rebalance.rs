//! Rebalances of a processing consumer, served on its poll thread: on revocation the
//! partition's buffered messages are dropped, its running ones get `rebalance_grace` to
//! finish, the contiguous settled prefix is committed and the partition is forgotten (what
//! has not settled is redelivered to the new owner); on assignment the group's committed
//! offset and the delivered mark are read, so replays are recognised.

use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::consumer::Shared;
use super::{ADMIN_TIMEOUT, Quiet, error, outage};

/// The consumer's librdkafka context: rebalances and client errors.
pub(super) struct Context {
    pub(super) shared: Arc<Shared>,
    /// The client of the delivered-marks group.
    pub(super) marks: BaseConsumer<Quiet>,
}

impl ClientContext for Context {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        Quiet.log(level, facility, message);
    }
    fn error(&self, e: KafkaError, reason: &str) {
        if let Some(e) = outage(e, reason) {
            self.shared.failed(&e);
        }
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

impl Shared {
    /// Partitions were revoked: drop their buffered messages, give their running ones the
    /// grace, commit the settled prefix and forget them.
    pub(super) fn revoke<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        partitions: &[i32],
    ) {
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
    pub(super) fn assign(&self, consumer: &BaseConsumer<Context>, partitions: &[i32]) {
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

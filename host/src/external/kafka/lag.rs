//! The processing group's lag on a queue's topic: per partition, the broker's high watermark
//! minus the group's committed offset (or the low watermark where it has committed none: a
//! new group starts at the oldest message), summed; and the oldest of those messages' age:
//! the earliest timestamp of the records at the committed offsets. Read by the metrics
//! sampler through two clients that join no group, made on first use: one asks for offsets,
//! the other fetches the one record at each lagging partition's committed offset (it never
//! commits: `enable.auto.commit` is off for every consumer of the provider).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

use super::{ADMIN_TIMEOUT, Quiet, error};
use crate::external::kafka::KafkaSettings;
use crate::external::{Lag, ProviderError};

/// Longest the reader waits for the records at the committed offsets.
const OLDEST_WITHIN: Duration = Duration::from_secs(2);

/// The lag reader of one provider.
#[derive(Default)]
pub(super) struct LagReader {
    offsets: Mutex<Option<Arc<BaseConsumer<Quiet>>>>,
    records: Mutex<Option<Arc<BaseConsumer<Quiet>>>>,
    /// Held by the reading task: a reading the sampler stopped waiting for still runs, and
    /// the next must not assign the records client under it.
    reading: Arc<Mutex<()>>,
}

/// A client made once, on first use.
fn made(
    slot: &Mutex<Option<Arc<BaseConsumer<Quiet>>>>,
    make: impl FnOnce() -> Result<BaseConsumer<Quiet>, KafkaError>,
) -> Result<Arc<BaseConsumer<Quiet>>, ProviderError> {
    let mut slot = slot.lock().expect("lag client");
    if let Some(c) = slot.as_ref() {
        return Ok(c.clone());
    }
    let client = Arc::new(make().map_err(error)?);
    *slot = Some(client.clone());
    Ok(client)
}

impl LagReader {
    /// The processing group's lag on `topic`.
    pub(super) async fn lag(
        &self,
        settings: &KafkaSettings,
        topic: String,
    ) -> Result<Lag, ProviderError> {
        let offsets = made(&self.offsets, || {
            settings
                .consumer(&settings.processing_group)
                .create_with_context(Quiet)
        })?;
        let records = made(&self.records, || {
            settings
                .consumer(&settings.processing_group)
                // One record a partition is all it reads: fetch little.
                .set("max.partition.fetch.bytes", "65536")
                .set("queued.max.messages.kbytes", "1024")
                .create_with_context(Quiet)
        })?;
        let reading = self.reading.clone();
        tokio::task::spawn_blocking(move || -> Result<Lag, KafkaError> {
            let _reading = reading.lock().unwrap_or_else(|p| p.into_inner());
            let behind = behind(&offsets, &topic)?;
            let messages = behind.values().map(|(at, high)| (high - at) as u64).sum();
            let oldest_ms = match messages {
                0 => None,
                _ => oldest(&records, &topic, &behind)?,
            };
            Ok(Lag {
                messages,
                oldest_ms,
            })
        })
        .await
        .expect("the lag task")
        .map_err(error)
    }
}

/// Per partition with messages past the group's position: (that position, high watermark).
fn behind(
    client: &BaseConsumer<Quiet>,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), ADMIN_TIMEOUT)?;
    let mut partitions = TopicPartitionList::new();
    for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
        partitions.add_partition(topic, p.id());
    }
    let committed = client.committed_offsets(partitions, ADMIN_TIMEOUT)?;
    let mut behind = BTreeMap::new();
    for e in committed.elements() {
        let (low, high) = client.fetch_watermarks(topic, e.partition(), ADMIN_TIMEOUT)?;
        let at = match e.offset() {
            Offset::Offset(n) => n.max(low),
            _ => low,
        };
        if high > at {
            behind.insert(e.partition(), (at, high));
        }
    }
    Ok(behind)
}

/// The earliest timestamp of the records at the positions `behind` gives, fetched within
/// [`OLDEST_WITHIN`]; `None` when none came (or none has a timestamp).
fn oldest(
    client: &BaseConsumer<Quiet>,
    topic: &str,
    behind: &BTreeMap<i32, (i64, i64)>,
) -> Result<Option<i64>, KafkaError> {
    let mut at = TopicPartitionList::new();
    for (&partition, &(offset, _)) in behind {
        at.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    }
    client.assign(&at)?;
    let mut waiting: BTreeMap<i32, i64> = behind.iter().map(|(p, (o, _))| (*p, *o)).collect();
    let mut oldest: Option<i64> = None;
    let until = Instant::now() + OLDEST_WITHIN;
    while !waiting.is_empty() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let Some(polled) = client.poll(left) else {
            continue;
        };
        let Ok(record) = polled else { continue };
        // The first record at or past the position counts (the one at it may be gone:
        // compacted, or a transaction marker); a later one of its partition is younger.
        match waiting.get(&record.partition()) {
            Some(&position) if record.offset() >= position => {}
            _ => continue,
        }
        waiting.remove(&record.partition());
        if let Some(ms) = record.timestamp().to_millis() {
            oldest = Some(oldest.map_or(ms, |o| o.min(ms)));
        }
    }
    client.unassign()?;
    Ok(oldest)
}

//! The processing group's lag on a queue's topic: per partition, the broker's high watermark
//! minus the group's committed offset (or the low watermark where it has committed none: a
//! new group starts at the oldest message), summed. Read by the metrics sampler through one
//! client that joins no group (it only asks for offsets), made on first use.

use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::{ADMIN_TIMEOUT, Quiet, error};
use crate::external::ProviderError;
use crate::external::kafka::KafkaSettings;

/// The lag reader of one provider.
#[derive(Default)]
pub(super) struct LagReader {
    client: Mutex<Option<Arc<BaseConsumer<Quiet>>>>,
}

impl LagReader {
    fn client(&self, settings: &KafkaSettings) -> Result<Arc<BaseConsumer<Quiet>>, ProviderError> {
        let mut client = self.client.lock().expect("lag client");
        if let Some(c) = client.as_ref() {
            return Ok(c.clone());
        }
        let made: BaseConsumer<Quiet> = settings
            .consumer(&settings.processing_group)
            .create_with_context(Quiet)
            .map_err(error)?;
        let made = Arc::new(made);
        *client = Some(made.clone());
        Ok(made)
    }

    /// The processing group's lag on `topic`, in messages.
    pub(super) async fn lag(
        &self,
        settings: &KafkaSettings,
        topic: String,
    ) -> Result<u64, ProviderError> {
        let client = self.client(settings)?;
        tokio::task::spawn_blocking(move || -> Result<u64, KafkaError> {
            let metadata = client.fetch_metadata(Some(&topic), ADMIN_TIMEOUT)?;
            let mut partitions = TopicPartitionList::new();
            for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
                partitions.add_partition(&topic, p.id());
            }
            let committed = client.committed_offsets(partitions, ADMIN_TIMEOUT)?;
            let mut lag = 0;
            for e in committed.elements() {
                let (low, high) = client.fetch_watermarks(&topic, e.partition(), ADMIN_TIMEOUT)?;
                let at = match e.offset() {
                    Offset::Offset(n) => n,
                    _ => low,
                };
                lag += (high - at).max(0) as u64;
            }
            Ok(lag)
        })
        .await
        .expect("the lag task")
        .map_err(error)
    }
}

//! The Kafka provider, with the documented topology: producers publish each queue's
//! envelopes to the topic `{topic_prefix}{queue}`; the processing consumers read it in the
//! `processing_group` and the readiness consumers in the `readiness_group`, so readiness
//! commits never advance processing offsets. The host creates missing topics
//! (`create_topics`, with `partitions` and `replication`).
//!
//! Publishing: the envelope is the value and the key is the session key in a queue with
//! sessions (one session stays in one partition, so in order), otherwise the MessageId (one
//! id stays in one partition), from an idempotent producer with `acks=all`; a batch is sent pipelined and
//! awaited as a whole. Consuming: a poll thread per queue (so the consumer stays in its
//! group while handlers run) buffers fetched messages for the host; a processing offset is
//! committed only after its settlement (or the move into SQL) is durable, up to the
//! contiguous prefix of settled offsets ([`offsets`]). On revocation the partition's running
//! messages get `rebalance_grace` to finish before the last commit; the rest is redelivered
//! to the new owner.
//!
//! Kafka counts no deliveries: before fetched messages are handed out, the poll thread stores
//! how far the group fetched each partition (the committed offsets of the group
//! `{processing_group}.delivered`, which never consumes). A fetched offset below that mark is
//! a replay — its previous delivery was never committed (a crash, a revocation, a shutdown) —
//! and the host counts it durably, so a poison message ends failed after `max_attempts` even
//! when it takes its host down.
//!
//! Capabilities: no priority, no native delay (delays wait in the SQL queue), no id
//! replacement or idempotency, no delivery count, no depth (lag needs partition ends, which
//! not every Kafka-protocol broker reports reliably).

mod bridge;
mod consumer;
mod lag;
mod offsets;
mod poll;
mod rebalance;
mod settings;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, config::RDKafkaLogLevel};

pub use bridge::KafkaReadiness;
pub use consumer::KafkaConsumer;
pub use offsets::Tracker;
pub use settings::{KafkaKind, KafkaSettings, Property};

use super::{
    Capabilities, Consumer, ConsumerSettings, Envelope, ErrorKind, Lag, Provider, ProviderError,
    PublishOptions, ReadinessBridge,
};
use crate::queue::EnqueueStatus;

const KIND: &str = "kafka";

/// Longest an administrative request (metadata, topic creation, committed offsets) waits.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Sort a Kafka error into the provider error kinds.
/// The provider's producer (`client.id` names the provider): sends fail after 30 s without
/// the broker unless `message.timeout.ms` says otherwise.
fn new_producer(
    name: &str,
    settings: &KafkaSettings,
) -> Result<FutureProducer<Quiet>, ProviderError> {
    let mut producer = settings.producer();
    producer.set("client.id", format!("wharf {name} producer"));
    if !settings.properties.contains_key("message.timeout.ms") {
        // An enqueue fails after 30 s without the broker rather than librdkafka's 5 min.
        producer.set("message.timeout.ms", "30000");
    }
    producer.create_with_context(Quiet).map_err(error)
}

pub(crate) fn error(e: KafkaError) -> ProviderError {
    use RDKafkaErrorCode as C;
    let kind = match e.rdkafka_error_code() {
        Some(C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut | C::TimedOutQueue) => {
            ErrorKind::Timeout
        }
        Some(
            C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication,
        ) => ErrorKind::Denied,
        Some(
            C::UnknownTopicOrPartition
            | C::UnknownTopic
            | C::TopicAlreadyExists
            | C::Fatal
            | C::InvalidSessionTimeout,
        ) => ErrorKind::Protocol,
        _ => ErrorKind::Unavailable,
    };
    ProviderError::with_source(KIND, kind, e)
}

/// A client error reported by librdkafka, as an outage (with librdkafka's reason) when the
/// broker cannot be used; `None`, logged at debug level, for a single broker connection that
/// dropped (an idle connection closed by the broker, one broker of a cluster restarting),
/// which librdkafka retries on its own.
pub(crate) fn outage(e: KafkaError, reason: &str) -> Option<ProviderError> {
    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::BrokerTransportFailure) {
        Quiet.error(e, reason);
        return None;
    }
    let mut e = error(e);
    e.message = format!("{} ({reason})", e.message);
    Some(e)
}

/// librdkafka's log lines and client errors, routed to `tracing` at debug level: failures
/// surface through the calls that fail and the health checks, once per outage.
#[derive(Clone, Default)]
pub(crate) struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        tracing::debug!(?level, facility, "librdkafka: {message}");
    }
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka: {error}: {reason}");
    }
}

impl rdkafka::consumer::ConsumerContext for Quiet {}

/// Pending messages in Kafka.
pub struct KafkaProvider {
    name: String,
    settings: KafkaSettings,
    /// Replaced after a send failed with a timed-out message: an idempotent producer must
    /// then re-establish its producer id with the broker, which some Kafka-protocol brokers
    /// never complete after an outage, leaving every later send waiting.
    producer: RwLock<FutureProducer<Quiet>>,
    admin: AdminClient<Quiet>,
    /// Queues whose topic is known to exist.
    prepared: Mutex<HashSet<String>>,
    /// Reads the processing group's lag for the metrics.
    lag: lag::LagReader,
}

impl KafkaProvider {
    /// A provider for `settings` (`name` is the `[providers.NAME]` name). Clients connect in
    /// the background, so a broker that is down at start-up does not stop the host.
    pub fn open(name: &str, settings: KafkaSettings) -> Result<Self, ProviderError> {
        Ok(KafkaProvider {
            name: name.to_string(),
            producer: RwLock::new(new_producer(name, &settings)?),
            admin: settings
                .client()
                .create_with_context(Quiet)
                .map_err(error)?,
            settings,
            prepared: Mutex::new(HashSet::new()),
            lag: lag::LagReader::default(),
        })
    }

    /// The settings it was opened with.
    pub fn settings(&self) -> &KafkaSettings {
        &self.settings
    }

    /// The producer sends go through now.
    fn producer(&self) -> FutureProducer<Quiet> {
        self.producer.read().expect("producer").clone()
    }

    /// After a send failed with `e`: a message that timed out (or a fatal producer error)
    /// replaces the producer, so the next try starts on fresh connections and a new
    /// producer id. Messages of the old one not delivered fail and are tried again by
    /// their caller.
    fn after_send_failed(&self, e: &KafkaError) {
        let producer = self.producer();
        let fatal = producer.client().fatal_error();
        let timed_out = e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut);
        if !timed_out && fatal.is_none() {
            return;
        }
        match new_producer(&self.name, &self.settings) {
            Ok(fresh) => {
                tracing::info!(provider = %self.name, fatal = ?fatal, "replacing the Kafka producer after a failed send: {e}");
                *self.producer.write().expect("producer") = fresh;
            }
            Err(e) => {
                tracing::warn!(provider = %self.name, "cannot replace the Kafka producer: {e}")
            }
        }
    }

    fn is_prepared(&self, queue: &str) -> bool {
        self.prepared.lock().expect("prepared").contains(queue)
    }

    /// The topics of `queues` that do not exist.
    async fn missing(&self, queues: &[String]) -> Result<Vec<String>, ProviderError> {
        let producer = self.producer();
        let metadata = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(None, ADMIN_TIMEOUT)
        })
        .await
        .expect("metadata task")
        .map_err(error)?;
        let existing: HashSet<&str> = metadata.topics().iter().map(|t| t.name()).collect();
        for topic in metadata.topics() {
            let Some(queue) = queues
                .iter()
                .find(|q| self.settings.topic(q) == topic.name())
            else {
                continue;
            };
            let partitions = topic.partitions().len();
            if partitions != self.settings.partitions as usize {
                tracing::warn!(provider = %self.name, queue = %queue, topic = topic.name(), partitions, "topic `{}` already exists with {partitions} partitions and is used as it is: `partitions = {}` of [providers.{}] applies only to topics the host creates", topic.name(), self.settings.partitions, self.name);
            } else {
                tracing::info!(provider = %self.name, queue = %queue, topic = topic.name(), partitions, "using existing topic");
            }
        }
        Ok(queues
            .iter()
            .map(|q| self.settings.topic(q))
            .filter(|t| !existing.contains(t.as_str()))
            .collect())
    }
}

#[async_trait]
impl Provider for KafkaProvider {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        self.settings.capabilities()
    }

    async fn lag(&self, queue: &str) -> Result<Option<Lag>, ProviderError> {
        let topic = self.settings.topic(queue);
        Ok(Some(self.lag.lag(&self.settings, topic).await?))
    }

    async fn prepare(&self, queues: &[String]) -> Result<(), ProviderError> {
        let missing = self.missing(queues).await?;
        if !missing.is_empty() {
            if !self.settings.create_topics {
                return Err(ProviderError::new(
                    KIND,
                    ErrorKind::Protocol,
                    format!(
                        "topic `{}` does not exist and create_topics = false: create it, or set create_topics = true",
                        missing.join("`, `")
                    ),
                ));
            }
            let replication = self.settings.replication.unwrap_or(-1);
            let topics: Vec<NewTopic> = missing
                .iter()
                .map(|t| {
                    NewTopic::new(
                        t,
                        self.settings.partitions,
                        TopicReplication::Fixed(replication),
                    )
                })
                .collect();
            let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
            let results = self
                .admin
                .create_topics(&topics, &options)
                .await
                .map_err(error)?;
            for result in results {
                match result {
                    Ok(topic) => {
                        tracing::info!(provider = %self.name, topic, partitions = self.settings.partitions, "created topic")
                    }
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((topic, code)) => {
                        return Err(ProviderError::new(
                            KIND,
                            ErrorKind::Protocol,
                            format!("creating topic `{topic}` failed: {code}"),
                        ));
                    }
                }
            }
        }
        let mut prepared = self.prepared.lock().expect("prepared");
        prepared.extend(queues.iter().cloned());
        Ok(())
    }

    async fn publish(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        options: PublishOptions,
    ) -> Result<Vec<EnqueueStatus>, ProviderError> {
        let _ = options; // no native delay, idempotency or replacement: the router knows
        if !self.is_prepared(queue) {
            self.prepare(&[queue.to_string()]).await?;
        }
        let topic = self.settings.topic(queue);
        let bodies: Vec<String> = envelopes.iter().map(Envelope::to_json).collect();
        // Every send is queued at once (librdkafka batches them) and awaited together.
        let producer = self.producer();
        let sends = envelopes.iter().zip(&bodies).map(|(envelope, body)| {
            let mut record = FutureRecord::to(&topic).payload(body.as_str());
            // A session key keeps the session in one partition, so in order.
            if let Some(key) = envelope.session.as_ref().or(envelope.message_id.as_ref()) {
                record = record.key(key.as_str());
            }
            if !envelope.trace.is_empty() {
                let headers = envelope
                    .trace
                    .iter()
                    .fold(OwnedHeaders::new(), |h, (k, v)| {
                        h.insert(Header {
                            key: k,
                            value: Some(v.as_str()),
                        })
                    });
                record = record.headers(headers);
            }
            producer.send(record, Timeout::Never)
        });
        for sent in futures_util::future::join_all(sends).await {
            if let Err((e, _)) = sent {
                // The topic may be gone (a broker that lost its data): checked again next time.
                self.prepared.lock().expect("prepared").remove(queue);
                self.after_send_failed(&e);
                return Err(error(e));
            }
        }
        Ok(vec![EnqueueStatus::Added; envelopes.len()])
    }

    async fn consumer(
        &self,
        queue: &str,
        settings: ConsumerSettings,
    ) -> Result<Arc<dyn Consumer>, ProviderError> {
        Ok(Arc::new(KafkaConsumer::start(
            &self.settings,
            &self.name,
            queue,
            settings.prefetch,
        )?))
    }

    async fn readiness(
        &self,
        queues: &[String],
    ) -> Result<Arc<dyn ReadinessBridge>, ProviderError> {
        Ok(Arc::new(KafkaReadiness::new(
            &self.settings,
            &self.name,
            queues,
        )?))
    }

    /// A metadata request for the first queue's topic on the producer's connections: a
    /// silent cut leaves librdkafka's sockets open for a minute, this answers at once.
    async fn probe(&self, queues: &[String], timeout: Duration) -> Result<(), ProviderError> {
        let producer = self.producer();
        let topic = queues.first().map(|q| self.settings.topic(q));
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(topic.as_deref(), timeout)
                .map(drop)
        })
        .await
        .expect("metadata task")
        .map_err(error)
    }

    async fn close(&self) {
        let producer = self.producer();
        let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
    }
}

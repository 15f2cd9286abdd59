//! The Kafka readiness bridge: a consumer in the readiness group subscribed to every
//! external queue's topic. Each message is one notification for its queue; the bridge
//! commits the readiness offsets only after the activation is durable, and a message's
//! processing offsets are never touched (another group).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{KIND, KafkaSettings, Quiet, error, outage};
use crate::external::{ErrorKind, Handle, Notification, ProviderError, ReadinessBridge};

/// Most notifications taken in one receive.
const BATCH: usize = 1024;

/// A notification's place in its topic.
struct Position {
    topic: String,
    partition: i32,
    offset: i64,
}

/// Client errors of the readiness consumer, until the broker answers again.
#[derive(Clone, Default)]
struct Context {
    error: Arc<Mutex<Option<(ErrorKind, String)>>>,
}

impl ClientContext for Context {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        Quiet.log(level, facility, message);
    }
    fn error(&self, e: KafkaError, reason: &str) {
        if let Some(e) = outage(e, reason) {
            *self.error.lock().expect("error") = Some((e.kind, e.message));
        }
    }
}

impl ConsumerContext for Context {}

/// The readiness consumer of one provider.
pub struct KafkaReadiness {
    consumer: Arc<BaseConsumer<Context>>,
    context: Context,
    /// Notifications handed out and not acknowledged: the activation failed, so they are
    /// handed out again (the consumer's position is already past them).
    unacknowledged: Mutex<Vec<(String, i32, i64)>>,
    /// Topic → queue.
    queues: HashMap<String, String>,
}

impl KafkaReadiness {
    pub(super) fn new(
        settings: &KafkaSettings,
        provider: &str,
        queues: &[String],
    ) -> Result<Self, ProviderError> {
        let context = Context::default();
        let mut config = settings.consumer(&settings.readiness_group);
        config.set("client.id", format!("wharf {provider} readiness"));
        Ok(KafkaReadiness {
            consumer: Arc::new(config.create_with_context(context.clone()).map_err(error)?),
            context,
            unacknowledged: Mutex::new(Vec::new()),
            queues: queues
                .iter()
                .map(|q| (settings.topic(q), q.clone()))
                .collect(),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&BaseConsumer<Context>) -> T + Send + 'static,
    ) -> T {
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || work(&consumer))
            .await
            .expect("readiness consumer task")
    }
}

#[async_trait]
impl ReadinessBridge for KafkaReadiness {
    async fn start(&self) -> Result<(), ProviderError> {
        let topics: Vec<String> = self.queues.keys().cloned().collect();
        self.blocking(move |c| {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            c.subscribe(&names).map_err(error)
        })
        .await
    }

    async fn receive(&self) -> Result<Vec<Notification>, ProviderError> {
        let polled = self
            .blocking(|c| {
                let mut got = Vec::new();
                let mut wait = Duration::from_secs(1);
                while got.len() < BATCH {
                    match c.poll(wait) {
                        Some(Ok(m)) => got.push(Position {
                            topic: m.topic().to_string(),
                            partition: m.partition(),
                            offset: m.offset(),
                        }),
                        Some(Err(e)) if got.is_empty() => return Err(error(e)),
                        Some(Err(_)) | None => break,
                    }
                    wait = Duration::ZERO;
                }
                Ok(got)
            })
            .await?;
        if polled.is_empty() {
            let failing = self.context.error.lock().expect("error").clone();
            if let Some((kind, message)) = failing {
                // Healthy again once the broker answers.
                let topics: Vec<String> = self.queues.keys().cloned().collect();
                let answered = self
                    .blocking(move |c| {
                        topics.iter().all(|t| {
                            c.fetch_metadata(Some(t), Duration::from_secs(1))
                                .is_ok_and(|m| m.topics().iter().all(|t| t.error().is_none()))
                        })
                    })
                    .await;
                if !answered {
                    return Err(ProviderError::new(KIND, kind, message));
                }
                self.context.error.lock().expect("error").take();
            }
        } else {
            self.context.error.lock().expect("error").take();
        }
        let mut unacknowledged = self.unacknowledged.lock().expect("unacknowledged");
        let again: Vec<Position> = unacknowledged
            .drain(..)
            .map(|(topic, partition, offset)| Position {
                topic,
                partition,
                offset,
            })
            .collect();
        let all: Vec<Position> = again.into_iter().chain(polled).collect();
        unacknowledged.extend(all.iter().map(|p| (p.topic.clone(), p.partition, p.offset)));
        drop(unacknowledged);
        Ok(all
            .into_iter()
            .filter_map(|p| {
                let queue = self.queues.get(&p.topic)?.clone();
                Some(Notification {
                    queue,
                    handle: Handle::new(p),
                })
            })
            .collect())
    }

    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ProviderError> {
        let mut next: HashMap<(String, i32), i64> = HashMap::new();
        let positions = Handle::all::<Position>(notifications.iter().map(|n| &n.handle), KIND)?;
        for p in &positions {
            let offset = next.entry((p.topic.clone(), p.partition)).or_insert(0);
            *offset = (*offset).max(p.offset + 1);
        }
        if next.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in next {
            tpl.add_partition_offset(&topic, partition, Offset::Offset(offset))
                .expect("a valid offset");
        }
        self.blocking(move |c| c.commit(&tpl, CommitMode::Sync).map_err(error))
            .await?;
        let done: Vec<(&str, i32, i64)> = positions
            .iter()
            .map(|p| (p.topic.as_str(), p.partition, p.offset))
            .collect();
        self.unacknowledged
            .lock()
            .expect("unacknowledged")
            .retain(|(t, p, o)| !done.contains(&(t.as_str(), *p, *o)));
        Ok(())
    }

    async fn close(&self) {
        self.blocking(|c| c.unsubscribe()).await;
    }
}

//! The processing consumer of one RabbitMQ queue: deliveries pushed by the broker (up to
//! the prefetch) are buffered by the session and handed out by `receive`; `ack` and `nack`
//! go to the channel they came from, a batch of acknowledgements in as few frames as the
//! unsettled deliveries allow ([`super::acks`]). After the session broke, its deliveries are
//! back in the queue, so their handles report the lock as lost.

use async_trait::async_trait;
use lapin::message::Delivery as AmqpDelivery;
use lapin::types::AMQPValue;

use super::session::Subscriber;
use super::{KIND, QueueType, RabbitSettings, error};
use crate::external::{Consumer, Delivery, DeliveryCount, Handle, Nack, ProviderError};

/// A delivery tag with the session it belongs to.
#[derive(Debug, Clone, Copy)]
struct Tag {
    generation: u64,
    tag: u64,
}

/// The consumer of one queue.
pub struct RabbitConsumer {
    subscriber: Subscriber,
    queue_type: QueueType,
}

impl RabbitConsumer {
    pub(super) fn new(
        settings: &RabbitSettings,
        provider: &str,
        queue: &str,
        prefetch: u16,
    ) -> Self {
        let names = settings.names(queue);
        RabbitConsumer {
            subscriber: Subscriber::new(
                settings,
                vec![queue.to_string()],
                format!("wharf {provider} {queue}"),
                vec![names.processing],
                prefetch,
            )
            .settling_each(),
            queue_type: settings.queue_type,
        }
    }

    fn convert(&self, generation: u64, d: AmqpDelivery) -> Delivery {
        let properties = &d.properties;
        let mut headers = Vec::new();
        let mut delivery_count = None;
        let mut identity = None;
        let mut session = None;
        if let Some(table) = properties.headers() {
            for (key, value) in table.inner() {
                if key.as_str() == "x-delivery-count" {
                    delivery_count = as_u64(value);
                    continue;
                }
                if key.as_str() == super::IDENTITY_HEADER {
                    identity = as_text(value);
                    continue;
                }
                if let Some(text) = as_text(value) {
                    if key.as_str() == super::SESSION_HEADER {
                        session = Some(text.clone());
                    }
                    headers.push((key.to_string(), text));
                }
            }
        }
        if let Some(id) = properties.message_id() {
            headers.push(("message-id".to_string(), id.to_string()));
        }
        let count = match self.queue_type {
            // Absent on the first delivery; counts every return after it.
            QueueType::Quorum => DeliveryCount::Exact(delivery_count.unwrap_or(0) as u32 + 1),
            QueueType::Classic => DeliveryCount::Redelivered(d.redelivered),
        };
        Delivery {
            handle: Handle::new(Tag {
                generation,
                tag: d.delivery_tag,
            }),
            body: d.data.into(),
            count,
            identity,
            enqueued_at_ms: properties.timestamp().map(|s| s as i64 * 1000),
            headers,
            session,
        }
    }
}

fn as_u64(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::Timestamp(n) => Some(*n),
        _ => None,
    }
}

fn as_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        AMQPValue::Boolean(b) => Some(b.to_string()),
        other => as_u64(other).map(|n| n.to_string()),
    }
}

#[async_trait]
impl Consumer for RabbitConsumer {
    async fn receive(&self, max: u32) -> Result<Vec<Delivery>, ProviderError> {
        let session = self.subscriber.session().await?;
        Ok(session
            .take(max as usize)
            .into_iter()
            .map(|(_, d)| self.convert(session.generation, d))
            .collect())
    }

    async fn pushed(&self) {
        loop {
            match self.subscriber.current() {
                Some(session) if session.has_buffered() => return,
                Some(session) => session.arrived.notified().await,
                // Not consuming (not opened yet, or the connection broke): `receive` reopens.
                None => return,
            }
        }
    }

    async fn stop(&self) -> Vec<Delivery> {
        let Some(session) = self.subscriber.current() else {
            return Vec::new();
        };
        session
            .stop()
            .await
            .into_iter()
            .map(|(_, d)| self.convert(session.generation, d))
            .collect()
    }

    async fn close(&self) {
        if let Some(session) = self.subscriber.current() {
            session.close().await;
        }
    }

    fn holds(&self, handle: &Handle) -> bool {
        match (handle.get::<Tag>(KIND), self.subscriber.current()) {
            (Ok(tag), Some(session)) => tag.generation == session.generation,
            _ => false,
        }
    }

    async fn ack(&self, handles: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        let tags = Handle::all::<Tag>(handles, KIND)?;
        let Some(session) = self.subscriber.current() else {
            return Ok(vec![false; handles.len()]);
        };
        // Tags of an earlier session: the broker already took those messages back.
        let current: Vec<bool> = tags
            .iter()
            .map(|t| t.generation == session.generation)
            .collect();
        let acked = of_session(&tags, session.generation);
        let unsettled = session.unsettled.as_ref().expect("a consumer's session");
        unsettled
            .ack(&session.channel, &acked)
            .await
            .map_err(error)?;
        Ok(current)
    }

    async fn nack(&self, handles: &[Handle], nack: Nack) -> Result<(), ProviderError> {
        let tags = Handle::all::<Tag>(handles, KIND)?;
        let Some(session) = self.subscriber.current() else {
            return Ok(()); // the broker already took them back
        };
        let rejected = of_session(&tags, session.generation);
        let unsettled = session.unsettled.as_ref().expect("a consumer's session");
        unsettled
            .nack(&session.channel, &rejected, nack.requeue)
            .await
            .map_err(error)
    }
}

/// The delivery tags of `tags` that session `generation` handed out.
fn of_session(tags: &[&Tag], generation: u64) -> Vec<u64> {
    tags.iter()
        .filter(|t| t.generation == generation)
        .map(|t| t.tag)
        .collect()
}

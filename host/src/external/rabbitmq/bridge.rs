//! The RabbitMQ readiness bridge: one session consuming every served queue's readiness
//! queue. A notification is acknowledged only after its activation is durable; ones handed
//! out and not acknowledged (the activation failed) are handed out again on the next
//! receive. After a lost connection the broker redelivers the unacknowledged ones.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::BasicAckOptions;

use super::session::Subscriber;
use super::{KIND, RabbitSettings};
use crate::external::{Handle, Notification, ProviderError, ReadinessBridge};

/// How long one `receive` waits for notifications.
const WAIT: Duration = Duration::from_secs(1);
/// Notifications held unacknowledged at once.
const PREFETCH: u16 = 512;

#[derive(Debug, Clone, Copy)]
struct Tag {
    generation: u64,
    tag: u64,
}

/// The readiness bridge of one RabbitMQ provider.
pub struct RabbitReadiness {
    subscriber: Subscriber,
    queues: Vec<String>,
    handed_out: Mutex<Vec<Notification>>,
}

impl RabbitReadiness {
    pub(super) fn new(settings: &RabbitSettings, provider: &str, queues: &[String]) -> Self {
        let names = queues.iter().map(|q| settings.names(q).readiness).collect();
        RabbitReadiness {
            subscriber: Subscriber::new(
                settings,
                queues.to_vec(),
                format!("wharf {provider} readiness"),
                names,
                PREFETCH,
            ),
            queues: queues.to_vec(),
            handed_out: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl ReadinessBridge for RabbitReadiness {
    async fn start(&self) -> Result<(), ProviderError> {
        self.subscriber.session().await.map(|_| ())
    }

    async fn receive(&self) -> Result<Vec<Notification>, ProviderError> {
        let session = match self.subscriber.session().await {
            Ok(session) => session,
            Err(e) => {
                // Their deliveries are gone with the session: the broker redelivers them.
                self.handed_out.lock().expect("handed out").clear();
                return Err(e);
            }
        };
        {
            let handed_out = self.handed_out.lock().expect("handed out");
            if !handed_out.is_empty() {
                return Ok(handed_out.clone());
            }
        }
        if !session.has_buffered() {
            let _ = tokio::time::timeout(WAIT, session.arrived.notified()).await;
        }
        let notes: Vec<Notification> = session
            .take(usize::from(PREFETCH))
            .into_iter()
            .map(|(index, d)| Notification {
                queue: self.queues[index].clone(),
                handle: Handle::new(Tag {
                    generation: session.generation,
                    tag: d.delivery_tag,
                }),
            })
            .collect();
        self.handed_out
            .lock()
            .expect("handed out")
            .clone_from(&notes);
        Ok(notes)
    }

    async fn close(&self) {
        if let Some(session) = self.subscriber.current() {
            session.close().await;
        }
    }

    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ProviderError> {
        let tags = Handle::all::<Tag>(notifications.iter().map(|n| &n.handle), KIND)?;
        let session = self.subscriber.session().await?;
        // Every earlier delivery of this session was acknowledged with an earlier batch, so
        // one cumulative acknowledgement up to the highest tag covers exactly this batch.
        let highest = tags
            .into_iter()
            .filter(|t| t.generation == session.generation)
            .map(|t| t.tag)
            .max();
        if let Some(tag) = highest {
            session
                .channel
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await
                .map_err(super::error)?;
        }
        self.handed_out.lock().expect("handed out").clear();
        Ok(())
    }
}

//! A consuming session: its own connection and channel, `basic.qos` and `basic.consume` on
//! one or more queues, and a task pumping the pushed deliveries into a buffer. A session that
//! broke (connection or channel lost) is replaced by a new one, with a new generation:
//! delivery tags of an old generation cannot be acknowledged any more (the broker already
//! returned those messages to their queue).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::sync::{Mutex, Notify};

use super::{connect, error};
use crate::external::{ErrorKind, ProviderError};

/// One open session.
pub(super) struct Session {
    /// Closed when the session is done with.
    conn: Connection,
    /// Acknowledgements go here.
    pub channel: Channel,
    /// Which session this is.
    pub generation: u64,
    /// Deliveries pushed and not taken yet, with the index of their queue.
    buffer: std::sync::Mutex<VecDeque<(usize, Delivery)>>,
    /// Why the session broke, once it did.
    broken: std::sync::Mutex<Option<String>>,
    failed: AtomicBool,
    /// Raised on every push (and when the session breaks or a consumer ends).
    pub arrived: Notify,
    /// The consumer tags, to cancel them.
    tags: Vec<String>,
    /// Set when the host stopped consuming: consumers ending is expected then.
    stopping: AtomicBool,
    /// Consumers still pumping.
    pumping: AtomicU64,
    /// The deliveries not settled yet, for a session that settles each (one consumer).
    pub unsettled: Option<super::acks::Unsettled>,
}

impl Session {
    /// Take up to `max` buffered deliveries.
    pub fn take(&self, max: usize) -> Vec<(usize, Delivery)> {
        let mut buffer = self.buffer.lock().expect("delivery buffer");
        let n = max.min(buffer.len());
        buffer.drain(..n).collect()
    }

    /// Whether deliveries are waiting.
    pub fn has_buffered(&self) -> bool {
        !self.buffer.lock().expect("delivery buffer").is_empty()
    }

    /// Why the session broke, if it did.
    pub fn broken(&self) -> Option<String> {
        if self.failed.load(Ordering::Acquire) {
            self.broken.lock().expect("broken reason").clone()
        } else {
            None
        }
    }

    /// Cancel every consumer (no more pushes), wait (bounded) until their last deliveries
    /// are buffered, and return everything buffered.
    pub async fn stop(&self) -> Vec<(usize, Delivery)> {
        self.stopping.store(true, Ordering::Release);
        for tag in &self.tags {
            let _ = self
                .channel
                .basic_cancel(tag, lapin::options::BasicCancelOptions::default())
                .await;
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while self.pumping.load(Ordering::Acquire) > 0 && self.broken().is_none() {
                self.arrived.notified().await;
            }
        })
        .await;
        self.take(usize::MAX)
    }

    /// Close the channel and the connection.
    pub async fn close(&self) {
        let _ = self.channel.close(200, "shutting down").await;
        let _ = self.conn.close(200, "shutting down").await;
    }

    fn fail(&self, reason: String) {
        self.broken
            .lock()
            .expect("broken reason")
            .get_or_insert(reason);
        self.failed.store(true, Ordering::Release);
        self.arrived.notify_waiters();
        self.arrived.notify_one();
    }
}

/// Opens sessions on `queues` and replaces broken ones.
pub(super) struct Subscriber {
    /// The settings and the queues whose topology is declared before consuming (a broker
    /// that was down at start-up, or lost its definitions, gets them back first).
    declare: (super::RabbitSettings, Vec<String>),
    url: String,
    name: String,
    queues: Vec<String>,
    prefetch: u16,
    /// The session now (read without waiting, also while a new one is being opened).
    current: std::sync::Mutex<Option<Arc<Session>>>,
    /// Held while a session is being opened.
    opening: Mutex<()>,
    generations: AtomicU64,
    /// Whether sessions note their unsettled deliveries ([`Subscriber::settling_each`]).
    settles_each: bool,
}

impl Subscriber {
    /// Sessions on `queues` (broker names) with `prefetch`, named `name` on the broker,
    /// declaring the topology of `declare` (logical queue names) first.
    pub fn new(
        settings: &super::RabbitSettings,
        declare: Vec<String>,
        name: String,
        queues: Vec<String>,
        prefetch: u16,
    ) -> Self {
        Subscriber {
            declare: (settings.clone(), declare),
            url: settings.connection_url(),
            name,
            queues,
            prefetch,
            current: std::sync::Mutex::new(None),
            opening: Mutex::new(()),
            generations: AtomicU64::new(0),
            settles_each: false,
        }
    }

    /// Sessions whose deliveries are each settled through [`Session::unsettled`] (a
    /// consumer of one queue: its deliveries are pushed in tag order).
    pub fn settling_each(mut self) -> Self {
        debug_assert_eq!(self.queues.len(), 1, "one consumer per channel");
        self.settles_each = self.queues.len() == 1;
        self
    }

    /// The session now, if one is open and not broken.
    pub fn current(&self) -> Option<Arc<Session>> {
        let current = self.current.lock().expect("current session");
        current.as_ref().filter(|s| s.broken().is_none()).cloned()
    }

    /// The open session, or a new one. A broken session is reported once (as an error) and
    /// replaced on the next call.
    pub async fn session(&self) -> Result<Arc<Session>, ProviderError> {
        if let Some(session) = self.take_broken()? {
            return Ok(session);
        }
        let _opening = self.opening.lock().await;
        if let Some(session) = self.current() {
            return Ok(session);
        }
        let session = self.open().await?;
        *self.current.lock().expect("current session") = Some(session.clone());
        Ok(session)
    }

    /// The live session; an error (once) for a broken one, which is dropped.
    fn take_broken(&self) -> Result<Option<Arc<Session>>, ProviderError> {
        let mut current = self.current.lock().expect("current session");
        let Some(session) = &*current else {
            return Ok(None);
        };
        match session.broken() {
            None => Ok(Some(session.clone())),
            Some(reason) => {
                *current = None;
                Err(ProviderError::new(
                    super::KIND,
                    ErrorKind::Unavailable,
                    format!("the consuming connection was lost: {reason}"),
                ))
            }
        }
    }

    async fn open(&self) -> Result<Arc<Session>, ProviderError> {
        let conn = connect(&self.url, &self.name).await?;
        let (settings, declare) = &self.declare;
        if !declare.is_empty() {
            let spare = conn.create_channel().await.map_err(error)?;
            for queue in declare {
                super::topology::declare(&spare, settings, queue).await?;
            }
            let _ = spare.close(200, "declared").await;
        }
        let channel = conn.create_channel().await.map_err(error)?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(error)?;
        let generation = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let tags: Vec<String> = (0..self.queues.len())
            .map(|index| format!("{}-{generation}-{index}", self.name))
            .collect();
        let session = Arc::new(Session {
            conn,
            channel: channel.clone(),
            generation,
            buffer: std::sync::Mutex::new(VecDeque::new()),
            broken: std::sync::Mutex::new(None),
            failed: AtomicBool::new(false),
            arrived: Notify::new(),
            tags: tags.clone(),
            stopping: AtomicBool::new(false),
            pumping: AtomicU64::new(self.queues.len() as u64),
            unsettled: self.settles_each.then(super::acks::Unsettled::default),
        });
        for (index, queue) in self.queues.iter().enumerate() {
            let mut consumer = channel
                .basic_consume(
                    queue,
                    &tags[index],
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(error)?;
            let pumped = Arc::downgrade(&session);
            tokio::spawn(async move {
                loop {
                    let next = consumer.next().await;
                    let Some(session) = pumped.upgrade() else {
                        return;
                    };
                    match next {
                        Some(Ok(delivery)) => {
                            if let Some(unsettled) = &session.unsettled {
                                unsettled.delivered(delivery.delivery_tag);
                            }
                            session
                                .buffer
                                .lock()
                                .expect("delivery buffer")
                                .push_back((index, delivery));
                            session.arrived.notify_one();
                        }
                        Some(Err(e)) => {
                            session.pumping.fetch_sub(1, Ordering::AcqRel);
                            session.fail(e.to_string());
                            return;
                        }
                        None => {
                            session.pumping.fetch_sub(1, Ordering::AcqRel);
                            if session.stopping.load(Ordering::Acquire) {
                                session.arrived.notify_waiters();
                                session.arrived.notify_one();
                            } else {
                                session.fail("the broker ended the consumer".into());
                            }
                            return;
                        }
                    }
                }
            });
        }
        Ok(session)
    }
}

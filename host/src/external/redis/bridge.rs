//! The Redis readiness bridge: a consumer group on each queue's readiness stream. Records
//! are read with `XREADGROUP`, acknowledged (`XACK`, then `XDEL` to keep the stream short)
//! only after the activation is durable; records a crashed host left pending are claimed
//! again with `XAUTOCLAIM` once idle for `claim_after`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::AsyncCommands;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamReadOptions, StreamReadReply,
};

use super::{Keys, Lazy, RedisSettings, error};
use crate::external::{Handle, Notification, ProviderError, ReadinessBridge};

/// How long one `receive` blocks waiting for records.
const BLOCK: Duration = Duration::from_millis(1000);
/// Most records read per call and stream.
const COUNT: usize = 512;

/// The readiness bridge of one Redis provider.
pub struct RedisReadiness {
    /// A connection of its own: `XREADGROUP … BLOCK` holds it while waiting.
    conn: Lazy,
    prefix: String,
    group: String,
    consumer: String,
    claim_after: Duration,
    queues: Vec<String>,
    last_claim: Mutex<Option<Instant>>,
    /// Records were handed out and not yet acknowledged: the next read starts with this
    /// consumer's own pending records (after a failed activation they are delivered again).
    unacknowledged: AtomicBool,
}

/// Where one readiness record sits: its stream and entry id.
#[derive(Debug, Clone)]
struct Record {
    stream: String,
    id: String,
}

impl RedisReadiness {
    /// Connect with `config` for `queues`; pending records idle for `claim_after` are taken
    /// over.
    pub async fn open(config: &RedisSettings, queues: &[String]) -> Result<Self, ProviderError> {
        Ok(RedisReadiness {
            conn: Lazy::new(&config.url, BLOCK + Duration::from_secs(5)),
            prefix: config.key_prefix.clone(),
            group: config.consumer_group.clone(),
            queues: queues.to_vec(),
            consumer: format!(
                "{}-{}-{:08x}",
                hostname(),
                std::process::id(),
                rand::random::<u32>()
            ),
            claim_after: config.claim_after,
            last_claim: Mutex::new(None),
            unacknowledged: AtomicBool::new(false),
        })
    }

    fn queue_of<'a>(&self, stream: &str, queues: &'a [String]) -> Option<&'a String> {
        queues
            .iter()
            .find(|q| Keys::new(&self.prefix, q).readiness == stream)
    }

    /// Claim records idle for `claim_after` (a crashed consumer's), at most once per
    /// `claim_after`.
    async fn claim_abandoned(&self) -> Result<Vec<Notification>, ProviderError> {
        {
            let mut last = self.last_claim.lock().expect("claim clock");
            if last.is_some_and(|t| t.elapsed() < self.claim_after) {
                return Ok(Vec::new());
            }
            *last = Some(Instant::now());
        }
        let mut out = Vec::new();
        let mut conn = self.conn.get().await?;
        for queue in &self.queues {
            let stream = Keys::new(&self.prefix, queue).readiness;
            let reply: StreamAutoClaimReply = conn
                .xautoclaim_options(
                    &stream,
                    &self.group,
                    &self.consumer,
                    self.claim_after.as_millis() as u64,
                    "0-0",
                    StreamAutoClaimOptions::default().count(COUNT),
                )
                .await
                .map_err(error)?;
            out.extend(reply.claimed.into_iter().map(|entry| Notification {
                queue: queue.clone(),
                handle: Handle::new(Record {
                    stream: stream.clone(),
                    id: entry.id,
                }),
            }));
        }
        Ok(out)
    }
}

#[async_trait]
impl ReadinessBridge for RedisReadiness {
    async fn start(&self) -> Result<(), ProviderError> {
        let mut conn = self.conn.get().await?;
        for queue in &self.queues {
            let stream = Keys::new(&self.prefix, queue).readiness;
            // From the stream's start: records written before the first host started count.
            let created: Result<(), redis::RedisError> =
                conn.xgroup_create_mkstream(&stream, &self.group, "0").await;
            match created {
                Ok(()) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(error(e)),
            }
        }
        Ok(())
    }

    async fn receive(&self) -> Result<Vec<Notification>, ProviderError> {
        let queues = &self.queues;
        let mut out = self.claim_abandoned().await?;
        if !out.is_empty() {
            self.unacknowledged.store(true, Ordering::Release);
            return Ok(out);
        }
        let streams: Vec<String> = queues
            .iter()
            .map(|q| Keys::new(&self.prefix, q).readiness)
            .collect();
        let mut reply: Option<StreamReadReply> = None;
        if self.unacknowledged.load(Ordering::Acquire) {
            // Our own pending records (id 0): delivered again without blocking.
            let ids: Vec<&str> = streams.iter().map(|_| "0").collect();
            let options = StreamReadOptions::default()
                .group(&self.group, &self.consumer)
                .count(COUNT);
            reply = self
                .conn
                .get()
                .await?
                .xread_options(&streams, &ids, &options)
                .await
                .map_err(error)?;
            if reply
                .as_ref()
                .is_none_or(|r| r.keys.iter().all(|k| k.ids.is_empty()))
            {
                self.unacknowledged.store(false, Ordering::Release);
                reply = None;
            }
        }
        if reply.is_none() {
            let ids: Vec<&str> = streams.iter().map(|_| ">").collect();
            let options = StreamReadOptions::default()
                .group(&self.group, &self.consumer)
                .count(COUNT)
                .block(BLOCK.as_millis() as usize);
            reply = self
                .conn
                .get()
                .await?
                .xread_options(&streams, &ids, &options)
                .await
                .map_err(error)?;
        }
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            let Some(queue) = self.queue_of(&key.key, queues) else {
                continue;
            };
            out.extend(key.ids.into_iter().map(|entry| Notification {
                queue: queue.clone(),
                handle: Handle::new(Record {
                    stream: key.key.clone(),
                    id: entry.id,
                }),
            }));
        }
        if !out.is_empty() {
            self.unacknowledged.store(true, Ordering::Release);
        }
        Ok(out)
    }

    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ProviderError> {
        let mut by_stream: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for record in notifications
            .iter()
            .filter_map(|n| n.handle.get::<Record>())
        {
            by_stream
                .entry(record.stream.as_str())
                .or_default()
                .push(record.id.as_str());
        }
        let mut pipe = redis::pipe();
        for (stream, ids) in &by_stream {
            pipe.xack(*stream, &self.group, ids).ignore();
            pipe.xdel(*stream, ids).ignore();
        }
        let () = pipe
            .query_async(&mut self.conn.get().await?)
            .await
            .map_err(error)?;
        self.unacknowledged.store(false, Ordering::Release);
        Ok(())
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "wharf".to_string())
}

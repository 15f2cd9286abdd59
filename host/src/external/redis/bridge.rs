//! The Redis readiness bridge: a consumer group on each queue's readiness stream. Records
//! are read with `XREADGROUP`, acknowledged (`XACK`, then `XDEL` to keep the stream short)
//! only after the activation is durable; records a crashed host left pending are claimed
//! again with `XAUTOCLAIM` once idle for `claim_after`. It also promotes due delayed
//! messages (one script: move + readiness record).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, Script};

use super::{Keys, connect, scripts};
use crate::config::RedisProviderConfig;
use crate::external::{ExternalError, Notification, ReadinessBridge};
use crate::queue::now_ms;

/// How long one `receive` blocks waiting for records.
const BLOCK: Duration = Duration::from_millis(1000);
/// Most records read per call and stream.
const COUNT: usize = 512;

/// The readiness bridge of one Redis provider.
pub struct RedisReadiness {
    /// A connection of its own: `XREADGROUP … BLOCK` holds it while waiting.
    conn: ConnectionManager,
    prefix: String,
    group: String,
    consumer: String,
    claim_after: Duration,
    last_claim: Mutex<Option<Instant>>,
    /// Records were handed out and not yet acknowledged: the next read starts with this
    /// consumer's own pending records (after a failed activation they are delivered again).
    unacknowledged: AtomicBool,
    promote: Script,
}

impl RedisReadiness {
    /// Connect with `config`; pending records idle for `claim_after` are taken over.
    pub async fn open(
        config: &RedisProviderConfig,
        claim_after: Duration,
    ) -> Result<Self, ExternalError> {
        Ok(RedisReadiness {
            conn: connect(&config.url, BLOCK + Duration::from_secs(5)).await?,
            prefix: config.key_prefix.clone(),
            group: config.consumer_group.clone(),
            consumer: format!(
                "{}-{}-{:08x}",
                hostname(),
                std::process::id(),
                rand::random::<u32>()
            ),
            claim_after,
            last_claim: Mutex::new(None),
            unacknowledged: AtomicBool::new(false),
            promote: Script::new(scripts::PROMOTE_DUE),
        })
    }

    fn queue_of<'a>(&self, stream: &str, queues: &'a [String]) -> Option<&'a String> {
        queues
            .iter()
            .find(|q| Keys::new(&self.prefix, q).readiness == stream)
    }

    /// Claim records idle for `claim_after` (a crashed consumer's), at most once per
    /// `claim_after`.
    async fn claim_abandoned(&self, queues: &[String]) -> Result<Vec<Notification>, ExternalError> {
        {
            let mut last = self.last_claim.lock().expect("claim clock");
            if last.is_some_and(|t| t.elapsed() < self.claim_after) {
                return Ok(Vec::new());
            }
            *last = Some(Instant::now());
        }
        let mut out = Vec::new();
        let mut conn = self.conn.clone();
        for queue in queues {
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
                .await?;
            out.extend(reply.claimed.into_iter().map(|entry| Notification {
                queue: queue.clone(),
                handle: format!("{stream}\n{}", entry.id),
            }));
        }
        Ok(out)
    }
}

#[async_trait]
impl ReadinessBridge for RedisReadiness {
    async fn start(&self, queues: &[String]) -> Result<(), ExternalError> {
        let mut conn = self.conn.clone();
        for queue in queues {
            let stream = Keys::new(&self.prefix, queue).readiness;
            // From the stream's start: records written before the first host started count.
            let created: Result<(), redis::RedisError> =
                conn.xgroup_create_mkstream(&stream, &self.group, "0").await;
            match created {
                Ok(()) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn receive(&self, queues: &[String]) -> Result<Vec<Notification>, ExternalError> {
        let mut out = self.claim_abandoned(queues).await?;
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
                .clone()
                .xread_options(&streams, &ids, &options)
                .await?;
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
                .clone()
                .xread_options(&streams, &ids, &options)
                .await?;
        }
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            let Some(queue) = self.queue_of(&key.key, queues) else {
                continue;
            };
            out.extend(key.ids.into_iter().map(|entry| Notification {
                queue: queue.clone(),
                handle: format!("{}\n{}", key.key, entry.id),
            }));
        }
        if !out.is_empty() {
            self.unacknowledged.store(true, Ordering::Release);
        }
        Ok(out)
    }

    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ExternalError> {
        let mut by_stream: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for n in notifications {
            if let Some((stream, id)) = n.handle.split_once('\n') {
                by_stream.entry(stream).or_default().push(id);
            }
        }
        let mut pipe = redis::pipe();
        for (stream, ids) in &by_stream {
            pipe.xack(*stream, &self.group, ids).ignore();
            pipe.xdel(*stream, ids).ignore();
        }
        let () = pipe.query_async(&mut self.conn.clone()).await?;
        self.unacknowledged.store(false, Ordering::Release);
        Ok(())
    }

    async fn promote_due(&self, queue: &str) -> Result<u64, ExternalError> {
        let keys = Keys::new(&self.prefix, queue);
        let n: u64 = self
            .promote
            .key(&keys.delayed)
            .key(&keys.ready)
            .key(&keys.readiness)
            .arg(now_ms().div_euclid(1000))
            .arg(queue)
            .arg(1000)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(n)
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "wharf".to_string())
}

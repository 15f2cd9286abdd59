//! The Redis readiness bridge: a consumer group on each queue's readiness stream. Records
//! are read with `XREADGROUP`, acknowledged (`XACK`, then `XDEL` to keep the stream short)
//! only after the activation is durable; records a crashed host left pending are claimed
//! again with `XAUTOCLAIM` once idle for `claim_after`.
//!
//! On one server a single blocking read covers every queue's stream. On a cluster a call
//! may touch one slot only, so each queue's stream is read on a connection of its own, all
//! at once; the first that answers with records wins, and the reads cut short are followed
//! by a read of this consumer's own pending records (on the same connections, so after
//! them), which hands out anything they took.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::{join_all, select_all};
use redis::AsyncCommands;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamReadOptions, StreamReadReply,
};

use super::{KIND, Keys, Lazy, RedisSettings, error};
use crate::external::{Handle, Notification, ProviderError, ReadinessBridge};
use crate::redis_client::RedisTarget;

/// How long one `receive` blocks waiting for records.
const BLOCK: Duration = Duration::from_millis(1000);
/// Most records read per call and stream.
const COUNT: usize = 512;

/// The readiness bridge of one Redis provider.
pub struct RedisReadiness {
    /// The readers: one connection for every stream on a server, one per queue on a cluster.
    /// A reader's own: `XREADGROUP … BLOCK` holds it while waiting.
    readers: Vec<Reader>,
    group: String,
    consumer: String,
    claim_after: Duration,
    last_claim: Mutex<Option<Instant>>,
    /// Records were handed out and not yet acknowledged: the next read starts with this
    /// consumer's own pending records (after a failed activation they are delivered again).
    unacknowledged: AtomicBool,
    /// A read was cut short and may have taken records nobody saw: the next read starts
    /// with this consumer's own pending records too.
    cut_short: AtomicBool,
}

/// One connection and the queues whose streams it reads.
struct Reader {
    conn: Lazy,
    /// (queue, its readiness stream).
    streams: Vec<(String, String)>,
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
        let target = RedisTarget::parse(&config.url).map_err(error)?;
        let timeout = BLOCK + Duration::from_secs(5);
        let stream = |q: &String| (q.clone(), Keys::new(&config.key_prefix, q).readiness);
        let readers = if target.is_cluster() {
            queues
                .iter()
                .map(|q| Reader {
                    conn: Lazy::new(target.clone(), timeout),
                    streams: vec![stream(q)],
                })
                .collect()
        } else {
            vec![Reader {
                conn: Lazy::new(target, timeout),
                streams: queues.iter().map(stream).collect(),
            }]
        };
        Ok(RedisReadiness {
            readers,
            group: config.consumer_group.clone(),
            consumer: format!(
                "{}-{}-{:08x}",
                hostname(),
                std::process::id(),
                rand::random::<u32>()
            ),
            claim_after: config.claim_after,
            last_claim: Mutex::new(None),
            unacknowledged: AtomicBool::new(false),
            cut_short: AtomicBool::new(false),
        })
    }

    /// Every (reader, queue, stream).
    fn streams(&self) -> impl Iterator<Item = (&Reader, &String, &String)> {
        self.readers
            .iter()
            .flat_map(|r| r.streams.iter().map(move |(q, s)| (r, q, s)))
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
        for (reader, queue, stream) in self.streams() {
            let reply: StreamAutoClaimReply = reader
                .conn
                .get()
                .await?
                .xautoclaim_options(
                    stream,
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

    /// One `XREADGROUP` of `reader`'s streams from `id` (`0`: this consumer's own pending
    /// records; `>`: new ones, waiting up to [`BLOCK`]).
    async fn read(&self, reader: &Reader, id: &str) -> Result<Vec<Notification>, ProviderError> {
        let streams: Vec<&str> = reader.streams.iter().map(|(_, s)| s.as_str()).collect();
        let ids: Vec<&str> = streams.iter().map(|_| id).collect();
        let mut options = StreamReadOptions::default()
            .group(&self.group, &self.consumer)
            .count(COUNT);
        if id == ">" {
            options = options.block(BLOCK.as_millis() as usize);
        }
        let reply: Option<StreamReadReply> = reader
            .conn
            .get()
            .await?
            .xread_options(&streams, &ids, &options)
            .await
            .map_err(error)?;
        let mut out = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            let Some((queue, _)) = reader.streams.iter().find(|(_, s)| *s == key.key) else {
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
        Ok(out)
    }

    /// This consumer's own pending records, from every reader.
    async fn read_pending(&self) -> Result<Vec<Notification>, ProviderError> {
        let mut out = Vec::new();
        for read in join_all(self.readers.iter().map(|r| self.read(r, "0"))).await {
            out.extend(read?);
        }
        Ok(out)
    }

    /// New records from the first reader that has some (waiting up to [`BLOCK`]).
    async fn read_new(&self) -> Result<Vec<Notification>, ProviderError> {
        let mut reads: Vec<_> = self
            .readers
            .iter()
            .map(|r| Box::pin(self.read(r, ">")))
            .collect();
        let mut out = Ok(Vec::new());
        while !reads.is_empty() {
            let (read, _, rest) = select_all(reads).await;
            reads = rest;
            if read.as_ref().is_ok_and(|n| n.is_empty()) {
                continue;
            }
            out = read;
            break;
        }
        if !reads.is_empty() {
            // Reads cut short may still take records: the next read collects them.
            self.cut_short.store(true, Ordering::Release);
        }
        out
    }
}

#[async_trait]
impl ReadinessBridge for RedisReadiness {
    async fn start(&self) -> Result<(), ProviderError> {
        for (reader, _, stream) in self.streams() {
            // From the stream's start: records written before the first host started count.
            let created: Result<(), redis::RedisError> = reader
                .conn
                .get()
                .await?
                .xgroup_create_mkstream(stream, &self.group, "0")
                .await;
            match created {
                Ok(()) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(error(e)),
            }
        }
        Ok(())
    }

    async fn receive(&self) -> Result<Vec<Notification>, ProviderError> {
        let mut out = self.claim_abandoned().await?;
        let own_pending =
            self.cut_short.load(Ordering::Acquire) || self.unacknowledged.load(Ordering::Acquire);
        if out.is_empty() && own_pending {
            // Our own pending records (id 0): delivered again without blocking.
            self.cut_short.store(false, Ordering::Release);
            out = self.read_pending().await.inspect_err(|_| {
                self.cut_short.store(true, Ordering::Release);
            })?;
            if out.is_empty() {
                self.unacknowledged.store(false, Ordering::Release);
            }
        }
        if out.is_empty() {
            out = self.read_new().await?;
        }
        if !out.is_empty() {
            self.unacknowledged.store(true, Ordering::Release);
        }
        Ok(out)
    }

    async fn acknowledge(&self, notifications: &[Notification]) -> Result<(), ProviderError> {
        for reader in &self.readers {
            let mut by_stream: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
            let records = Handle::all::<Record>(notifications.iter().map(|n| &n.handle), KIND)?;
            for record in records
                .into_iter()
                .filter(|r| reader.streams.iter().any(|(_, s)| *s == r.stream))
            {
                by_stream
                    .entry(record.stream.as_str())
                    .or_default()
                    .push(record.id.as_str());
            }
            if by_stream.is_empty() {
                continue;
            }
            let mut pipe = redis::pipe();
            for (stream, ids) in &by_stream {
                pipe.xack(*stream, &self.group, ids).ignore();
                pipe.xdel(*stream, ids).ignore();
            }
            let () = pipe
                .query_async(&mut reader.conn.get().await?)
                .await
                .map_err(error)?;
        }
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

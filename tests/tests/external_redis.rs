//! What is particular to the Redis provider, end to end on the real server (`REDIS_URL`),
//! each test under its own key prefix: the exact direct-producer script and key names, batch
//! readiness, replacement and idempotency, priority order, expired leases and fencing,
//! delayed promotion, two providers, and the cluster slot of every key. The behaviour every
//! provider shares is in the conformance suite (`external_conformance`).

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::redis::{DIRECT_PRODUCER, Keys, RedisProvider, RedisSettings};
use wharf_host::external::{
    ConsumerSettings, DeliveryCount, Depth, Envelope, Handle, Provider, ProviderError,
    PublishOptions,
};
use wharf_host::queue::{EnqueueStatus, NewMessage};
use wharf_tests::{TestDir, messages, redis_url, replies, unique_prefix, wait_for};

const T: Duration = Duration::from_secs(30);

fn config(prefix: &str, extra: &str) -> String {
    format!(
        r#"
[external]
reconcile_interval = "300ms"

[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"
promote_interval = "100ms"

[queues.export_order]
handler = "flaky"
storage = "external"
provider = "main"
max_attempts = 2
backoff = "10ms"
max_backoff = "20ms"

[queues.replies]
handler = "not-deployed"
{extra}
"#,
        url = redis_url()
    )
}

async fn start(prefix: &str, extra: &str) -> (TestDir, RunningHost) {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(prefix, extra)).await;
    (dir, host)
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The Redis provider under `prefix`, with the calls these tests make.
struct Storage(RedisProvider);

/// One leased message.
struct Leased {
    token: Handle,
    body: String,
    attempt: u32,
}

impl Storage {
    fn keys(&self, queue: &str) -> Keys {
        self.0.keys(queue)
    }

    async fn publish(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        idempotent: bool,
        due_at_ms: Option<i64>,
    ) -> Result<Vec<EnqueueStatus>, ProviderError> {
        let options = PublishOptions {
            due_at_ms,
            idempotent,
            replace_by_id: true,
        };
        self.0.publish(queue, envelopes, options).await
    }

    async fn enqueue(
        &self,
        queue: &str,
        envelope: &Envelope,
        idempotent: bool,
    ) -> Result<EnqueueStatus, ProviderError> {
        Ok(self
            .publish(queue, std::slice::from_ref(envelope), idempotent, None)
            .await?[0])
    }

    async fn enqueue_batch(
        &self,
        queue: &str,
        envelopes: &[Envelope],
        idempotent: bool,
    ) -> Result<Vec<EnqueueStatus>, ProviderError> {
        self.publish(queue, envelopes, idempotent, None).await
    }

    async fn enqueue_delayed(
        &self,
        queue: &str,
        envelope: &Envelope,
        due_at_ms: i64,
        idempotent: bool,
    ) -> Result<EnqueueStatus, ProviderError> {
        Ok(self
            .publish(
                queue,
                std::slice::from_ref(envelope),
                idempotent,
                Some(due_at_ms),
            )
            .await?[0])
    }

    async fn lease(
        &self,
        queue: &str,
        max: u32,
        lease_ms: u64,
    ) -> Result<Vec<Leased>, ProviderError> {
        let settings = ConsumerSettings {
            prefetch: max,
            lease: Duration::from_millis(lease_ms),
        };
        let consumer = self.0.consumer(queue, settings).await?;
        Ok(consumer
            .receive(max)
            .await?
            .into_iter()
            .map(|d| Leased {
                token: d.handle,
                body: String::from_utf8(d.body.to_vec()).unwrap(),
                attempt: match d.count {
                    DeliveryCount::Exact(n) => n,
                    other => panic!("redis counts deliveries exactly, got {other:?}"),
                },
            })
            .collect())
    }

    async fn settle(&self, queue: &str, tokens: &[Handle]) -> Result<Vec<bool>, ProviderError> {
        let settings = ConsumerSettings {
            prefetch: 1,
            lease: Duration::from_secs(60),
        };
        self.0.consumer(queue, settings).await?.ack(tokens).await
    }

    async fn return_expired(&self, queue: &str) -> Result<u64, ProviderError> {
        self.0.maintenance().return_expired(queue).await
    }

    async fn depth(&self, queue: &str) -> Result<Depth, ProviderError> {
        self.0.depth(queue).await
    }
}

async fn storage(prefix: &str) -> Storage {
    let settings = RedisSettings {
        key_prefix: prefix.to_string(),
        promote_interval: Duration::from_millis(100),
        ..RedisSettings::new(redis_url())
    };
    Storage(RedisProvider::open(settings).await.unwrap())
}

async fn direct_produce(prefix: &str, queue: &str, envelope: &str, priority: i32) {
    let keys = Keys::new(prefix, queue);
    let mut conn = redis().await;
    let done: i64 = redis::Script::new(DIRECT_PRODUCER)
        .key(&keys.ready)
        .key(&keys.readiness)
        .arg(priority)
        .arg(envelope)
        .arg(queue)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(done, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_producer_with_the_exact_script_is_processed() {
    let prefix = unique_prefix("ext");
    let (_dir, host) = start(&prefix, "").await;
    // The documented key names with the default-style prefix and the literal hash tag.
    assert_eq!(
        Keys::new("nexus:queue:", "export_order").ready,
        "nexus:queue:{export_order}"
    );
    for n in 0..5 {
        let envelope = Envelope::new(
            json!({"reply_to": "replies", "n": n}).to_string(),
            Some(format!("order-{n}")),
            0,
        );
        direct_produce(&prefix, "export_order", &envelope.to_json(), 0).await;
    }
    wait_for(T, "five replies", || async {
        (replies(&host).await == vec![0, 1, 2, 3, 4]).then_some(())
    })
    .await;
    // The happy path never touches the SQL queue of the external queue.
    assert!(messages(&host, "export_order").await.is_empty());
    let depth = storage(&prefix).await.depth("export_order").await.unwrap();
    assert_eq!((depth.ready, depth.in_flight), (0, 0));
    host.shutdown().await;
}

#[tokio::test]
async fn a_batch_appends_one_readiness_record_only_when_something_was_added() {
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    let keys = s.keys("q");
    let envelopes: Vec<Envelope> = (0..10)
        .map(|n| Envelope::new(format!("{{\"n\":{n}}}"), Some(format!("id-{n}")), 0))
        .collect();
    let statuses = s.enqueue_batch("q", &envelopes, true).await.unwrap();
    assert!(statuses.iter().all(|s| *s == EnqueueStatus::Added));
    let mut conn = redis().await;
    let len: u64 = conn.xlen(&keys.readiness).await.unwrap();
    assert_eq!(len, 1);
    let ready: u64 = conn.zcard(&keys.ready).await.unwrap();
    assert_eq!(ready, 10);
    // The same batch again in an idempotent queue: all discarded, no readiness record.
    let again = s.enqueue_batch("q", &envelopes, true).await.unwrap();
    assert!(again.iter().all(|s| *s == EnqueueStatus::Discarded));
    let len: u64 = conn.xlen(&keys.readiness).await.unwrap();
    assert_eq!(len, 1);
}

#[tokio::test]
async fn a_message_id_replaces_the_pending_envelope_and_identical_ones_are_discarded() {
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    let v1 = Envelope::new(r#"{"v":1}"#, Some("order-1".into()), 0);
    let v2 = Envelope::new(r#"{"v":2}"#, Some("order-1".into()), 3);
    assert_eq!(
        s.enqueue("q", &v1, true).await.unwrap(),
        EnqueueStatus::Added
    );
    assert_eq!(
        s.enqueue("q", &v1, true).await.unwrap(),
        EnqueueStatus::Discarded
    );
    assert_eq!(
        s.enqueue("q", &v2, true).await.unwrap(),
        EnqueueStatus::Updated
    );
    let leased = s.lease("q", 10, 60_000).await.unwrap();
    assert_eq!(leased.len(), 1, "replaced, not added");
    assert_eq!(Envelope::parse(&leased[0].body).unwrap(), v2);
    assert_eq!(leased[0].attempt, 1);
    // Settling by token works once; a second settle of the same token is a lost lease.
    let item = leased[0].token.clone();
    assert_eq!(
        s.settle("q", std::slice::from_ref(&item)).await.unwrap(),
        vec![true]
    );
    assert_eq!(s.settle("q", &[item]).await.unwrap(), vec![false]);
    // Scheduled messages keep the id semantics.
    let later = Envelope::new(r#"{"v":3}"#, Some("order-2".into()), 0);
    let due = wharf_host::queue::now_ms() + 3_600_000;
    assert_eq!(
        s.enqueue_delayed("q", &later, due, false).await.unwrap(),
        EnqueueStatus::Added
    );
    let newer = Envelope::new(r#"{"v":4}"#, Some("order-2".into()), 0);
    assert_eq!(
        s.enqueue_delayed("q", &newer, due, false).await.unwrap(),
        EnqueueStatus::Updated
    );
    let depth = s.depth("q").await.unwrap();
    assert_eq!((depth.ready, depth.delayed), (0, 1));
}

#[tokio::test]
async fn priorities_run_highest_first_and_expired_leases_return() {
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    for (n, p) in [(1, 0), (2, 5), (3, -1)] {
        s.enqueue(
            "q",
            &Envelope::new(format!("{{\"n\":{n}}}"), None, p),
            false,
        )
        .await
        .unwrap();
    }
    let leased = s.lease("q", 10, 1).await.unwrap();
    let order: Vec<i32> = leased
        .iter()
        .map(|l| Envelope::parse(&l.body).unwrap().priority)
        .collect();
    assert_eq!(order, vec![5, 0, -1]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(s.return_expired("q").await.unwrap(), 3);
    let again = s.lease("q", 10, 60_000).await.unwrap();
    assert_eq!(again.len(), 3);
    assert!(
        again.iter().all(|l| l.attempt == 2),
        "a returned message counts its delivery"
    );
    // The old tokens are fenced off.
    let stale: Vec<Handle> = leased.iter().map(|l| l.token.clone()).collect();
    assert_eq!(s.settle("q", &stale).await.unwrap(), vec![false; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_are_promoted_when_due() {
    let prefix = unique_prefix("ext");
    let (_dir, host) = start(&prefix, "").await;
    let started = std::time::Instant::now();
    host.router
        .enqueue(
            "export_order",
            NewMessage {
                payload: json!({"reply_to": "replies", "n": 1}).to_string(),
                process_at_ms: Some(wharf_host::queue::now_ms() + 1_000),
                ..NewMessage::default()
            },
        )
        .await
        .unwrap();
    let depth = storage(&prefix).await.depth("export_order").await.unwrap();
    assert_eq!((depth.ready, depth.delayed), (0, 1));
    wait_for(T, "the delayed reply", || async {
        (replies(&host).await == vec![1]).then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "not before its time"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_providers_at_once_and_readiness_health_per_provider() {
    let prefix = unique_prefix("ext");
    let other = unique_prefix("ext2");
    let extra = format!(
        r#"
[providers.second]
type = "redis"
url = "{}"
key_prefix = "{other}"

[providers.unused]
type = "redis"
url = "{}"

[queues.import_order]
handler = "flaky"
storage = "external"
provider = "second"
"#,
        redis_url(),
        redis_url()
    );
    let (_dir, host) = start(&prefix, &extra).await;
    host.router
        .enqueue(
            "export_order",
            wharf_tests::msg(json!({"reply_to": "replies", "n": 1})),
        )
        .await
        .unwrap();
    host.router
        .enqueue(
            "import_order",
            wharf_tests::msg(json!({"reply_to": "replies", "n": 2})),
        )
        .await
        .unwrap();
    wait_for(T, "both replies", || async {
        (replies(&host).await == vec![1, 2]).then_some(())
    })
    .await;
    // Each went through its own provider's keys.
    let mut conn = redis().await;
    let a: bool = conn
        .exists(Keys::new(&other, "import_order").readiness)
        .await
        .unwrap();
    assert!(a, "the second provider's readiness stream exists");
    let (_, checks) = host.health.report().await;
    for name in ["main", "second", "unused"] {
        let check = &checks[&format!("external_queue_readiness_{name}")];
        assert!(check.healthy, "{name}: {}", check.detail);
    }
    assert!(
        checks["external_queue_readiness_unused"]
            .detail
            .contains("no consumer")
    );
    host.shutdown().await;
}

/// A busy queue with a fast handler leases its next batch while the current one runs; what
/// it leased ahead and never ran goes back at shutdown with its delivery uncounted, so
/// nothing stays leased and no message has used an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_leased_ahead_go_back_uncounted_at_shutdown() {
    let logs = wharf_tests::capture_logs();
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    const N: usize = 20_000;
    let envelopes: Vec<Envelope> = (0..N)
        .map(|n| Envelope::new(format!("{{\"n\":{n}}}"), None, 0))
        .collect();
    for chunk in envelopes.chunks(1_000) {
        s.enqueue_batch("bulk", chunk, false).await.unwrap();
    }
    let extra = r#"
[queues.bulk]
handler = "noop"
storage = "external"
provider = "main"
concurrency = 1
batch = 1
"#;
    let dir = TestDir::new();
    dir.deploy("noop", "noop");
    let host = dir.start(&config(&prefix, extra)).await;
    let keys = s.keys("bulk");
    let mut conn = redis().await;
    // A few handler calls in, the queue reads ahead (its calls proved fast).
    wait_for(T, "some messages processed", || {
        let mut conn = conn.clone();
        let ready = keys.ready.clone();
        async move {
            let left: usize = conn.zcard(ready).await.unwrap();
            (left <= N - 50).then_some(())
        }
    })
    .await;
    host.shutdown().await;

    let left: usize = conn.zcard(&keys.ready).await.unwrap();
    assert!(left > 0, "the backlog outlasted the test");
    let leased: usize = conn.hlen(&keys.leased).await.unwrap();
    assert_eq!(leased, 0, "every lease was settled or handed back");
    let counted: usize = conn.hlen(&keys.attempts).await.unwrap();
    assert_eq!(
        counted, 0,
        "a message handed back unprocessed has no delivery counted"
    );
    let text = logs.text();
    assert!(
        text.contains("handed unfinished messages back to the broker") && text.contains("bulk"),
        "the read under way at shutdown was handed back: {text}"
    );
}

#[test]
fn every_key_of_a_queue_hashes_to_one_cluster_slot() {
    fn slot(key: &str) -> u16 {
        // Redis Cluster: CRC16 (XMODEM) of the hash tag's content, modulo 16384.
        let tagged = match (key.find('{'), key.find('}')) {
            (Some(open), Some(close)) if close > open + 1 => &key[open + 1..close],
            _ => key,
        };
        crc16::State::<crc16::XMODEM>::calculate(tagged.as_bytes()) % 16384
    }
    // The reference value from the Redis Cluster specification.
    assert_eq!(
        crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
        0x31C3
    );
    for (prefix, queue) in [("nexus:queue:", "export_order"), ("app:", "a:b{c")] {
        let keys = Keys::new(prefix, queue);
        let slots: Vec<u16> = keys.all().iter().map(|k| slot(k)).collect();
        assert!(slots.windows(2).all(|w| w[0] == w[1]), "{queue}: {slots:?}");
    }
}

/// Idempotency compares the MessageJson as JSON values, as the SQL queue does: other
/// whitespace, key order or `1.0` for `1` is the same message. The stored envelope keeps
/// the bytes of its first enqueue.
#[tokio::test]
async fn idempotency_compares_json_values_not_bytes() {
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    let keys = s.keys("q");
    let first = Envelope::new(r#"{"a":1,"b":[1,2]}"#, Some("I2".into()), 0);
    assert_eq!(
        s.enqueue("q", &first, true).await.unwrap(),
        EnqueueStatus::Added
    );
    for same in [
        r#"{ "a": 1, "b": [1, 2] }"#,
        r#"{"b":[1,2],"a":1}"#,
        r#"{"a":1.0,"b":[1,2.0]}"#,
    ] {
        let again = Envelope::new(same, Some("I2".into()), 0);
        assert_eq!(
            s.enqueue("q", &again, true).await.unwrap(),
            EnqueueStatus::Discarded,
            "{same}"
        );
    }
    let mut conn = redis().await;
    let ready: Vec<String> = conn.zrange(&keys.ready, 0, -1).await.unwrap();
    assert_eq!(ready, vec![first.to_json()], "the first bytes stay");
    // A batch with two key orders of one value: one added, the other discarded.
    let batch = [
        Envelope::new(r#"{"x":1,"y":2}"#, Some("I3".into()), 0),
        Envelope::new(r#"{"y":2,"x":1}"#, Some("I3".into()), 0),
    ];
    assert_eq!(
        s.enqueue_batch("q", &batch, true).await.unwrap(),
        vec![EnqueueStatus::Added, EnqueueStatus::Discarded]
    );
    // Another value is an update; outside an idempotent queue an equal one is too.
    let changed = Envelope::new(r#"{"a":2,"b":[1,2]}"#, Some("I2".into()), 0);
    assert_eq!(
        s.enqueue("q", &changed, true).await.unwrap(),
        EnqueueStatus::Updated
    );
    assert_eq!(
        s.enqueue("q", &changed, false).await.unwrap(),
        EnqueueStatus::Updated
    );
    // Leased, the message still counts as queued for idempotency.
    let leased = s.lease("q", 10, 60_000).await.unwrap();
    assert_eq!(leased.len(), 2);
    let equal = Envelope::new(r#"{"b":[1,2],"a":2}"#, Some("I2".into()), 0);
    assert_eq!(
        s.enqueue("q", &equal, true).await.unwrap(),
        EnqueueStatus::Discarded
    );
}

/// An id stored before its hash was kept beside it still works: equal bytes are discarded,
/// anything else replaces it, and from then on values compare.
#[tokio::test]
async fn an_id_stored_without_a_hash_still_compares_and_is_replaced() {
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    let keys = s.keys("q");
    let old = Envelope::new(r#"{"a":1}"#, Some("old".into()), 0);
    let mut conn = redis().await;
    let _: () = redis::pipe()
        .zadd(&keys.ready, old.to_json(), 0)
        .hset(&keys.ids, "old", old.to_json())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        s.enqueue("q", &old, true).await.unwrap(),
        EnqueueStatus::Discarded
    );
    let reordered = Envelope::new(r#"{ "a" : 1 }"#, Some("old".into()), 0);
    assert_eq!(
        s.enqueue("q", &reordered, true).await.unwrap(),
        EnqueueStatus::Discarded,
        "the discard above kept the value's hash"
    );
    let newer = Envelope::new(r#"{"a":2}"#, Some("old".into()), 0);
    assert_eq!(
        s.enqueue("q", &newer, true).await.unwrap(),
        EnqueueStatus::Updated
    );
    let ready: Vec<String> = conn.zrange(&keys.ready, 0, -1).await.unwrap();
    assert_eq!(ready, vec![newer.to_json()]);
    // Settled, the id and its hash are gone: the same value is a new message.
    let leased = s.lease("q", 10, 60_000).await.unwrap();
    s.settle("q", &[leased[0].token.clone()]).await.unwrap();
    let hashes: u64 = conn.hlen(&keys.id_hashes).await.unwrap();
    assert_eq!(hashes, 0);
    assert_eq!(
        s.enqueue("q", &newer, true).await.unwrap(),
        EnqueueStatus::Added
    );
}

/// Byte-identical envelopes without an id are one member of the sorted set: the enqueue
/// reports what Redis kept.
#[tokio::test]
async fn identical_envelopes_without_an_id_are_reported_as_kept_once() {
    let prefix = unique_prefix("ext");
    let s = storage(&prefix).await;
    let keys = s.keys("q");
    let same = Envelope::new(r#"{"n":1}"#, None, 0);
    let batch = vec![same.clone(); 5];
    assert_eq!(
        s.enqueue_batch("q", &batch, false).await.unwrap(),
        [
            vec![EnqueueStatus::Added],
            vec![EnqueueStatus::Discarded; 4]
        ]
        .concat()
    );
    let mut conn = redis().await;
    let ready: u64 = conn.zcard(&keys.ready).await.unwrap();
    assert_eq!(ready, 1);
    // Scheduled again for another time, the one member moves: an update.
    let due = wharf_host::queue::now_ms() + 3_600_000;
    assert_eq!(
        s.enqueue_delayed("q", &same, due, false).await.unwrap(),
        EnqueueStatus::Added
    );
    assert_eq!(
        s.enqueue_delayed("q", &same, due, false).await.unwrap(),
        EnqueueStatus::Discarded
    );
    assert_eq!(
        s.enqueue_delayed("q", &same, due + 60_000, false)
            .await
            .unwrap(),
        EnqueueStatus::Updated
    );
    let delayed: u64 = conn.zcard(&keys.delayed).await.unwrap();
    assert_eq!(delayed, 1);
}

/// `wharf enqueue` into an external queue names what identifies the message there.
#[test]
fn the_cli_names_the_message_id_of_an_external_enqueue() {
    let prefix = unique_prefix("ext");
    let dir = TestDir::new();
    dir.write_config(&config(&prefix, ""));
    let (ok, stdout, stderr) = dir.wharf(&["enqueue", "export_order", "{}", "--id", "o-1"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.trim(),
        "added: in the broker of external queue export_order, MessageId o-1"
    );
    let (ok, stdout, stderr) = dir.wharf(&["enqueue", "export_order", "{}"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.trim(),
        "added: in the broker of external queue export_order, no MessageId (--id gives it one)"
    );
}

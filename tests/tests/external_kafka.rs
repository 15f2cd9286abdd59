//! What is particular to the Kafka provider, on the real broker (`KAFKA_BROKERS`): the
//! committed offsets of both groups read back from the broker (processing commits wait for
//! the slowest unsettled offset, readiness commits leave processing offsets alone), a direct
//! producer keying by MessageId, a silent network cut turning health red through the broker
//! probe, and two hosts sharing the processing group — partitions
//! split between them, one SIGKILLed mid-load, nothing lost. The behaviour every provider
//! shares is in the conformance suite (`external_conformance`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::Envelope;
use wharf_host::external::kafka::KafkaSettings;
use wharf_tests::kafka::{KafkaReader, TEST_PROPERTIES, kafka_brokers, kafka_produce};
use wharf_tests::{
    PgSchema, TestDir, database_url, messages, spawn_wharf, unique_prefix, wait_for,
};

const T: Duration = Duration::from_secs(60);

/// Topic and group names of a test's own on the shared broker.
fn settings(partitions: i32) -> KafkaSettings {
    let prefix = unique_prefix("kafka").replace(':', ".");
    let mut s = KafkaSettings::new(kafka_brokers());
    s.processing_group = format!("{prefix}processing");
    s.readiness_group = format!("{prefix}readiness");
    s.topic_prefix = prefix;
    s.partitions = partitions;
    s
}

fn config(s: &KafkaSettings, queue_extra: &str) -> String {
    format!(
        r#"
[external]
reconcile_interval = "300ms"

[providers.kafka]
type = "kafka"
brokers = "{brokers}"
topic_prefix = "{prefix}"
processing_group = "{processing}"
readiness_group = "{readiness}"
partitions = {partitions}
{TEST_PROPERTIES}

[queues.export_order]
handler = "flaky"
storage = "external"
provider = "kafka"
backoff = "10ms"
max_backoff = "20ms"
{queue_extra}

[queues.replies]
handler = "not-deployed"
"#,
        brokers = s.brokers,
        prefix = s.topic_prefix,
        processing = s.processing_group,
        readiness = s.readiness_group,
        partitions = s.partitions,
    )
}

fn envelope(n: usize, extra: serde_json::Value) -> Vec<u8> {
    let mut payload = json!({"reply_to": "replies", "n": n});
    payload
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    Envelope::new(payload.to_string(), Some(format!("order-{n}")), 0)
        .to_json()
        .into_bytes()
}

async fn blocking<T: Send + 'static>(
    reader: &Arc<KafkaReader>,
    work: impl FnOnce(&KafkaReader) -> T + Send + 'static,
) -> T {
    let reader = reader.clone();
    tokio::task::spawn_blocking(move || work(&reader))
        .await
        .unwrap()
}

/// The `n` of every reply.
async fn done(host: &wharf_host::RunningHost) -> BTreeSet<i64> {
    messages(host, "replies")
        .await
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
            v["seen"]["n"].as_i64().unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_commits_wait_for_the_slow_first_message_and_readiness_commits_are_apart() {
    // One partition: a slow first message, four fast ones after it.
    let s = settings(1);
    let topic = s.topic("export_order");
    let reader = Arc::new(KafkaReader::new(&s.brokers));
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(&s, "concurrency = 8")).await;
    kafka_produce(
        &s.brokers,
        &topic,
        Some("order-0"),
        &envelope(0, json!({"sleep_ms": 3000})),
    )
    .await;
    for n in 1..5 {
        kafka_produce(
            &s.brokers,
            &topic,
            Some(&format!("order-{n}")),
            &envelope(n, json!({})),
        )
        .await;
    }
    wait_for(T, "the four fast messages", || async {
        (done(&host).await == BTreeSet::from([1, 2, 3, 4])).then_some(())
    })
    .await;
    // Readiness saw all five and committed them; processing stays at the slow one.
    let (group, readiness) = (s.processing_group.clone(), s.readiness_group.clone());
    let t = topic.clone();
    wait_for(
        T,
        "the readiness group to commit every notification",
        || {
            let (reader, readiness, t) = (reader.clone(), readiness.clone(), t.clone());
            async move {
                let committed = blocking(&reader, move |r| r.committed(&readiness, &t)).await;
                (committed.get(&0) == Some(&5)).then_some(())
            }
        },
    )
    .await;
    let t = topic.clone();
    let g = group.clone();
    let processing = blocking(&reader, move |r| r.committed(&g, &t)).await;
    assert!(
        processing.get(&0).copied().unwrap_or(0) == 0,
        "the commit must not pass offset 0 while it runs: {processing:?}"
    );
    assert!(
        !done(&host).await.contains(&0),
        "the slow message is still running"
    );
    // Once it finishes, the commit moves past all five.
    wait_for(T, "the slow message and the commit past it", || {
        let (reader, g, t) = (reader.clone(), group.clone(), topic.clone());
        let host = &host;
        async move {
            let committed = blocking(&reader, move |r| r.committed(&g, &t)).await;
            (done(host).await.contains(&0) && committed.get(&0) == Some(&5)).then_some(())
        }
    })
    .await;
    host.shutdown().await;
}

/// The partitions a spawned host holds, from the last assignment it logged.
fn held_by(dir: &TestDir) -> BTreeSet<i32> {
    let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
    let Some(line) = log
        .lines()
        .rev()
        .find(|l| l.contains("kafka partitions assigned"))
    else {
        return BTreeSet::new();
    };
    // Without the terminal colours the log may carry.
    let mut plain = String::new();
    let mut escape = false;
    for c in line.chars() {
        match (escape, c) {
            (false, '\u{1b}') => escape = true,
            (true, 'm') => escape = false,
            (true, _) => {}
            (false, c) => plain.push(c),
        }
    }
    let list = plain
        .split("partitions=[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or_default();
    list.split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_split_the_partitions_and_one_killed_mid_load_loses_nothing() {
    let s = settings(4);
    let topic = s.topic("export_order");
    let schema = PgSchema::new();
    let queue_extra = "concurrency = 4\ntimeout = \"5s\"\ninbox = { store = \"sql\" }";
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n[storage]\nurl = \"{}\"\nschema = \"{}\"\npoll_interval = \"100ms\"\n{}",
        database_url(),
        schema.name,
        config(&s, queue_extra)
    );
    let dirs = [TestDir::new(), TestDir::new()];
    for dir in &dirs {
        dir.deploy("flaky", "flaky");
        std::fs::write(dir.path("wharf.toml"), &text).unwrap();
    }
    const N: usize = 2000;
    // Published by a plain producer (not Wharf's code), keyed by MessageId. The first one
    // before the hosts start: the test broker hands out a new topic's partitions only once
    // it holds a message.
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .create()
        .unwrap();
    let provider = wharf_host::external::Providers::open(
        &wharf_host::Config::load(&dirs[0].path("wharf.toml")).unwrap(),
    )
    .await
    .unwrap();
    provider
        .get("kafka")
        .unwrap()
        .prepare(&["export_order".to_string()])
        .await
        .unwrap();
    kafka_produce(&s.brokers, &topic, Some("order-0"), &envelope(0, json!({}))).await;
    let mut first = spawn_wharf(dirs[0].dir.path());
    let mut second = spawn_wharf(dirs[1].dir.path());
    wait_for(T, "both hosts to share the partitions", || async {
        let split = [held_by(&dirs[0]), held_by(&dirs[1])];
        let all: BTreeSet<i32> = split.iter().flatten().copied().collect();
        (split.iter().all(|a| !a.is_empty()) && all.len() == 4).then_some(())
    })
    .await;
    let records = (1..N).map(|n| (format!("order-{n}"), envelope(n, json!({"sleep_ms": 4}))));
    wharf_tests::kafka::kafka_produce_all(&producer, &topic, records).await;

    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 2)
        .await
        .unwrap();
    let seen = || async {
        let all = store
            .list(&wharf_host::queue::MessageFilter {
                queue: Some("replies".into()),
                status: None,
                limit: 1_000_000,
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for m in all {
            let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
            *counts.entry(v["seen"]["n"].as_u64().unwrap()).or_default() += 1;
        }
        counts
    };
    wait_for(T, "300 messages before the kill", || async {
        (seen().await.len() >= 300).then_some(())
    })
    .await;
    first.kill(); // SIGKILL: its partitions move to the other host after its session ends
    assert!(seen().await.len() < N, "killed too late to prove anything");
    wait_for(
        Duration::from_secs(120),
        "every message on the surviving host",
        || async { (seen().await.len() == N).then_some(()) },
    )
    .await;
    let twice: Vec<(u64, usize)> = seen().await.into_iter().filter(|(_, c)| *c > 1).collect();
    // The inbox skips redeliveries of messages that succeeded; only those running on the
    // killed host (at most its concurrency) can have replied twice.
    assert!(
        twice.len() <= 4,
        "duplicates beyond the documented ones: {twice:?}"
    );
    second.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_stops_start_up_when_the_host_may_not_create_it() {
    let s = settings(1);
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let text = config(&s, "").replace(
        "partitions = 1\n",
        "partitions = 1\ncreate_topics = false\n",
    );
    let path = dir.write_config(&text);
    let error = match wharf_host::start(wharf_host::Config::load(&path).unwrap()).await {
        Ok(_) => panic!("started without its topic"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains(&s.topic("export_order")) && error.contains("create_topics = false"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueued_messages_are_keyed_by_their_message_id() {
    let s = settings(3);
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(&s, "")).await;
    for n in 0..3 {
        host.router
            .enqueue(
                "export_order",
                wharf_host::queue::NewMessage {
                    id: Some(format!("order-{n}")),
                    payload: json!({"reply_to": "replies", "n": n}).to_string(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let replies = wait_for(T, "three replies", || async {
        let all = messages(&host, "replies").await;
        (all.len() == 3).then_some(all)
    })
    .await;
    for reply in replies {
        let v: serde_json::Value = serde_json::from_str(&reply.payload).unwrap();
        let headers: BTreeMap<String, String> = serde_json::from_value(v["headers"].clone())
            .unwrap_or_else(|_| {
                v["headers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| (h[0].as_str().unwrap().into(), h[1].as_str().unwrap().into()))
                    .collect()
            });
        assert_eq!(
            headers.get("kafka-key"),
            Some(&format!("order-{}", v["seen"]["n"])),
            "{headers:?}"
        );
        assert!(headers.contains_key("kafka-partition") && headers.contains_key("kafka-offset"));
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_network_cut_turns_health_red_through_the_broker_probe() {
    let node = wharf_tests::kafka::KafkaNode::start().await;
    let mut s = settings(1);
    s.brokers = node.brokers();
    let text = config(&s, "").replace("[external]\n", "[external]\nprobe_interval = \"500ms\"\n");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&text).await;
    let readiness = || async {
        let (_, checks) = host.health.report().await;
        let check = &checks["external_queue_readiness_kafka"];
        (check.healthy, check.detail.clone())
    };
    wait_for(T, "the provider to be ready", || async {
        readiness().await.0.then_some(())
    })
    .await;
    // Traffic held, connections open: librdkafka's own socket timeout is a minute.
    node.proxy().hold(true);
    let detail = wait_for(
        Duration::from_secs(10),
        "the health check to turn red",
        || async {
            let (healthy, detail) = readiness().await;
            (!healthy).then_some(detail)
        },
    )
    .await;
    assert!(detail.contains("broker probe"), "{detail}");
    node.proxy().hold(false);
    wait_for(T, "the health check to be green again", || async {
        readiness().await.0.then_some(())
    })
    .await;
    host.router
        .enqueue(
            "export_order",
            wharf_tests::msg(json!({"reply_to": "replies", "n": 7})),
        )
        .await
        .unwrap();
    wait_for(T, "the message to be processed after the cut", || async {
        done(&host).await.contains(&7).then_some(())
    })
    .await;
    host.shutdown().await;
}

/// A topic that exists with another partition count than `partitions` is used as it is,
/// and the host says so once when it prepares the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_topic_with_other_partitions_is_named_at_start() {
    use wharf_host::external::Provider;
    use wharf_host::external::kafka::KafkaProvider;
    let logs = wharf_tests::capture_logs();
    let one = settings(1);
    let queues = ["export_order".to_string()];
    KafkaProvider::open("first", one.clone())
        .unwrap()
        .prepare(&queues)
        .await
        .unwrap();
    let topic = one.topic("export_order");
    let reader = Arc::new(KafkaReader::new(&one.brokers));
    let made = blocking(&reader, {
        let topic = topic.clone();
        move |reader| reader.partitions(&topic).len()
    })
    .await;
    assert_eq!(made, 1);
    let three = KafkaSettings {
        partitions: 3,
        ..one
    };
    KafkaProvider::open("kafka", three)
        .unwrap()
        .prepare(&queues)
        .await
        .unwrap();
    let text = logs.text();
    let expected = format!(
        "topic `{topic}` already exists with 1 partitions and is used as it is: `partitions = 3` of [providers.kafka] applies only to topics the host creates"
    );
    assert_eq!(text.matches(&expected).count(), 1, "{text}");
}

/// The autoscaling signals of a Kafka queue: its processing group's lag and the age of the
/// oldest message it has not committed, in the metrics and `GET /api/v1/queues`. Messages
/// published while the handler is not deployed wait in the topic (the lag counts them, the
/// age grows); once it is, they are processed and the lag returns to 0, the age to none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processing_groups_lag_is_sampled() {
    let s = settings(2);
    let dir = TestDir::new();
    let path = dir.write_config(&config(&s, ""));
    let host = wharf_host::start(wharf_host::Config::load(&path).unwrap())
        .await
        .unwrap();
    let published = std::time::Instant::now();
    for n in 0..20 {
        host.router
            .enqueue(
                "export_order",
                wharf_host::queue::NewMessage {
                    id: Some(format!("order-{n}")),
                    payload: json!({"reply_to": "replies", "n": n}).to_string(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let lag_of = || async { wharf_tests::queue_info(&host, "export_order").await["lag"].as_u64() };
    wait_for(T, "a lag of 20 while the handler is missing", || async {
        (lag_of().await == Some(20)).then_some(())
    })
    .await;
    let series = "wharf_external_lag_messages{queue=\"export_order\",provider=\"kafka\"}";
    assert_eq!(wharf_tests::scrape(&host).await.get(series), Some(&20.0));
    // The oldest waiting message's age: its record's timestamp, growing while it waits, and
    // never more than the time since it was published.
    let age_of = || async {
        wharf_tests::queue_info(&host, "export_order").await["oldest_ready_age_ms"].as_i64()
    };
    let age = wait_for(T, "the oldest waiting message's age past 1.5 s", || async {
        age_of().await.filter(|&ms| ms >= 1500)
    })
    .await;
    let most = published.elapsed().as_millis() as i64 + 50;
    assert!(age <= most, "an age of {age} ms, published {most} ms ago");
    let series = "wharf_queue_oldest_ready_seconds{queue=\"export_order\"}";
    let seconds = wharf_tests::scrape(&host).await[series];
    assert!(seconds >= 1.5, "the metric says {seconds} s");
    dir.deploy("flaky", "flaky");
    wait_for(T, "twenty replies", || async {
        (done(&host).await.len() == 20).then_some(())
    })
    .await;
    wait_for(T, "the lag back to 0", || async {
        (lag_of().await == Some(0)).then_some(())
    })
    .await;
    wait_for(T, "no waiting message, no age", || async {
        age_of().await.is_none().then_some(())
    })
    .await;
    host.shutdown().await;
}

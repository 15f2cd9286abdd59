//! A rolling restart: three `wharf run` processes on one PostgreSQL, each stopped with SIGTERM
//! and started again, one at a time, while 20,000 messages arrive — as a Kubernetes rolling
//! update does. Nothing is lost, and the messages that ran twice are at most what was in
//! flight when a host was stopped. The handler sends its echo at once, outside the outcome
//! (`send_now`), so every run leaves one: a message that ran twice has two.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wharf_host::queue::{MessageFilter, QueueStore, Status};
use wharf_tests::{PgSchema, TestDir, WharfProcess, database_url, msg, spawn_wharf, wait_for};

const N: u64 = 20_000;

/// Messages sent before each of the three stops, and after the last restart.
const PART: u64 = N / 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /readyz` answers 200 on `port`.
fn ready(port: u16) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    agent
        .get(&format!("http://127.0.0.1:{port}/readyz"))
        .call()
        .is_ok_and(|r| r.status() == 200)
}

async fn wait_ready(port: u16) {
    wait_for(Duration::from_secs(60), "the host ready", || async move {
        tokio::task::spawn_blocking(move || ready(port))
            .await
            .unwrap()
            .then_some(())
    })
    .await;
}

async fn count(store: &Arc<dyn QueueStore>, status: Status) -> u64 {
    store
        .counts("work")
        .await
        .unwrap()
        .into_iter()
        .find(|(s, _)| *s == status)
        .map_or(0, |(_, n)| n)
}

/// How many echoes each message left.
async fn runs(store: &Arc<dyn QueueStore>) -> BTreeMap<u64, u64> {
    let filter = MessageFilter {
        queue: Some("replies".into()),
        limit: 1_000_000,
        ..Default::default()
    };
    let mut runs = BTreeMap::new();
    for m in store.list(&filter).await.unwrap() {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        *runs.entry(v["seen"]["n"].as_u64().unwrap()).or_default() += 1;
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_of_three_hosts_loses_nothing() {
    let schema = PgSchema::new();
    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 4)
        .await
        .unwrap();
    let dirs = [TestDir::new(), TestDir::new(), TestDir::new()];
    let ports: Vec<u16> = dirs.iter().map(|_| free_port()).collect();
    for (i, dir) in dirs.iter().enumerate() {
        dir.deploy("flaky", "flaky");
        let config = format!(
            "[host]\nid = \"host-{i}\"\nadmin_listen = \"127.0.0.1:{port}\"\nshutdown_grace = \"5s\"\nmax_instances = 64\n\n\
             [storage]\nurl = \"{url}\"\nschema = \"{schema}\"\npoll_interval = \"50ms\"\n\n\
             [queues.work]\nhandler = \"flaky\"\nconcurrency = 16\n\n[queues.replies]\n",
            port = ports[i],
            url = database_url(),
            schema = schema.name
        );
        std::fs::write(dir.path("wharf.toml"), config).unwrap();
    }
    let mut hosts: Vec<Option<WharfProcess>> = dirs
        .iter()
        .map(|d| Some(spawn_wharf(d.dir.path())))
        .collect();
    for port in &ports {
        wait_ready(*port).await;
    }

    // 20,000 messages in four parts: one before each stop, the last after the restarts, so
    // every restart happens while messages arrive and run.
    let enqueue_part = |part: u64| {
        let store = store.clone();
        async move {
            let messages: Vec<_> = (part * PART..(part + 1) * PART)
                .map(|n| msg(json!({"n": n, "reply_to": "replies", "send_now": true})))
                .collect();
            store.enqueue_many("work", messages, false).await.unwrap();
        }
    };

    // One host at a time: stopped (SIGTERM, waited for), started again, ready, then the next.
    let mut in_flight_at_stops = 0;
    for (i, dir) in dirs.iter().enumerate() {
        enqueue_part(i as u64).await;
        wait_for(Duration::from_secs(30), "work under way", || async {
            (count(&store, Status::Processing).await > 0).then_some(())
        })
        .await;
        in_flight_at_stops += count(&store, Status::Processing).await;
        let stopping = Instant::now();
        let mut host = hosts[i].take().expect("running");
        tokio::task::spawn_blocking(move || host.terminate())
            .await
            .unwrap();
        assert!(
            stopping.elapsed() < Duration::from_secs(15),
            "host-{i} took {:?} to stop",
            stopping.elapsed()
        );
        hosts[i] = Some(spawn_wharf(dir.dir.path()));
        wait_ready(ports[i]).await;
    }
    enqueue_part(3).await;

    wait_for(
        Duration::from_secs(120),
        "every message processed",
        || async { (count(&store, Status::Processed).await == N).then_some(()) },
    )
    .await;
    for host in hosts.iter_mut().flatten() {
        host.terminate();
    }
    let runs = runs(&store).await;
    assert_eq!(runs.len() as u64, N, "a message was lost");
    let reruns: u64 = runs.values().map(|r| r - 1).sum();
    assert!(
        reruns <= in_flight_at_stops,
        "{reruns} messages ran again, more than the {in_flight_at_stops} in flight at the stops"
    );
    println!("rolling restart: {reruns} re-runs, {in_flight_at_stops} in flight at the stops");
}

/// The same on a Kafka-backed queue: each stop hands its partitions to the others (the test
/// broker rebalances slowly), each start takes some back. The consumer inbox skips
/// redeliveries of messages that succeeded, so a message runs twice only if it was in flight
/// on a stopped host: at most its `concurrency` per stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_of_three_hosts_on_kafka_loses_nothing() {
    use wharf_tests::kafka::{TEST_PROPERTIES, kafka_brokers};
    const CONCURRENCY: u64 = 4;
    let prefix = wharf_tests::unique_prefix("rolling").replace(':', ".");
    let brokers = kafka_brokers();
    let schema = PgSchema::new();
    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 4)
        .await
        .unwrap();
    let dirs = [TestDir::new(), TestDir::new(), TestDir::new()];
    let ports: Vec<u16> = dirs.iter().map(|_| free_port()).collect();
    for (i, dir) in dirs.iter().enumerate() {
        dir.deploy("flaky", "flaky");
        let config = format!(
            "[host]\nid = \"host-{i}\"\nadmin_listen = \"127.0.0.1:{port}\"\nshutdown_grace = \"5s\"\n\n\
             [storage]\nurl = \"{url}\"\nschema = \"{schema}\"\npoll_interval = \"100ms\"\n\n\
             [external]\nreconcile_interval = \"300ms\"\n\n\
             [providers.kafka]\ntype = \"kafka\"\nbrokers = \"{brokers}\"\ntopic_prefix = \"{prefix}\"\n\
             processing_group = \"{prefix}processing\"\nreadiness_group = \"{prefix}readiness\"\npartitions = 6\n{TEST_PROPERTIES}\n\n\
             [queues.work]\nhandler = \"flaky\"\nstorage = \"external\"\nprovider = \"kafka\"\nconcurrency = {CONCURRENCY}\n\
             inbox = {{ store = \"sql\" }}\n\n[queues.replies]\n",
            port = ports[i],
            url = database_url(),
            schema = schema.name
        );
        std::fs::write(dir.path("wharf.toml"), config).unwrap();
    }
    let topic = format!("{prefix}work");
    // The topic made first, with its partitions (the test broker hands a new topic's
    // partitions to a group only once it holds messages): the first part is published before the hosts start.
    let providers = wharf_host::external::Providers::open(
        &wharf_host::Config::load(&dirs[0].path("wharf.toml")).unwrap(),
    )
    .await
    .unwrap();
    providers
        .get("kafka")
        .unwrap()
        .prepare(&["work".to_string()])
        .await
        .unwrap();
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    // The first part before the hosts start, then one before each further stop and the last
    // after the restarts, so every restart happens while messages arrive and run.
    publish_part(&producer, &topic, 0).await;
    let mut hosts: Vec<Option<WharfProcess>> = dirs
        .iter()
        .map(|d| Some(spawn_wharf(d.dir.path())))
        .collect();
    for port in &ports {
        wait_ready(*port).await;
    }
    for (i, dir) in dirs.iter().enumerate() {
        if i > 0 {
            publish_part(&producer, &topic, i as u64).await;
        }
        wait_for(
            Duration::from_secs(120),
            &format!("echoes before stop {i}"),
            || async {
                let seen = runs(&store).await.len() as u64;
                (seen > i as u64 * PART + 500).then_some(())
            },
        )
        .await;
        let mut host = hosts[i].take().expect("running");
        tokio::task::spawn_blocking(move || host.terminate())
            .await
            .unwrap();
        let assigned_before = assignments(dir);
        hosts[i] = Some(spawn_wharf(dir.dir.path()));
        wait_ready(ports[i]).await;
        // As an operator would before the next: the group has rebalanced and the restarted
        // host consumes again (the test broker takes its time).
        wait_for(
            Duration::from_secs(120),
            &format!("host-{i} assigned partitions again"),
            || async { (assignments(dir) > assigned_before).then_some(()) },
        )
        .await;
    }
    publish_part(&producer, &topic, 3).await;
    let all = wait_for(Duration::from_secs(180), "every message echoed", || async {
        let runs = runs(&store).await;
        (runs.len() as u64 == N).then_some(runs)
    })
    .await;
    for host in hosts.iter_mut().flatten() {
        host.terminate();
    }
    let reruns: u64 = all.values().map(|r| r - 1).sum();
    assert!(
        reruns <= 3 * CONCURRENCY,
        "{reruns} messages ran again, more than three stops of {CONCURRENCY} in flight"
    );
    println!("rolling restart on Kafka: {reruns} re-runs");
}

/// How many times the host of `dir` was assigned Kafka partitions (its log says so).
fn assignments(dir: &TestDir) -> usize {
    std::fs::read_to_string(dir.path("wharf.log"))
        .unwrap_or_default()
        .matches("kafka partitions assigned")
        .count()
}

/// Publish part `part` of the messages ([`PART`] of them) to `topic`, keyed by MessageId, as
/// a plain producer would.
async fn publish_part(producer: &rdkafka::producer::FutureProducer, topic: &str, part: u64) {
    let records = (part * PART..(part + 1) * PART).map(|n| {
        let key = format!("m-{n}");
        let payload = json!({"n": n, "reply_to": "replies", "send_now": true, "sleep_ms": 5});
        let body = wharf_host::external::Envelope::new(payload.to_string(), Some(key.clone()), 0)
            .to_json();
        (key, body.into_bytes())
    });
    wharf_tests::kafka::kafka_produce_all(producer, topic, records).await;
}

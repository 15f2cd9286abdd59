//! End-to-end throughput through Kafka external pending storage against a plain rdkafka
//! consume + commit loop on the same broker, in the same run (`KAFKA_BROKERS`, default
//! `127.0.0.1:9092`). Each round, for the tuned queue (concurrency 256, batch 256) and the
//! queue defaults:
//!
//! - **raw**: 100k envelopes produced to a new 6-partition topic (idempotent producer,
//!   `acks=all`, pipelined), then timed from `subscribe` until a plain `BaseConsumer` loop in
//!   a new group has taken every one, storing each message's offset after it was taken and
//!   committing the stored offsets (librdkafka's auto-commit of stored offsets, the
//!   at-least-once pattern rdkafka documents); the clock stops at the last message, and a
//!   final synchronous commit follows, untimed;
//! - **wharf**: a host with a `kafka` provider (topic prefix and groups unique to the run)
//!   and queue `bench` (`storage = "external"`, no handler yet); 100k envelopes published
//!   through the provider in chunks of 1000, then the `noop` guest deployed, timed from when
//!   the handler registry serves it until the host has processed all of them (counted from
//!   the pipeline's per-message "message processed" debug event). Afterwards, untimed, the
//!   processing group's committed offsets must add up to 100k within 30 s.
//!
//! On the test broker a consumer group join takes 2–3 s, which dominates both clocks; each run
//! also prints its rate after the first message.
//!
//! Prints each run and, per configuration, the median rate over the rounds
//! (`WHARF_BENCH_ROUNDS`, default 2) and Wharf's share of the raw loop's rate.

mod common;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use wharf_host::Config;
use wharf_host::external::kafka::{KafkaProvider, KafkaSettings};
use wharf_host::external::{Envelope, Provider, PublishOptions};

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

const MESSAGES: u64 = 100_000;
const CHUNK: u64 = 1000;
const PARTITIONS: i32 = 6;

/// The Wharf queue's sizes (`None`: the queue defaults).
const SETUPS: [(&str, Option<(u32, u32)>); 2] = [
    ("concurrency 256, batch 256", Some((256, 256))),
    ("queue defaults", None),
];

fn main() {
    if common::filtered_out("end-to-end kafka external raw rdkafka") {
        return;
    }
    let rounds = common::rounds();
    common::count_processed();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(measure(rounds));
}

fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn envelope(n: u64) -> Envelope {
    Envelope::new(
        format!(r#"{{"order_id":"{n}","customer":"Ada","total_cents":1999}}"#),
        None,
        0,
    )
}

fn rate(elapsed: Duration) -> f64 {
    MESSAGES as f64 / elapsed.as_secs_f64()
}

/// Settings unique to `run`: 6 partitions, quick group joins on the test broker.
fn settings(run: u64) -> KafkaSettings {
    let prefix = format!("wharf-bench.{}.{run}.", std::process::id());
    let mut s = KafkaSettings::new(brokers());
    s.processing_group = format!("{prefix}processing");
    s.readiness_group = format!("{prefix}readiness");
    s.topic_prefix = prefix;
    s.partitions = PARTITIONS;
    s
}

const QUICK_JOIN: [(&str, &str); 2] = [
    ("session.timeout.ms", "6000"),
    ("heartbeat.interval.ms", "1000"),
];

async fn measure(rounds: usize) {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let cache = tempfile::tempdir().unwrap();
    let mut raw_rates = Vec::new();
    let mut wharf_rates: Vec<Vec<f64>> = vec![Vec::new(); SETUPS.len()];
    let mut run = 0;
    println!(
        "kafka end to end, no-op guest, {MESSAGES} messages, {PARTITIONS} partitions, {rounds} round(s)"
    );
    for round in 1..=rounds {
        run += 1;
        let elapsed = raw_once(run).await;
        println!(
            "round {round}: {:<44} {:>8.0} msg/s ({:.2} s)",
            "raw rdkafka consume+store+commit",
            rate(elapsed),
            elapsed.as_secs_f64()
        );
        raw_rates.push(rate(elapsed));
        for (i, (label, sizes)) in SETUPS.iter().enumerate() {
            run += 1;
            let elapsed = wharf_once(run, *sizes, &guest, cache.path()).await;
            println!(
                "round {round}: {:<44} {:>8.0} msg/s ({:.2} s)",
                format!("wharf, {label}"),
                rate(elapsed),
                elapsed.as_secs_f64()
            );
            wharf_rates[i].push(rate(elapsed));
        }
    }
    let raw = common::median(raw_rates);
    println!("\nmedian of {rounds} round(s), msg/s:");
    println!("  {:<44} {raw:>8.0}", "raw rdkafka consume+store+commit");
    for (i, (label, _)) in SETUPS.iter().enumerate() {
        let wharf = common::median(wharf_rates[i].clone());
        println!(
            "  {:<44} {wharf:>8.0}   = {:.1} % of the raw loop",
            format!("wharf, {label}"),
            100.0 * wharf / raw
        );
    }
}

/// Create the topic and produce every envelope through a plain producer, pipelined.
async fn produce_raw(s: &KafkaSettings, topic: &str) {
    let provider = KafkaProvider::open("bench-raw", s.clone()).unwrap();
    provider.prepare(&["bench".to_string()]).await.unwrap();
    let producer: FutureProducer = s.producer().create().unwrap();
    let started = Instant::now();
    for chunk in 0..MESSAGES / CHUNK {
        let bodies: Vec<String> = (0..CHUNK)
            .map(|i| envelope(chunk * CHUNK + i).to_json())
            .collect();
        let sends = bodies.iter().map(|body| {
            producer.send(
                FutureRecord::<(), _>::to(topic).payload(body.as_str()),
                Duration::from_secs(30),
            )
        });
        for sent in futures_util::future::join_all(sends).await {
            sent.map_err(|(e, _)| e).unwrap();
        }
    }
    println!("    (produced at {:.0} msg/s)", rate(started.elapsed()));
}

/// The raw loop in a blocking thread: take every message, store its offset, let
/// librdkafka commit the stored offsets; a final synchronous commit, untimed.
async fn raw_once(run: u64) -> Duration {
    let s = settings(run);
    let topic = s.topic("bench");
    produce_raw(&s, &topic).await;
    let mut config = s.client();
    config
        .set("group.id", format!("{}raw", s.topic_prefix))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false");
    for (k, v) in QUICK_JOIN {
        config.set(k, v);
    }
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().unwrap();
        let started = Instant::now();
        consumer.subscribe(&[&topic]).unwrap();
        let mut taken = 0;
        let mut first = None;
        while taken < MESSAGES {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                let message = message.expect("a message");
                first.get_or_insert_with(|| started.elapsed());
                consumer.store_offset_from_message(&message).unwrap();
                taken += 1;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "raw loop stalled at {taken}"
            );
        }
        let elapsed = started.elapsed();
        consumer.commit_consumer_state(CommitMode::Sync).unwrap();
        let first = first.unwrap_or_default();
        println!(
            "    (first message {:.2} s after subscribing: the group join; {:.0} msg/s after it)",
            first.as_secs_f64(),
            rate(elapsed - first)
        );
        elapsed
    })
    .await
    .unwrap()
}

/// One Wharf run: start the host, publish through the provider, deploy the no-op guest and
/// time until every message was processed.
async fn wharf_once(run: u64, sizes: Option<(u32, u32)>, guest: &Path, cache: &Path) -> Duration {
    let s = settings(run);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    let sizes = sizes.map_or(String::new(), |(c, b)| {
        format!("concurrency = {c}\nbatch = {b}\n")
    });
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\ncache_dir = \"{}\"\n\
         [storage]\nurl = \"sqlite://bench.db\"\n\
         [providers.main]\ntype = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\n\
         processing_group = \"{}\"\nreadiness_group = \"{}\"\npartitions = {PARTITIONS}\n\
         properties = {{ \"session.timeout.ms\" = 6000, \"heartbeat.interval.ms\" = 1000 }}\n\
         [queues.bench]\nhandler = \"noop\"\nstorage = \"external\"\nprovider = \"main\"\n{sizes}",
        cache.display(),
        s.brokers,
        s.topic_prefix,
        s.processing_group,
        s.readiness_group,
    );
    let config_path = dir.path().join("wharf.toml");
    std::fs::write(&config_path, text).unwrap();
    let host = wharf_host::start(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    let storage = KafkaProvider::open("bench", s.clone()).unwrap();
    let publishing = Instant::now();
    for chunk in 0..MESSAGES / CHUNK {
        let envelopes: Vec<Envelope> = (0..CHUNK).map(|i| envelope(chunk * CHUNK + i)).collect();
        storage
            .publish("bench", &envelopes, PublishOptions::default())
            .await
            .unwrap();
    }
    let published = rate(publishing.elapsed());

    common::PROCESSED.store(0, Ordering::Relaxed);
    let mut deployed = host.registry.subscribe();
    std::fs::copy(guest, dir.path().join("handlers/noop.wasm")).unwrap();
    while host.registry.get("noop").is_none() {
        deployed.changed().await.unwrap();
    }
    let started = Instant::now();
    let mut last = (0, Instant::now());
    let mut first = None;
    let elapsed = loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let processed = common::PROCESSED.load(Ordering::Relaxed);
        if processed > 0 {
            first.get_or_insert_with(|| started.elapsed());
        }
        if processed >= MESSAGES {
            break started.elapsed();
        }
        if processed != last.0 {
            last = (processed, Instant::now());
        }
        assert!(
            last.1.elapsed() < Duration::from_secs(60),
            "no progress for 60 s at {processed} processed messages"
        );
    };
    let committed = committed_total(&s).await;
    let first = first.unwrap_or_default();
    println!(
        "    (published through the provider at {published:.0} msg/s; first message processed {:.2} s after the deploy, while the group join completes; {:.0} msg/s after it; {committed})",
        first.as_secs_f64(),
        rate(elapsed - first)
    );
    host.shutdown().await;
    storage.close().await;
    elapsed
}

/// Wait (untimed) until the processing group's committed offsets add up to every message.
async fn committed_total(s: &KafkaSettings) -> String {
    let topic = s.topic("bench");
    let config = s.consumer(&s.processing_group);
    tokio::task::spawn_blocking(move || {
        let reader: BaseConsumer = config.create().unwrap();
        let asked = Instant::now();
        loop {
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition(&topic, p);
            }
            let total: i64 = reader
                .committed_offsets(tpl, Duration::from_secs(10))
                .map(|c| {
                    c.elements()
                        .iter()
                        .map(|e| match e.offset() {
                            Offset::Offset(n) => n,
                            _ => 0,
                        })
                        .sum()
                })
                .unwrap_or(0);
            if total == MESSAGES as i64 {
                return format!(
                    "committed offsets complete {} ms after the clock stopped",
                    asked.elapsed().as_millis()
                );
            }
            assert!(
                asked.elapsed() < Duration::from_secs(30),
                "committed offsets add up to {total} of {MESSAGES} 30 s after processing"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
}

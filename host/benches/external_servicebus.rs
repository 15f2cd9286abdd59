//! End-to-end throughput through Service Bus external pending storage against the contract
//! server (`wharf-servicebus-contract`: nothing here reaches Azure), and the HTTP requests
//! each message costs. Each round, for the tuned queue (concurrency 64, batch 64) and the
//! queue defaults: a host with a `servicebus` provider and queue `bench` (no handler yet);
//! 20k envelopes published through the provider in chunks of 500 ("Send Message Batch"),
//! then the `noop` guest deployed, timed from when the handler registry serves it until the
//! host has processed all of them (the pipeline's "message processed" event) and the
//! processing subscription is empty.
//!
//! Requests per message are counted by the server over the whole run (sends, peek-locks,
//! completes, the readiness bridge's guards and removals, idle long polls): total, and the
//! part that is sending. Prints each run and the medians over the rounds
//! (`WHARF_BENCH_ROUNDS`, default 2).

mod common;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wharf_host::Config;
use wharf_host::external::servicebus::{ServiceBusProvider, ServiceBusSettings};
use wharf_host::external::{Envelope, Provider, PublishOptions};
use wharf_servicebus_contract::ContractServer;

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

const MESSAGES: u64 = 20_000;
const CHUNK: u64 = 500;
const KEY_NAME: &str = "RootManageSharedAccessKey";
const KEY: &str = "YmVuY2gta2V5";
const TOPIC: &str = "nexus.bench";

/// The Wharf queue's sizes (`None`: the queue defaults).
const SETUPS: [(&str, Option<(u32, u32)>); 2] = [
    ("concurrency 64, batch 64", Some((64, 64))),
    ("queue defaults", None),
];

fn main() {
    if common::filtered_out("end-to-end servicebus external") {
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

fn envelope(n: u64) -> Envelope {
    Envelope::new(
        format!(r#"{{"order_id":"{n}","customer":"Ada","total_cents":1999}}"#),
        Some(format!("order-{n}")),
        0,
    )
}

fn rate(elapsed: Duration) -> f64 {
    MESSAGES as f64 / elapsed.as_secs_f64()
}

/// One run's figures.
struct Run {
    rate: f64,
    requests: f64,
    sends: f64,
}

async fn measure(rounds: usize) {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    let cache = tempfile::tempdir().unwrap();
    let mut runs: Vec<Vec<Run>> = SETUPS.iter().map(|_| Vec::new()).collect();
    println!(
        "servicebus end to end (contract server), no-op guest, {MESSAGES} messages, {rounds} round(s)"
    );
    for round in 1..=rounds {
        for (i, (label, sizes)) in SETUPS.iter().enumerate() {
            let run = wharf_once(*sizes, &guest, cache.path()).await;
            println!(
                "round {round}: {:<34} {:>8.0} msg/s  {:.2} HTTP requests/message ({:.3} of them sending)",
                format!("wharf, {label}"),
                run.rate,
                run.requests,
                run.sends
            );
            runs[i].push(run);
        }
    }
    println!("\nmedian of {rounds} round(s):");
    for (i, (label, _)) in SETUPS.iter().enumerate() {
        let rate = common::median(runs[i].iter().map(|r| r.rate).collect());
        let requests = common::median(runs[i].iter().map(|r| r.requests).collect());
        println!(
            "  {:<34} {rate:>8.0} msg/s  {requests:.2} HTTP requests/message",
            format!("wharf, {label}")
        );
    }
}

/// One run on a server of its own: publish, deploy, time until all are processed.
async fn wharf_once(sizes: Option<(u32, u32)>, guest: &Path, cache: &Path) -> Run {
    let server = ContractServer::start(KEY_NAME, KEY).await;
    server.create_topic(TOPIC, &["processing", "readiness"]);
    let connection = format!(
        "Endpoint=sb://bench.servicebus.windows.net/;SharedAccessKeyName={KEY_NAME};SharedAccessKey={KEY}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    let sizes = sizes.map_or(String::new(), |(c, b)| {
        format!("concurrency = {c}\nbatch = {b}\n")
    });
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\ncache_dir = \"{}\"\n\
         [storage]\nurl = \"sqlite://bench.db\"\n\
         [providers.main]\ntype = \"servicebus\"\nconnection_string = \"{connection}\"\n\
         endpoint_override = \"{}\"\n\
         [queues.bench]\nhandler = \"noop\"\nstorage = \"external\"\nprovider = \"main\"\n{sizes}",
        cache.display(),
        server.endpoint(),
    );
    let config_path = dir.path().join("wharf.toml");
    std::fs::write(&config_path, text).unwrap();
    let host = wharf_host::start(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    let mut settings: ServiceBusSettings = toml::from_str(&format!(
        "connection_string = \"{connection}\"\nendpoint_override = \"{}\"",
        server.endpoint()
    ))
    .unwrap();
    settings.lock_renewal = true;
    let storage = ServiceBusProvider::open(settings).unwrap();
    let before = server.requests();
    let publishing = Instant::now();
    for chunk in 0..MESSAGES / CHUNK {
        let envelopes: Vec<Envelope> = (0..CHUNK).map(|i| envelope(chunk * CHUNK + i)).collect();
        storage
            .publish("bench", &envelopes, PublishOptions::default())
            .await
            .unwrap();
    }
    let published = rate(publishing.elapsed());
    let sends = server.sends();
    common::PROCESSED.store(0, Ordering::Relaxed);
    let mut deployed = host.registry.subscribe();
    std::fs::copy(guest, dir.path().join("handlers/noop.wasm")).unwrap();
    while host.registry.get("noop").is_none() {
        deployed.changed().await.unwrap();
    }
    let started = Instant::now();
    let mut last = (0, Instant::now());
    let elapsed = loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let processed = common::PROCESSED.load(Ordering::Relaxed);
        if processed >= MESSAGES && server.counts(TOPIC, "processing").0 == 0 {
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
    // The readiness subscription is drained too (untimed).
    let drained = Instant::now();
    while server.counts(TOPIC, "readiness").0 > 0 {
        assert!(
            drained.elapsed() < Duration::from_secs(60),
            "readiness not drained"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let requests = server.requests() - before;
    println!("    (published through the provider at {published:.0} msg/s in {sends} requests)");
    host.shutdown().await;
    Run {
        rate: rate(elapsed),
        requests: requests as f64 / MESSAGES as f64,
        sends: sends as f64 / MESSAGES as f64,
    }
}

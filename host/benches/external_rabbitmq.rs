//! End-to-end throughput through RabbitMQ external pending storage against a plain lapin
//! consume + ack loop on the same broker, in the same run (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). Each round, for both the tuned queue (concurrency
//! and prefetch 256, batch 256, as the Redis bench) and the queue defaults (concurrency and
//! prefetch 64):
//!
//! - **raw**: 25k persistent envelopes published to a durable classic queue with publisher
//!   confirms (a window of 1000 outstanding), then timed from `basic.qos` until a plain
//!   `basic.consume` loop has acknowledged every one (`basic.ack` per message, prefetch equal
//!   to the Wharf queue's concurrency). Twice: the plain loop awaits each ack (lapin resolves
//!   it once the frame is written) before taking the next delivery — the baseline the target
//!   is set against; the pipelined loop keeps taking deliveries while acks are written, for
//!   what the broker and lapin can do without the per-ack wait;
//! - **wharf**: a host with a `rabbitmq` provider (prefixes unique to the run) and queue
//!   `bench` (`storage = "external"`, no handler yet); 25k envelopes published through the
//!   provider in chunks of 1000, then the `noop` guest deployed, timed from when the handler
//!   registry serves it until the host has processed all of them.
//!
//! Drain detection: a passive declare counts only ready messages, and `rabbitmqctl
//! list_queues messages` (ready + unacknowledged) takes ~0.8 s and ~0.4 s of CPU per call
//! here, too coarse and too costly to poll while the broker shares two cores with the host.
//! The clock stops instead when the host has processed the last message: the bench
//! installs a tracing layer counting the pipeline's per-message "message processed" event
//! (`wharf_host::dispatch::deliver`, debug; every other callsite stays disabled), which the
//! host emits right before it settles the delivery (the acknowledgement follows within a
//! batch, a millisecond or so). The broker's view checks it, untimed: the moment a passive
//! declare (polled every 10 ms) first shows 0 ready is printed — the tail after it is at most
//! a prefetch's worth of messages — and afterwards `rabbitmqctl` must report 0 messages
//! (ready + unacknowledged) in the processing queue within 30 s (skipped, with a note, when
//! `rabbitmqctl` is not installed). Exchanges and queues are deleted after every run.
//!
//! Prints each run (with its publishing rate) and, per configuration, the median rate over
//! the rounds (`WHARF_BENCH_ROUNDS`, default 2) and Wharf's share of the raw loops' rates.

mod common;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use wharf_host::Config;
use wharf_host::external::rabbitmq::{RabbitProvider, RabbitSettings};
use wharf_host::external::{Envelope, Provider, PublishOptions};

// The allocator the `wharf` binary runs on, so the figures are what it does.
wharf_host::use_jemalloc!();

/// Messages per run. Sized so the bench (2 rounds × 2 setups × 3 runs, each publishing its
/// own backlog first, untimed) takes about 1:15 min here instead of 4:20 at 100k: every run
/// still consumes for about 1.3–4 s (the pipelined raw loop at 15–20k msg/s, the others at
/// 6–11k). A multiple of `WINDOW`.
const MESSAGES: u64 = 25_000;
/// Publisher confirms outstanding at once (the provider publishes in chunks of this size).
const WINDOW: usize = 1000;

/// One queue configuration: the Wharf queue's concurrency and batch (prefetch = concurrency).
#[derive(Clone, Copy)]
struct Setup {
    label: &'static str,
    concurrency: u32,
    batch: u32,
    /// Whether the queue section leaves both at their defaults.
    defaults: bool,
}

const SETUPS: [Setup; 2] = [
    Setup {
        label: "concurrency 256, batch 256",
        concurrency: 256,
        batch: 256,
        defaults: false,
    },
    Setup {
        label: "queue defaults (concurrency 64)",
        concurrency: wharf_host::config::AUTO_CONCURRENCY,
        // Unused (the section sets neither); a RabbitMQ queue receives at most its free
        // concurrency whatever its batch.
        batch: 64,
        defaults: true,
    },
];

fn main() {
    if common::filtered_out("end-to-end rabbitmq external raw lapin") {
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

fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Connect as host/src/external/rabbitmq does: lapin on the tokio runtime.
async fn connect(name: &str) -> Connection {
    let properties = ConnectionProperties::default()
        .with_connection_name(name.into())
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    Connection::connect(&amqp_url(), properties)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", amqp_url()))
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

async fn measure(rounds: usize) {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/target/wasm32-wasip2/release/noop.wasm");
    assert!(guest.exists(), "build the guests first: cargo xtask guests");
    // One compiled-component cache for every run: the guest compiles once.
    let cache = tempfile::tempdir().unwrap();
    // Per setup: the plain raw loop, the pipelined raw loop, Wharf.
    let mut rates: Vec<[Vec<f64>; 3]> = vec![Default::default(); SETUPS.len()];
    let mut run = 0;
    println!("rabbitmq end to end, no-op guest, {MESSAGES} messages, {rounds} round(s)");
    for round in 1..=rounds {
        for (i, setup) in SETUPS.iter().enumerate() {
            let prefetch = setup.concurrency as u16;
            for (j, pipelined) in [false, true].into_iter().enumerate() {
                run += 1;
                let elapsed = raw_once(run, prefetch, pipelined).await;
                println!(
                    "round {round}: {:<52} {:>8.0} msg/s ({:.2} s)",
                    raw_label(prefetch, pipelined),
                    rate(elapsed),
                    elapsed.as_secs_f64()
                );
                rates[i][j].push(rate(elapsed));
            }
            run += 1;
            let elapsed = wharf_once(run, setup, &guest, cache.path()).await;
            println!(
                "round {round}: {:<52} {:>8.0} msg/s ({:.2} s)",
                format!("wharf, {}", setup.label),
                rate(elapsed),
                elapsed.as_secs_f64()
            );
            rates[i][2].push(rate(elapsed));
        }
    }
    println!("\nmedian of {rounds} round(s), msg/s:");
    for (i, setup) in SETUPS.iter().enumerate() {
        let prefetch = setup.concurrency as u16;
        let [plain, pipelined, wharf] = rates[i].clone().map(common::median);
        println!("  {:<52} {plain:>8.0}", raw_label(prefetch, false));
        println!("  {:<52} {pipelined:>8.0}", raw_label(prefetch, true));
        println!(
            "  {:<52} {wharf:>8.0}   = {:.1} % of the plain raw loop ({:.1} % of the pipelined one)",
            format!("wharf, {}", setup.label),
            100.0 * wharf / plain,
            100.0 * wharf / pipelined
        );
    }
}

fn raw_label(prefetch: u16, pipelined: bool) -> String {
    let acks = if pipelined {
        "acks pipelined"
    } else {
        "each ack awaited"
    };
    format!("raw lapin consume+ack, prefetch {prefetch}, {acks}")
}

/// Publish every envelope to `queue` through the default exchange, persistent, with a window
/// of outstanding publisher confirms.
async fn publish_raw(channel: &Channel, queue: &str) {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut window = VecDeque::with_capacity(WINDOW);
    for n in 0..MESSAGES {
        if window.len() == WINDOW {
            let confirm: lapin::publisher_confirm::PublisherConfirm = window.pop_front().unwrap();
            assert!(
                confirm.await.unwrap().is_ack(),
                "the broker refused a message"
            );
        }
        // The provider's properties: persistent, JSON, a timestamp.
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(ShortString::from("application/json"))
            .with_timestamp(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
            );
        let confirm = channel
            .basic_publish(
                "",
                queue,
                BasicPublishOptions::default(),
                envelope(n).to_json().as_bytes(),
                properties,
            )
            .await
            .unwrap();
        window.push_back(confirm);
    }
    for confirm in window {
        assert!(
            confirm.await.unwrap().is_ack(),
            "the broker refused a message"
        );
    }
}

/// The raw loop: pre-publish, then consume and acknowledge every message, each ack awaited
/// before the next delivery is taken, or (`pipelined`) not waiting for an ack's write.
async fn raw_once(run: u64, prefetch: u16, pipelined: bool) -> Duration {
    let queue = format!("wharf-bench-raw.{}.{run}", std::process::id());
    let publisher = connect("wharf-bench raw publisher").await;
    let channel = publisher.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(&queue, durable, FieldTable::default())
        .await
        .unwrap();
    let publishing = Instant::now();
    publish_raw(&channel, &queue).await;
    println!(
        "    (published to the queue at {:.0} msg/s)",
        rate(publishing.elapsed())
    );

    let consuming = connect("wharf-bench raw consumer").await;
    let consumer_channel = consuming.create_channel().await.unwrap();
    let started = Instant::now();
    consumer_channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consumer_channel
        .basic_consume(
            &queue,
            "wharf-bench-raw",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut acked = 0;
    if pipelined {
        let mut acks = FuturesUnordered::new();
        while acked < MESSAGES {
            tokio::select! {
                Some(acked_one) = acks.next(), if !acks.is_empty() => {
                    let _: bool = acked_one;
                    acked += 1;
                }
                delivery = consumer.next() => {
                    let delivery = delivery
                        .expect("the broker ended the consumer")
                        .expect("a delivery");
                    acks.push(async move {
                        delivery.acker.ack(BasicAckOptions::default()).await.unwrap()
                    });
                }
            }
        }
    } else {
        while acked < MESSAGES {
            let delivery = consumer
                .next()
                .await
                .expect("the broker ended the consumer")
                .expect("a delivery");
            delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
            acked += 1;
        }
    }
    let elapsed = started.elapsed();
    let _ = consumer_channel.close(200, "done").await;
    let _ = consuming.close(200, "done").await;
    let left = channel
        .queue_delete(&queue, QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(left, 0, "raw queue {queue} not drained");
    let _ = publisher.close(200, "done").await;
    elapsed
}

/// One Wharf run: start the host, pre-publish through the provider, deploy the no-op guest
/// and time until every message was processed.
async fn wharf_once(run: u64, setup: &Setup, guest: &Path, cache: &Path) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("handlers")).unwrap();
    let prefix = format!("wharf-bench.{}.{run}.", std::process::id());
    let sizes = if setup.defaults {
        String::new()
    } else {
        format!(
            "concurrency = {}\nbatch = {}\n",
            setup.concurrency, setup.batch
        )
    };
    let text = format!(
        "[host]\nadmin_listen = \"127.0.0.1:0\"\ncache_dir = \"{}\"\n\
         [storage]\nurl = \"sqlite://bench.db\"\n\
         [providers.main]\ntype = \"rabbitmq\"\nurl = \"{}\"\n\
         exchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\n\
         [queues.bench]\nhandler = \"noop\"\nstorage = \"external\"\nprovider = \"main\"\n{sizes}",
        cache.display(),
        amqp_url()
    );
    let config_path = dir.path().join("wharf.toml");
    std::fs::write(&config_path, text).unwrap();
    let config = Config::load(&config_path).unwrap();
    assert_eq!(
        config.queues["bench"].concurrency, setup.concurrency,
        "queue concurrency"
    );
    let host = wharf_host::start(config).await.unwrap();
    let settings = RabbitSettings {
        exchange_prefix: prefix.clone(),
        queue_prefix: prefix.clone(),
        ..RabbitSettings::new(amqp_url())
    };
    let names = settings.names("bench");
    let storage = RabbitProvider::open("bench", settings).await.unwrap();
    let publishing = Instant::now();
    for chunk in 0..(MESSAGES / WINDOW as u64) {
        let envelopes: Vec<Envelope> = (0..WINDOW as u64)
            .map(|i| envelope(chunk * WINDOW as u64 + i))
            .collect();
        storage
            .publish("bench", &envelopes, PublishOptions::default())
            .await
            .unwrap();
    }

    let published = rate(publishing.elapsed());

    // The broker's view, untimed: when the processing queue first has nothing ready.
    let watcher = connect("wharf-bench watcher").await;
    let watch = watcher.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let ready = |watch: Channel, name: String| async move {
        watch
            .queue_declare(&name, passive, FieldTable::default())
            .await
            .unwrap()
            .message_count()
    };
    let backlog = ready(watch.clone(), names.readiness.clone()).await;

    common::PROCESSED.store(0, Ordering::Relaxed);
    let mut deployed = host.registry.subscribe();
    let copied = Instant::now();
    std::fs::copy(guest, dir.path().join("handlers/noop.wasm")).unwrap();
    while host.registry.get("noop").is_none() {
        deployed.changed().await.unwrap();
    }
    let started = Instant::now();
    let deploy = started - copied;
    let mut ready_zero: Option<Duration> = None;
    let mut last = (0, Instant::now());
    let mut next_declare = Instant::now();
    let elapsed = loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let processed = common::PROCESSED.load(Ordering::Relaxed);
        if processed >= MESSAGES {
            break started.elapsed();
        }
        if ready_zero.is_none() && Instant::now() >= next_declare {
            next_declare = Instant::now() + Duration::from_millis(10);
            if ready(watch.clone(), names.processing.clone()).await == 0 {
                ready_zero = Some(started.elapsed());
            }
        }
        if processed != last.0 {
            last = (processed, Instant::now());
        }
        assert!(
            last.1.elapsed() < Duration::from_secs(60),
            "no progress for 60 s at {processed} processed messages (is the \"message processed\" \
             debug event of wharf_host::dispatch::deliver still there?)"
        );
    };
    let processed = common::PROCESSED.load(Ordering::Relaxed);
    let confirmed = confirm_drained(&names.processing).await;
    println!(
        "    (published through the provider at {published:.0} msg/s; deployed {} ms after \
         the copy; {backlog} readiness notifications queued at the \
         start; passive declare first saw 0 ready: {}; {processed} processed; {confirmed})",
        deploy.as_millis(),
        ready_zero.map_or(
            "not before the last was processed (polled every 10 ms)".to_string(),
            |d| format!("after {:.2} s", d.as_secs_f64())
        ),
    );
    host.shutdown().await;
    drop(storage);

    for queue in [&names.processing, &names.readiness] {
        watch
            .queue_delete(queue, QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    watch
        .exchange_delete(&names.exchange, ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = watcher.close(200, "done").await;
    elapsed
}

/// Wait until `rabbitmqctl` shows no message (ready or unacknowledged) in `queue`.
async fn confirm_drained(queue: &str) -> String {
    let asked = Instant::now();
    while asked.elapsed() < Duration::from_secs(30) {
        let output = tokio::process::Command::new("rabbitmqctl")
            .args(["-q", "list_queues", "name", "messages"])
            .output()
            .await;
        let Ok(output) = output else {
            return "drain not confirmed: rabbitmqctl is not available".to_string();
        };
        let text = String::from_utf8_lossy(&output.stdout);
        let messages = text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(queue)).then(|| words.next()?.parse::<u64>().ok())?
        });
        match messages {
            Some(0) => {
                return format!(
                    "rabbitmqctl: 0 messages, {} ms after the clock stopped",
                    asked.elapsed().as_millis()
                );
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            None => return format!("drain not confirmed: rabbitmqctl did not list {queue}"),
        }
    }
    panic!("{queue} still holds messages 30 s after the host processed {MESSAGES}");
}

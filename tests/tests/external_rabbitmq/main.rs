//! What is particular to the RabbitMQ provider, on the real broker (`AMQP_URL`) or on a
//! private node: the exact topology and a conflicting declaration, a message published
//! straight to the processing queue, a broker restart mid-load, `wharf run` killed mid-load,
//! and two providers (Redis and RabbitMQ) in one host. The behaviour every provider shares
//! is in the conformance suite (`external_conformance`).

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::Envelope;
use wharf_host::external::rabbitmq::{Names, RabbitSettings};
use wharf_tests::rabbit_node::RabbitNode;
use wharf_tests::{
    TestDir, amqp_connect, amqp_delete, amqp_publish, amqp_publish_with, amqp_url, messages, msg,
    rabbitmq_queue_counts, redis_url, run_detached, spawn_wharf, unique_prefix, wait_for,
};

mod faults;

const T: Duration = Duration::from_secs(60);

/// Exchange and queue names of a test's own on the shared broker, deleted afterwards.
struct Scope {
    prefix: String,
}

impl Scope {
    fn new() -> Self {
        Scope {
            prefix: unique_prefix("rabbit").replace(':', "."),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let n = names(&self.prefix, "export_order");
        run_detached(async move {
            amqp_delete(&amqp_url(), &[n.processing, n.readiness], &[n.exchange]).await
        });
    }
}

fn names(prefix: &str, queue: &str) -> Names {
    RabbitSettings {
        exchange_prefix: prefix.to_string(),
        queue_prefix: prefix.to_string(),
        ..RabbitSettings::new(amqp_url())
    }
    .names(queue)
}

fn config(url: &str, prefix: &str, queue_extra: &str) -> String {
    format!(
        r#"
[external]
reconcile_interval = "300ms"

[providers.rmq]
type = "rabbitmq"
url = "{url}"
exchange_prefix = "{prefix}"
queue_prefix = "{prefix}"

[queues.export_order]
handler = "flaky"
storage = "external"
provider = "rmq"
backoff = "10ms"
max_backoff = "20ms"
{queue_extra}

[queues.replies]
handler = "not-deployed"
"#
    )
}

/// How many times each `n` was echoed to `replies`.
async fn seen(host: &RunningHost) -> BTreeMap<i64, usize> {
    let mut out = BTreeMap::new();
    for m in messages(host, "replies").await {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        *out.entry(v["seen"]["n"].as_i64().unwrap()).or_default() += 1;
    }
    out
}

async fn readiness(host: &RunningHost, provider: &str) -> bool {
    let (_, checks) = host.health.report().await;
    checks[&format!("external_queue_readiness_{provider}")].healthy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topology_is_declared_exactly_and_a_conflict_stops_start_up() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let n = names(&prefix, "export_order");
    assert_eq!(n.exchange, format!("{prefix}export_order"));
    assert_eq!(n.processing, format!("{prefix}export_order"));
    assert_eq!(n.readiness, format!("{prefix}export_order.readiness"));
    let dir = TestDir::new();
    // No handler yet: the host declares the topology but processes nothing.
    let host = dir.start(&config(&amqp_url(), &prefix, "")).await;
    let conn = amqp_connect(&amqp_url()).await;
    let channel = conn.create_channel().await.unwrap();
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            &n.exchange,
            lapin::ExchangeKind::Fanout,
            passive,
            FieldTable::default(),
        )
        .await
        .expect("the fan-out exchange exists");
    // One publication to the exchange reaches both queues.
    amqp_publish(&amqp_url(), &n.exchange, "", b"{}").await;
    wait_for(T, "a copy in each queue", || async {
        let p = rabbitmq_queue_counts(None, &n.processing).await.0;
        let r = rabbitmq_queue_counts(None, &n.readiness).await.0;
        (p == 1 && r <= 1).then_some(())
    })
    .await;
    host.shutdown().await;

    // An existing queue declared with other arguments: start-up stops and says why.
    let clash = prefix.clone() + "clash.";
    let clashing = names(&clash, "export_order");
    let mut args = FieldTable::default();
    args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(3));
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(&clashing.processing, durable, args)
        .await
        .unwrap();
    let path = dir.write_config(&config(&amqp_url(), &clash, ""));
    let error = match wharf_host::start(wharf_host::Config::load(&path).unwrap()).await {
        Ok(_) => panic!("a conflicting declaration must stop start-up"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains(&clashing.processing)
            && error.contains("rmq")
            && error.contains("inequivalent arg"),
        "{error}"
    );
    for (queue, exchange) in [
        (&n.processing, &n.exchange),
        (&clashing.processing, &n.exchange),
    ] {
        let ch = conn.create_channel().await.unwrap();
        let _ = ch.queue_delete(queue, Default::default()).await;
        let _ = ch.exchange_delete(exchange, Default::default()).await;
    }
    let ch = conn.create_channel().await.unwrap();
    let _ = ch.queue_delete(&n.readiness, Default::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_straight_to_the_processing_queue_is_processed() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let n = names(&prefix, "export_order");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(&amqp_url(), &prefix, "")).await;
    let body = Envelope::new(json!({"reply_to": "replies", "n": 1}).to_string(), None, 0);
    // The default exchange routes by queue name: the readiness queue gets nothing.
    amqp_publish(&amqp_url(), "", &n.processing, body.to_json().as_bytes()).await;
    wait_for(T, "the reply", || async {
        (seen(&host).await.get(&1) == Some(&1)).then_some(())
    })
    .await;
    assert_eq!(rabbitmq_queue_counts(None, &n.readiness).await.0, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_sees_the_enqueue_time_and_headers_the_broker_carries() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let n = names(&prefix, "export_order");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(&amqp_url(), &prefix, "")).await;
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), AMQPValue::LongString("acme".into()));
    let sent_at = wharf_host::queue::now_ms() / 1000;
    let body = Envelope::new(
        json!({"reply_to": "replies", "n": 1}).to_string(),
        Some("m-1".into()),
        0,
    );
    let properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_timestamp(sent_at as u64)
        .with_message_id("m-1".into())
        .with_headers(headers);
    amqp_publish_with(
        &amqp_url(),
        &n.exchange,
        "",
        body.to_json().as_bytes(),
        properties,
    )
    .await;
    let reply = wait_for(T, "the reply", || async {
        messages(&host, "replies").await.into_iter().next()
    })
    .await;
    let reply: serde_json::Value = serde_json::from_str(&reply.payload).unwrap();
    assert_eq!(reply["enqueued_at_ms"], sent_at * 1000, "{reply}");
    let headers = reply["headers"].as_array().unwrap();
    assert!(headers.contains(&json!(["tenant", "acme"])), "{reply}");
    assert!(headers.contains(&json!(["message-id", "m-1"])), "{reply}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_what_the_broker_pushed_ahead_without_counting_it() {
    let scope = Scope::new();
    let prefix = scope.prefix.clone();
    let n = names(&prefix, "export_order");
    let dir = TestDir::new();
    dir.deploy("spin", "spin");
    // One message runs at a time, the broker pushes up to five ahead.
    let queues = |handler: &str| {
        config(
            &amqp_url(),
            &prefix,
            "concurrency = 1\ntimeout = \"60s\"\nlease = \"120s\"",
        )
        .replace("handler = \"flaky\"", &format!("handler = \"{handler}\""))
        .replace("queue_prefix = ", "prefetch = 5\nqueue_prefix = ")
    };
    let path = dir.write_config(&queues("spin"));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"300ms\"");
    std::fs::write(&path, text).unwrap();
    let host = wharf_host::start(wharf_host::Config::load(&path).unwrap())
        .await
        .unwrap();
    for k in 0..3 {
        host.router
            .enqueue("export_order", msg(json!({"reply_to": "replies", "n": k})))
            .await
            .unwrap();
    }
    wait_for(T, "all three delivered to the host", || async {
        (rabbitmq_queue_counts(None, &n.processing).await == (3, 3)).then_some(())
    })
    .await;
    host.shutdown().await; // one runs forever, two were pushed ahead and never started
    wait_for(T, "all three back in the queue", || async {
        (rabbitmq_queue_counts(None, &n.processing).await == (3, 0)).then_some(())
    })
    .await;
    dir.deploy("flaky", "flaky");
    let host = dir.start(&queues("flaky")).await;
    let attempts = wait_for(T, "three replies", || async {
        let replies = messages(&host, "replies").await;
        (replies.len() == 3).then(|| {
            replies
                .iter()
                .map(|m| {
                    serde_json::from_str::<serde_json::Value>(&m.payload).unwrap()["attempt"]
                        .clone()
                })
                .collect::<Vec<_>>()
        })
    })
    .await;
    assert_eq!(
        attempts,
        vec![json!(1); 3],
        "none of them counted an attempt"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_rabbitmq_serve_two_queues_in_one_host() {
    let scope = Scope::new();
    let rabbit = scope.prefix.clone();
    let redis = unique_prefix("two");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let text = format!(
        "{}\n[providers.cache]\ntype = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{redis}\"\n\n\
         [queues.import_order]\nhandler = \"flaky\"\nstorage = \"external\"\nprovider = \"cache\"\n",
        config(&amqp_url(), &rabbit, ""),
        redis_url()
    );
    let host = dir.start(&text).await;
    for n in 0..10 {
        host.router
            .enqueue("export_order", msg(json!({"reply_to": "replies", "n": n})))
            .await
            .unwrap();
        host.router
            .enqueue(
                "import_order",
                msg(json!({"reply_to": "replies", "n": 100 + n})),
            )
            .await
            .unwrap();
    }
    wait_for(T, "twenty replies", || async {
        (seen(&host).await.len() == 20).then_some(())
    })
    .await;
    let seen = seen(&host).await;
    assert!(seen.values().all(|c| *c == 1), "{seen:?}");
    wait_for(T, "both readiness checks", || async {
        (readiness(&host, "rmq").await && readiness(&host, "cache").await).then_some(())
    })
    .await;
    host.shutdown().await;
}

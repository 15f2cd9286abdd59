//! `/metrics` after a known run: the counters equal what happened (processed, retried,
//! failed, deploys by result, inbox checks/records/duplicates), histograms counted every
//! call, and the sampled gauges show the queue's depth by status and the health checks.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use wharf_host::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, msg, scrape, wait_for, wait_status};

const T: Duration = Duration::from_secs(30);

fn get(metrics: &BTreeMap<String, f64>, series: &str) -> f64 {
    *metrics
        .get(series)
        .unwrap_or_else(|| panic!("no series {series} in {metrics:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_equal_what_happened() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    dir.deploy_bytes("broken", b"not a component");
    let path = dir.write_config(
        r#"
[queues.work]
handler = "flaky"
max_attempts = 3
backoff = "10ms"
max_backoff = "20ms"
inbox = { store = "sql" }

[queues.idle]
handler = "flaky"
"#,
    );
    // Gauges sampled every 100 ms instead of the tests' 500 ms (15 s by default).
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "metrics_interval = \"500ms\"",
        "metrics_interval = \"100ms\"",
        1,
    );
    std::fs::write(&path, text).unwrap();
    let host = wharf_host::start(Config::load(&path).unwrap())
        .await
        .unwrap();

    // 5 succeed at once, 2 succeed on their second attempt, 3 fail permanently.
    let mut keys = Vec::new();
    for n in 0..5 {
        let m = msg(json!({ "n": n }));
        keys.push(host.router.enqueue("work", m).await.unwrap().key);
    }
    for n in 0..2 {
        let m = msg(json!({ "n": n, "transient_until": 2 }));
        keys.push(host.router.enqueue("work", m).await.unwrap().key);
    }
    for n in 0..3 {
        let m = msg(json!({ "n": n, "permanent": "bad order" }));
        keys.push(host.router.enqueue("work", m).await.unwrap().key);
    }
    for (i, key) in keys.iter().enumerate() {
        let status = if i < 7 {
            Status::Processed
        } else {
            Status::Failed
        };
        wait_status(&host, *key, status, T).await;
    }
    // A redelivery of a processed message (same delivery id, as after a lost completion) is
    // skipped by the inbox.
    let again = keys[0];
    assert!(host.store.move_to(again, &Status::Pending).await.unwrap());
    wait_for(T, "the redelivery skipped", || async {
        let m = host.store.get(again).await.unwrap()?;
        (m.status == Status::Processed && m.outcome.as_deref() == Some("skipped: duplicate"))
            .then_some(())
    })
    .await;

    let m = wait_for(T, "the gauges sampled after the run", || async {
        let m = scrape(&host).await;
        let processed = m
            .get(r#"wharf_queue_messages{queue="work",status="processed"}"#)
            .copied();
        let failed = m
            .get(r#"wharf_queue_messages{queue="work",status="failed"}"#)
            .copied();
        // One sampling pass after every settlement (a pass may fall between them).
        (processed == Some(7.0) && failed == Some(3.0)).then_some(m)
    })
    .await;
    let messages = |outcome: &str| {
        get(
            &m,
            &format!(r#"wharf_messages_total{{queue="work",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(
        messages("processed"),
        7.0,
        "5 at once, 2 on their second attempt"
    );
    assert_eq!(messages("retried"), 2.0);
    assert_eq!(messages("failed"), 3.0);
    assert_eq!(messages("duplicate"), 1.0);
    assert_eq!(
        get(&m, r#"wharf_handler_call_seconds_count{queue="work"}"#),
        12.0,
        "10 first attempts, 2 second attempts; the duplicate ran no handler"
    );
    assert_eq!(
        get(&m, r#"wharf_instantiate_seconds_count{handler="flaky"}"#),
        12.0
    );
    assert_eq!(
        get(&m, r#"wharf_settle_latency_seconds_count{queue="work"}"#),
        10.0,
        "every final settlement that ran the handler: 7 processed, 3 failed"
    );
    assert_eq!(
        get(&m, r#"wharf_queue_messages{queue="work",status="failed"}"#),
        3.0
    );
    assert_eq!(
        get(&m, r#"wharf_queue_messages{queue="idle",status="pending"}"#),
        0.0
    );
    assert_eq!(
        get(&m, r#"wharf_inbox_checks_total{endpoint="work"}"#),
        13.0,
        "every delivery of the inbox queue: retries and the redelivery included"
    );
    assert_eq!(
        get(&m, r#"wharf_inbox_records_total{endpoint="work"}"#),
        7.0,
        "one entry per successful handler call"
    );
    assert_eq!(
        get(
            &m,
            r#"wharf_deploys_total{handler="flaky",result="deployed"}"#
        ),
        1.0
    );
    assert_eq!(
        get(
            &m,
            r#"wharf_deploys_total{handler="broken",result="rejected"}"#
        ),
        1.0
    );
    assert_eq!(get(&m, r#"wharf_health_ready{check="sql_storage"}"#), 1.0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_by_a_crashed_host_is_counted_when_it_expires() {
    let dir = TestDir::new();
    let host = dir
        .start(
            r#"
[queues.orphans]
handler = "noop"
"#,
        )
        .await;
    // Another host leased the message and crashed: its lease runs out after 1 ms.
    let key = host
        .store
        .enqueue("orphans", msg(json!({"n": 1})), false)
        .await
        .unwrap()
        .key;
    let leased = host.store.lease("orphans", 1, 1).await.unwrap();
    assert_eq!(leased.len(), 1);
    dir.deploy("noop", "noop");
    wait_status(&host, key, Status::Processed, T).await;
    let metrics = scrape(&host).await;
    assert_eq!(
        get(&metrics, r#"wharf_lease_expiries_total{queue="orphans"}"#),
        1.0
    );
    host.shutdown().await;
}

/// The autoscaling signal: how long the oldest ready message has waited, as a gauge and in
/// `GET /api/v1/queues`; scheduled messages are not ready, and an emptied queue reads 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_ready_message_age_is_sampled() {
    let dir = TestDir::new();
    // `waiting` has a handler that is never deployed: its messages stay ready.
    let host = dir
        .start("[queues.waiting]\nhandler = \"not-deployed\"\n")
        .await;
    let store = host.store.clone();
    let mut later = msg(json!({ "n": 0 }));
    later.process_at_ms = Some(wharf_host::clock::now_ms() + 3_600_000);
    store.enqueue("waiting", later, false).await.unwrap();
    let series = "wharf_queue_oldest_ready_seconds{queue=\"waiting\"}";
    wait_for(T, "the gauge sampled with nothing ready", || async {
        scrape(&host)
            .await
            .get(series)
            .copied()
            .filter(|v| *v == 0.0)
    })
    .await;
    let enqueued_at = std::time::Instant::now();
    store
        .enqueue("waiting", msg(json!({ "n": 1 })), false)
        .await
        .unwrap();
    let age = wait_for(T, "the gauge at 1.5 s or more", || async {
        scrape(&host)
            .await
            .get(series)
            .copied()
            .filter(|v| *v >= 1.5)
    })
    .await;
    assert!(
        age <= enqueued_at.elapsed().as_secs_f64() + 0.1,
        "{age} s is longer than the message has existed"
    );
    let waiting = wharf_tests::queue_info(&host, "waiting").await;
    let api_age = waiting["oldest_ready_age_ms"].as_i64().unwrap();
    assert!(api_age >= 1000, "{waiting}");
    assert!(waiting["lag"].is_null(), "{waiting}");
    host.shutdown().await;
}

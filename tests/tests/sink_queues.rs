//! Queues without a handler: they hold what is enqueued into them (a handler's follow-ups,
//! the CLI), on the SQL store and on a broker, and nothing consumes them — no pipeline, no
//! broker consumer, no readiness bridge, no "not deployed" warning.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::redis::Keys;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, capture_logs, messages, msg, redis_url, unique_prefix, wait_for};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_without_a_handler_hold_what_is_enqueued() {
    let logs = capture_logs();
    let prefix = unique_prefix("sink");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start(&format!(
            r#"
[external]
reconcile_interval = "100ms"

[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"

[queues.work]
handler = "flaky"

[queues.collected]

[queues.outbox]
storage = "external"
provider = "main"
"#,
            url = redis_url()
        ))
        .await;
    for (n, to) in [(1, "collected"), (2, "outbox")] {
        host.router
            .enqueue("work", msg(json!({"reply_to": to, "n": n})))
            .await
            .unwrap();
    }
    let keys = Keys::new(&prefix, "outbox");
    let mut redis = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    wait_for(T, "both follow-ups to be stored", || {
        let (host, mut redis, ready) = (&host, redis.clone(), keys.ready.clone());
        async move {
            let held: u64 = redis.zcard(&ready).await.unwrap();
            (messages(host, "collected").await.len() == 1 && held == 1).then_some(())
        }
    })
    .await;
    // A third message through the same host: by the time it is processed, a consumer of
    // either queue would have had its turn (the readiness record was written long before).
    let marker = host
        .router
        .enqueue("work", msg(json!({"n": 3})))
        .await
        .unwrap();
    wharf_tests::wait_status(&host, marker.key, Status::Processed, T).await;
    let collected = messages(&host, "collected").await;
    assert_eq!(collected.len(), 1);
    assert_eq!(collected[0].status, Status::Pending, "held, not run");
    let held: u64 = redis.zcard(&keys.ready).await.unwrap();
    let leased: u64 = redis.zcard(&keys.leases).await.unwrap();
    assert_eq!((held, leased), (1, 0), "still ready in Redis, never leased");
    assert!(
        messages(&host, "outbox").await.is_empty(),
        "nothing moved into SQL"
    );
    let (_, checks) = host.health.report().await;
    let readiness = &checks["external_queue_readiness_main"];
    assert!(
        readiness.healthy && readiness.detail.contains("never consumed here"),
        "{readiness:?}"
    );
    let text = logs.text();
    assert!(!text.contains("not deployed"), "{text}");
    host.shutdown().await;
}

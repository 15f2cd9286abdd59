//! The consumer inbox end to end on real stores: SQLite, PostgreSQL and Redis. A redelivery
//! after success is skipped; a failed first attempt is not recorded and its redelivery runs.

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_host::{Config, RunningHost};
use wharf_tests::{
    PgSchema, TestDir, database_url, messages, msg, redis_url, unique_prefix, wait_for, wait_status,
};

const T: Duration = Duration::from_secs(30);

fn queues(store: &str) -> String {
    format!(
        r#"
[queues.work]
handler = "flaky"
max_attempts = 3
backoff = "10ms"
max_backoff = "20ms"
inbox = {{ store = "{store}", retention = "1h", cleanup_interval = "1m" }}

[queues.replies]
handler = "not-deployed"
"#
    )
}

async fn exercise(host: RunningHost) {
    // Success, then a redelivery of the same delivery (a lost completion): skipped.
    let ok = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 1})))
        .await
        .unwrap();
    wait_status(&host, ok.key, Status::Processed, T).await;
    assert!(host.store.move_to(ok.key, &Status::Pending).await.unwrap());
    wait_for(T, "the redelivery to be skipped", || async {
        host.store
            .get(ok.key)
            .await
            .unwrap()
            .filter(|m| m.outcome.as_deref() == Some("skipped: duplicate"))
    })
    .await;
    // A failed first attempt is not recorded: its redelivery runs the guest.
    let flaky = host
        .router
        .enqueue(
            "work",
            msg(json!({"transient_until": 2, "reply_to": "replies", "n": 2})),
        )
        .await
        .unwrap();
    let done = wait_status(&host, flaky.key, Status::Processed, T).await;
    assert_eq!(
        (done.attempts, done.outcome.as_deref()),
        (2, Some("completed"))
    );
    assert_eq!(
        messages(&host, "replies").await.len(),
        2,
        "n=1 once, n=2 once"
    );
    // A deliberate re-enqueue is a new delivery: it runs again.
    let again = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 1})))
        .await
        .unwrap();
    wait_status(&host, again.key, Status::Processed, T).await;
    assert_eq!(messages(&host, "replies").await.len(), 3);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_on_sqlite() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    exercise(dir.start(&queues("sql")).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_on_postgres() {
    let (dir, schema) = (TestDir::new(), PgSchema::new());
    dir.deploy("flaky", "flaky");
    exercise(dir.start_postgres(&schema, "50ms", &queues("sql")).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_on_redis() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let text = format!(
        "{}\n[inbox.redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\n",
        queues("redis"),
        redis_url(),
        unique_prefix("e2e")
    );
    let config = Config::load(&dir.write_config(&text)).unwrap();
    exercise(wharf_host::start(config).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_without_auto_create_stops_start_up() {
    let (dir, schema) = (TestDir::new(), PgSchema::new());
    let text = format!(
        "{}\n[inbox.sql]\nauto_create_table = false\ntable = \"billing_inbox\"\n",
        queues("sql")
    );
    let storage = format!("url = \"{}\"\nschema = \"{}\"", database_url(), schema.name);
    let config = Config::load(&dir.write_config_with_storage(&storage, &text)).unwrap();
    let err = format!(
        "{:#}",
        wharf_host::start(config)
            .await
            .err()
            .expect("start-up fails")
    );
    assert!(
        err.contains("`billing_inbox` does not exist") && err.contains("auto_create_table"),
        "{err}"
    );
}

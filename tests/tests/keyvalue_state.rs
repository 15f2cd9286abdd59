//! Handlers' key-value state through `wasi:keyvalue`: a component built against the
//! standard WIT with `wit-bindgen` alone (the `kv-state` fixture) runs unchanged; a change
//! exists if and only if the attempt that made it succeeded; increments and read-then-sets
//! from concurrent calls lose no update; buckets are granted per handler. On SQLite and
//! PostgreSQL.

use std::time::Duration;

use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{Db, PgSchema, TestDir, msg, wait_status};

const T: Duration = Duration::from_secs(60);

const QUEUES: &str = r#"
[queues.work]
handler = "kv"
concurrency = 16
max_attempts = 3
backoff = "10ms"
max_backoff = "20ms"

[queues.once]
handler = "kv"
max_attempts = 1

[queues.other]
handler = "ungranted"
max_attempts = 1

[handlers.kv]
keyvalue = ["counters", "customers"]
"#;

/// A host on `db` with the `kv-state` guest deployed as `kv` and `ungranted`.
async fn start(db: Db) -> (TestDir, Option<PgSchema>, RunningHost) {
    let dir = TestDir::new();
    dir.deploy("kv", "kv_state");
    dir.deploy("ungranted", "kv_state");
    let (schema, host) = dir.start_on(db, QUEUES).await;
    (dir, schema, host)
}

async fn enqueue(host: &RunningHost, queue: &str, payload: serde_json::Value) -> i64 {
    host.router.enqueue(queue, msg(payload)).await.unwrap().key
}

/// The committed value of `bucket`/`key` as text.
async fn value(host: &RunningHost, bucket: &str, key: &str) -> Option<String> {
    let read = host.store.state_read(bucket, key).await.unwrap();
    read.map(|(v, _)| String::from_utf8(v).unwrap())
}

async fn only_a_successful_attempt_changes_state(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let mut keys = Vec::new();
    for fail in ["transient", "permanent", "trap"] {
        let payload = json!({"incr": ["failed"], "set": {"left": fail}, "fail": fail});
        keys.push(enqueue(&host, "once", payload).await);
    }
    for key in keys {
        wait_status(&host, key, Status::Failed, T).await;
    }
    assert_eq!(value(&host, "counters", "failed").await, None);
    assert_eq!(value(&host, "counters", "left").await, None);
    // Reads see the call's own changes; a delete removes a committed key.
    let ok = json!({"incr": ["hits", "hits"], "set": {"name": "a"}, "check": {"hits": "2", "name": "a"}});
    let ok = enqueue(&host, "work", ok).await;
    wait_status(&host, ok, Status::Processed, T).await;
    assert_eq!(value(&host, "counters", "hits").await.as_deref(), Some("2"));
    let gone = json!({"delete": ["name"], "check": {"name": null, "hits": "2"}});
    let gone = enqueue(&host, "work", gone).await;
    wait_status(&host, gone, Status::Processed, T).await;
    assert_eq!(value(&host, "counters", "name").await, None);
    host.shutdown().await;
}

/// Values of every size in one commit — empty, multi-byte UTF-8, 200 KiB — come back byte
/// for byte (they are written together as one statement), and written over again.
async fn values_round_trip_exactly(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let big: String = (0..200 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let values = [
        ("empty", String::new()),
        ("umlauts", "Grüße, ☃ and 🚢".to_string()),
        ("big", big.clone()),
        ("one", "1".to_string()),
    ];
    let set: serde_json::Map<String, serde_json::Value> = values
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let first = enqueue(&host, "work", json!({ "set": set })).await;
    wait_status(&host, first, Status::Processed, T).await;
    for (key, expected) in &values {
        assert_eq!(
            value(&host, "counters", key).await.as_ref(),
            Some(expected),
            "{key}"
        );
    }
    let again = json!({"set": {"empty": "now set", "umlauts": "", "big": "small"}});
    let again = enqueue(&host, "work", again).await;
    wait_status(&host, again, Status::Processed, T).await;
    for (key, expected) in [
        ("empty", "now set"),
        ("umlauts", ""),
        ("big", "small"),
        ("one", "1"),
    ] {
        assert_eq!(
            value(&host, "counters", key).await.as_deref(),
            Some(expected),
            "{key}"
        );
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_round_trip_exactly_on_sqlite() {
    values_round_trip_exactly(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_round_trip_exactly_on_postgres() {
    values_round_trip_exactly(Db::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_successful_attempt_changes_state_on_sqlite() {
    only_a_successful_attempt_changes_state(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_successful_attempt_changes_state_on_postgres() {
    only_a_successful_attempt_changes_state(Db::Postgres).await
}

/// 400 messages incrementing one shared counter and one of 7 per-customer keys, 16 at a
/// time, plus 64 read-then-sets of one key: every count exact.
async fn concurrent_changes_lose_no_update(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let total = 400_i64;
    let mut messages: Vec<_> = (0..total)
        .map(|n| msg(json!({"incr": ["total", format!("customer-{}", n % 7)]})))
        .collect();
    messages.extend((0..64).map(|_| msg(json!({"read_set": "rmw", "sleep_ms": 5}))));
    let keys = host.router.enqueue_many("work", messages).await.unwrap();
    for key in keys {
        wait_status(&host, key.key, Status::Processed, T).await;
    }
    assert_eq!(
        value(&host, "counters", "total").await,
        Some(total.to_string())
    );
    for c in 0..7 {
        let expected = (0..total).filter(|n| n % 7 == c).count();
        let key = format!("customer-{c}");
        assert_eq!(
            value(&host, "counters", &key).await,
            Some(expected.to_string()),
            "{key}"
        );
    }
    assert_eq!(
        value(&host, "counters", "rmw").await.as_deref(),
        Some("64"),
        "no read-then-set lost"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_lose_no_update_on_sqlite() {
    concurrent_changes_lose_no_update(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_lose_no_update_on_postgres() {
    concurrent_changes_lose_no_update(Db::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_not_granted_is_an_error_naming_the_key() {
    let (_dir, _schema, host) = start(Db::Sqlite).await;
    let granted = enqueue(&host, "once", json!({"bucket": "customers", "incr": ["a"]})).await;
    wait_status(&host, granted, Status::Processed, T).await;
    let other = enqueue(&host, "once", json!({"bucket": "secrets", "incr": ["a"]})).await;
    let failed = wait_status(&host, other, Status::Failed, T).await;
    let error = failed.last_error.unwrap_or_default();
    assert!(
        error.contains("`secrets`") && error.contains("[handlers.kv] keyvalue"),
        "{error}"
    );
    let ungranted = enqueue(&host, "other", json!({"incr": ["a"]})).await;
    let failed = wait_status(&host, ungranted, Status::Failed, T).await;
    let error = failed.last_error.unwrap_or_default();
    assert!(error.contains("[handlers.ungranted] keyvalue"), "{error}");
    assert_eq!(value(&host, "secrets", "a").await, None);
    assert_eq!(value(&host, "customers", "a").await.as_deref(), Some("1"));
    host.shutdown().await;
}

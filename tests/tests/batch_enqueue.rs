//! Enqueueing in batches: `wharf enqueue --file` writes a thousand lines per transaction (or
//! per few publish calls on a broker) with every identity rule intact, and single enqueues
//! made at the same moment (handlers' follow-ups) are written together yet answered each.

use std::sync::Arc;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::Provider;
use wharf_host::external::redis::{RedisProvider, RedisSettings};
use wharf_host::queue::{EnqueueStatus, NewMessage};
use wharf_tests::{PgSchema, TestDir, database_url, redis_url, unique_prefix};

const QUEUES: &str =
    "[queues.work]\nhandler = \"none\"\n\n[queues.same]\nhandler = \"none\"\nidempotent = true\n";

/// 2,500 lines, 1,000 ids: each id three times at most, the last line of an id wins.
fn import_keeps_file_order(dir: &TestDir) {
    let lines: String = (0..2500)
        .map(|n| format!("{}\n", json!({"id": format!("o{}", n % 1000), "n": n})))
        .collect();
    std::fs::write(dir.path("orders.jsonl"), lines).unwrap();
    let import = |queue: &str| {
        let (ok, stdout, stderr) = dir.wharf(&[
            "--json",
            "enqueue",
            queue,
            "--file",
            "orders.jsonl",
            "--id-from",
            "/id",
        ]);
        assert!(ok, "{stderr}");
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()
    };
    assert_eq!(
        import("work"),
        json!({"added": 1000, "updated": 1500, "discarded": 0})
    );
    let (ok, stdout, stderr) = dir.wharf(&[
        "--json", "messages", "history", "--queue", "work", "--id", "o7",
    ]);
    assert!(ok, "{stderr}");
    let history: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    let versions: Vec<&str> = history
        .iter()
        .map(|h| h["payload"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        vec![r#"{"id":"o7","n":7}"#, r#"{"id":"o7","n":1007}"#],
        "earlier lines are earlier versions"
    );
    let (ok, stdout, _) = dir.wharf(&[
        "--json", "messages", "list", "--queue", "work", "--limit", "5000",
    ]);
    assert!(ok);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed.len(), 1000, "one message per id");
    let o7: Vec<&serde_json::Value> = listed.iter().filter(|m| m["id"] == json!("o7")).collect();
    assert_eq!(o7[0]["payload"], json!(r#"{"id":"o7","n":2007}"#));
    // An idempotent queue: equal values of one id are discarded, inside the file and when
    // the file is imported again.
    let lines: String = (0..1000)
        .map(|n| format!("{}\n", json!({"id": format!("p{}", n % 500)})))
        .collect();
    std::fs::write(dir.path("orders.jsonl"), lines).unwrap();
    assert_eq!(
        import("same"),
        json!({"added": 500, "updated": 0, "discarded": 500})
    );
    assert_eq!(
        import("same"),
        json!({"added": 0, "updated": 0, "discarded": 1000})
    );
}

#[test]
fn import_keeps_file_order_on_sqlite() {
    let dir = TestDir::new();
    dir.write_config(QUEUES);
    import_keeps_file_order(&dir);
}

#[test]
fn import_keeps_file_order_on_postgres() {
    let dir = TestDir::new();
    let schema = PgSchema::new();
    dir.write_config_with_storage(
        &format!("url = \"{}\"\nschema = \"{}\"", database_url(), schema.name),
        QUEUES,
    );
    import_keeps_file_order(&dir);
}

/// 300 enqueues at once: each caller gets its own message's answer.
async fn concurrent_enqueues_are_answered_each(
    router: Arc<dyn Enqueuer>,
    store: Arc<dyn wharf_host::queue::QueueStore>,
) {
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..300 {
        let router = router.clone();
        calls.spawn(async move {
            // The first 200 have their own ids; the rest share 10.
            let id = if n < 200 {
                format!("own-{n}")
            } else {
                format!("shared-{}", n % 10)
            };
            let payload = json!({"n": n}).to_string();
            let message = NewMessage {
                id: Some(id.clone()),
                payload: payload.clone(),
                ..NewMessage::default()
            };
            (id, payload, router.enqueue("work", message).await.unwrap())
        });
    }
    let results = calls.join_all().await;
    let added = |prefix: &str| {
        results
            .iter()
            .filter(|(id, _, d)| id.starts_with(prefix) && d.status == EnqueueStatus::Added)
            .count()
    };
    assert_eq!((added("own-"), added("shared-")), (200, 10));
    results
        .iter()
        .filter(|(id, ..)| id.starts_with("own-"))
        .for_each(|(id, payload, done)| assert!(done.key > 0, "{id}: {payload}"));
    let keys: std::collections::HashSet<i64> = results
        .iter()
        .filter(|(id, ..)| id.starts_with("own-"))
        .map(|(_, _, d)| d.key)
        .collect();
    assert_eq!(keys.len(), 200, "each message its own key");
    for (id, payload, done) in results.iter().filter(|(id, ..)| id.starts_with("own-")) {
        let stored = store.get(done.key).await.unwrap().unwrap();
        assert_eq!(
            (stored.id.as_deref(), &stored.payload),
            (Some(id.as_str()), payload),
            "the key answered to {id} is its message"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_enqueues_on_sqlite() {
    let dir = TestDir::new();
    let host = dir.start(QUEUES).await;
    concurrent_enqueues_are_answered_each(host.router.clone(), host.store.clone()).await;
    check_own_payloads(&host).await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_enqueues_on_postgres() {
    let dir = TestDir::new();
    let schema = PgSchema::new();
    let host = dir.start_postgres(&schema, "1s", QUEUES).await;
    concurrent_enqueues_are_answered_each(host.router.clone(), host.store.clone()).await;
    check_own_payloads(&host).await;
    host.shutdown().await;
}

/// Every `own-N` message holds payload N.
async fn check_own_payloads(host: &wharf_host::RunningHost) {
    for n in (0..200).step_by(7) {
        let filter = wharf_host::queue::MessageFilter {
            queue: Some("work".into()),
            id: Some(format!("own-{n}")),
            limit: 1,
            ..Default::default()
        };
        let found = host.store.list(&filter).await.unwrap();
        assert_eq!(found[0].payload, json!({"n": n}).to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_into_redis_publishes_in_batches() {
    let prefix = unique_prefix("batch");
    let dir = TestDir::new();
    dir.write_config(&format!(
        "[providers.main]\ntype = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\n\
         [queues.work]\nhandler = \"none\"\nstorage = \"external\"\nprovider = \"main\"\n",
        redis_url()
    ));
    // 2,400 lines: each of the import's four producers publishes 600, in two calls.
    let lines: String = (0..2400)
        .map(|n| format!("{}\n", json!({"n": n})))
        .collect();
    std::fs::write(dir.path("m.jsonl"), lines).unwrap();
    let (ok, stdout, stderr) = dir.wharf(&["--json", "enqueue", "work", "--file", "m.jsonl"]);
    assert!(ok, "{stderr}");
    let counts: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(counts["added"], json!(2400));
    let storage = RedisProvider::open(RedisSettings {
        key_prefix: prefix.clone(),
        ..RedisSettings::new(redis_url())
    })
    .await
    .unwrap();
    assert_eq!(storage.depth("work").await.unwrap().ready, 2400);
}

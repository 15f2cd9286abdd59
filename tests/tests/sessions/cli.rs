//! Sessions from the command line and the configuration: `--session`, `--session-from` on
//! an import (file order kept per session), and `sessions = true` refused on a provider that
//! cannot keep a session's order.

use std::collections::BTreeMap;

use wharf_tests::TestDir;

use super::queues;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_on_a_provider_without_keyed_order_are_refused_naming_the_key() {
    let dir = TestDir::new();
    let path = dir.write_config(
        r#"
[providers.bus]
type = "rabbitmq"
url = "amqp://guest:guest@127.0.0.1:5672/%2f"

[queues.orders]
handler = "flaky"
storage = "external"
provider = "bus"
sessions = true
"#,
    );
    let err = wharf_host::host::load_config(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("queues.orders.sessions")
            && err.contains("(type `rabbitmq`) cannot keep the messages of one session in order")
            && err.contains("single_active_consumer = true"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_enqueues_into_sessions_and_an_import_keeps_each_session_in_file_order() {
    let dir = TestDir::new();
    dir.write_config(&queues(8));
    let (ok, _, err) = dir.wharf(&["enqueue", "orders", r#"{"n":1}"#, "--session", "a"]);
    assert!(ok, "{err}");
    // Many lines, sessions interleaved: the import spreads them over parallel producers.
    let lines: String = (0..3000)
        .map(|n| format!("{{\"customer\":\"c{}\",\"n\":{n}}}\n", n % 7))
        .collect();
    std::fs::write(dir.path("events.jsonl"), lines).unwrap();
    let (ok, _, err) = dir.wharf(&[
        "enqueue",
        "orders",
        "--file",
        "events.jsonl",
        "--session-from",
        "/customer",
    ]);
    assert!(ok, "{err}");
    let store = dir.sqlite_store().await;
    let all = store
        .list(&wharf_host::queue::MessageFilter {
            queue: Some("orders".into()),
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 3001);
    let mut by_session: BTreeMap<String, Vec<(i64, u64)>> = BTreeMap::new();
    for m in &all {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        by_session
            .entry(m.session.clone().expect("every message has its session"))
            .or_default()
            .push((m.key, v["n"].as_u64().unwrap()));
    }
    assert_eq!(by_session.len(), 8, "a and c0..c6");
    for (session, mut rows) in by_session {
        rows.sort();
        let ns: Vec<u64> = rows.iter().map(|(_, n)| *n).collect();
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, sorted, "session {session} is in file order");
    }
    // The listing shows the session column when sessions are listed.
    let (ok, out, _) = dir.wharf(&["messages", "list", "--session", "c3", "--limit", "2"]);
    assert!(
        ok && out.contains("session") && out.contains(" c3 "),
        "{out}"
    );
    let (ok, out, _) = dir.wharf(&["messages", "list", "--queue", "replies"]);
    assert!(ok && !out.contains("session"), "{out}");
    // A line without the field stops the import, naming it.
    std::fs::write(dir.path("bad.jsonl"), "{\"customer\":\"c1\"}\n{\"n\":2}\n").unwrap();
    let (ok, _, err) = dir.wharf(&[
        "enqueue",
        "orders",
        "--file",
        "bad.jsonl",
        "--session-from",
        "/customer",
    ]);
    assert!(
        !ok && err.contains("bad.jsonl:2") && err.contains("/customer"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_sessions_drops_the_session_key() {
    use wharf_host::enqueue::Enqueuer;
    let dir = TestDir::new();
    let host = dir.start(&queues(4)).await;
    let keyed = || wharf_host::queue::NewMessage {
        payload: "{}".into(),
        session: Some("a".into()),
        ..Default::default()
    };
    let kept = host.router.enqueue("orders", keyed()).await.unwrap();
    let dropped = host.router.enqueue("replies", keyed()).await.unwrap();
    let stored = |key| {
        let store = host.store.clone();
        async move { store.get(key).await.unwrap().unwrap().session }
    };
    assert_eq!(stored(kept.key).await.as_deref(), Some("a"));
    assert_eq!(stored(dropped.key).await, None, "processed as in any queue");
    host.shutdown().await;
}

//! One limit for MessageIds (1024 characters) on every store and path, and each queue's
//! `max_payload`: the CLI, the JSON Lines import and the host's enqueue (the guests' path)
//! refuse a message beyond them with an error naming the limit, and enqueue nothing. An id of
//! 1024 multi-byte characters (3 KiB of UTF-8, over PostgreSQL's btree entry limit) is
//! stored, updated and found on both stores.

use serde_json::json;
use wharf_host::enqueue::{EnqueueError, Enqueuer};
use wharf_host::queue::NewMessage;
use wharf_tests::{PgSchema, TestDir, database_url};

const QUEUE: &str = "[queues.work]\nhandler = \"none\"\nmax_payload = \"32B\"\n";

fn list(dir: &TestDir) -> Vec<serde_json::Value> {
    let (ok, stdout, stderr) = dir.wharf(&["--json", "messages", "list", "--queue", "work"]);
    assert!(ok, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// The longest id is accepted and updates in place; one character more is refused.
fn ids_up_to_the_limit(dir: &TestDir) {
    let longest = "€".repeat(1024);
    for payload in [r#"{"v":1}"#, r#"{"v":2}"#] {
        let (ok, _, stderr) = dir.wharf(&["enqueue", "work", payload, "--id", &longest]);
        assert!(ok, "{stderr}");
    }
    let listed = list(dir);
    assert_eq!(listed.len(), 1, "the second enqueue updates the first");
    assert_eq!(listed[0]["id"], json!(longest));
    assert_eq!(listed[0]["payload"], json!(r#"{"v":2}"#));
    let (ok, stdout, stderr) = dir.wharf(&[
        "--json", "messages", "history", "--queue", "work", "--id", &longest,
    ]);
    assert!(ok, "{stderr}");
    let history: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        history.len(),
        1,
        "the replaced version is found by the long id"
    );
    assert_eq!(history[0]["payload"], json!(r#"{"v":1}"#));

    let over = "a".repeat(1025);
    let (ok, _, stderr) = dir.wharf(&["enqueue", "work", "{}", "--id", &over]);
    assert!(!ok);
    assert!(
        stderr.contains("the message id is 1025 characters long: ids are limited to 1024"),
        "{stderr}"
    );
    assert_eq!(list(dir).len(), 1, "nothing more was enqueued");
}

#[test]
fn ids_up_to_1024_characters_work_on_sqlite() {
    let dir = TestDir::new();
    dir.write_config(QUEUE);
    ids_up_to_the_limit(&dir);
}

#[test]
fn ids_up_to_1024_characters_work_on_postgres() {
    let dir = TestDir::new();
    let schema = PgSchema::new();
    dir.write_config_with_storage(
        &format!("url = \"{}\"\nschema = \"{}\"", database_url(), schema.name),
        QUEUE,
    );
    ids_up_to_the_limit(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_max_payload_are_refused_on_every_path() {
    let dir = TestDir::new();
    dir.write_config(QUEUE);
    let big = r#"{"text":"0123456789012345678901234567"}"#;
    assert!(big.len() > 32);

    let (ok, _, stderr) = dir.wharf(&["enqueue", "work", big]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "the payload is {} bytes: queue `work` takes at most 32 bytes (`queues.work.max_payload`)",
            big.len()
        )),
        "{stderr}"
    );

    let file = dir.path("orders.jsonl");
    std::fs::write(&file, format!("{{\"n\":1}}\n{big}\n{{\"n\":3}}\n")).unwrap();
    let (ok, _, stderr) = dir.wharf(&["enqueue", "work", "--file", "orders.jsonl"]);
    assert!(!ok);
    assert!(
        stderr.contains("orders.jsonl:2: nothing was enqueued"),
        "{stderr}"
    );
    assert!(stderr.contains("`queues.work.max_payload`"), "{stderr}");
    assert!(
        list(&dir).is_empty(),
        "a bad line stops the import before anything is stored"
    );

    // The host's enqueue, which guests' `host.enqueue` calls go through.
    let host = dir.start(QUEUE).await;
    let refused = host
        .router
        .enqueue(
            "work",
            NewMessage {
                payload: big.to_string(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, EnqueueError::Limit { .. }), "{refused}");
    assert!(refused.to_string().contains("`queues.work.max_payload`"));
    host.shutdown().await;
}

#[test]
fn messages_list_says_when_more_match_than_it_shows() {
    let dir = TestDir::new();
    dir.write_config(QUEUE);
    for n in 0..3 {
        let (ok, _, stderr) = dir.wharf(&["enqueue", "work", &format!("{{\"n\":{n}}}")]);
        assert!(ok, "{stderr}");
    }
    let (ok, stdout, _) = dir.wharf(&["messages", "list", "--limit", "2"]);
    assert!(ok);
    assert!(
        stdout.contains("showing the newest 2; more match"),
        "{stdout}"
    );
    let (ok, stdout, _) = dir.wharf(&["messages", "list", "--limit", "3"]);
    assert!(ok);
    assert!(!stdout.contains("more match"), "{stdout}");
}

//! `POST /api/v1/queues/{queue}/messages`: a message enqueued through the API is stored with
//! its id, priority, headers and delay and processed; errors name the queue or the field.

use serde_json::json;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, wait_status};

use super::{T, call};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_enqueued_through_the_api_is_stored_and_processed() {
    let dir = TestDir::new();
    dir.deploy("noop", "noop");
    let host = dir
        .start("[queues.work]\nhandler = \"noop\"\n\n[queues.held]\nhandler = \"not-deployed\"\n")
        .await;
    let body = json!({
        "payload": {"order": 7},
        "id": "order-7",
        "priority": 3,
        "headers": {"tenant": "a"},
    });
    let added = call(
        &host,
        "POST",
        "/api/v1/queues/work/messages",
        Some(body.clone()),
        None,
    )
    .await;
    assert_eq!(added.status, 201, "{}", added.body);
    assert_eq!(added.body["status"], "added");
    let key = added.body["key"].as_i64().unwrap();
    let done = wait_status(&host, key, Status::Processed, T).await;
    assert_eq!(done.payload, r#"{"order":7}"#);
    assert_eq!(done.id.as_deref(), Some("order-7"));
    assert_eq!(done.priority, 3);
    assert!(
        done.headers.contains(&("tenant".into(), "a".into())),
        "{:?}",
        done.headers
    );

    // A delay keeps it sleeping.
    let later = json!({"payload": 1, "delay_ms": 3_600_000});
    let later = call(
        &host,
        "POST",
        "/api/v1/queues/held/messages",
        Some(later),
        None,
    )
    .await;
    assert_eq!(later.status, 201, "{}", later.body);
    let stored = host
        .store
        .get(later.body["key"].as_i64().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, Status::Sleeping);

    let unknown = call(
        &host,
        "POST",
        "/api/v1/queues/nope/messages",
        Some(body),
        None,
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert!(
        unknown.body["error"]
            .as_str()
            .unwrap()
            .contains("unknown queue `nope`"),
        "{}",
        unknown.body
    );
    let bad = call(
        &host,
        "POST",
        "/api/v1/queues/work/messages",
        Some(json!({"body": 1})),
        None,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body["error"].as_str().unwrap().contains("payload"),
        "{}",
        bad.body
    );
    let session = json!({"payload": 1, "session": "s"});
    let refused = call(
        &host,
        "POST",
        "/api/v1/queues/work/messages",
        Some(session),
        None,
    )
    .await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("sessions = true"),
        "{}",
        refused.body
    );
}

//! The API's side of ordered sessions: blocked sessions, the session filter, and settling a
//! handoff as failed or completed.

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{NewMessage, Status};
use wharf_tests::{TestDir, wait_status};

use super::{T, call, get};

fn in_session(n: u32, handoff: bool) -> NewMessage {
    NewMessage {
        payload: json!({ "n": n, "handoff": handoff }).to_string(),
        session: Some("order-7".into()),
        ..NewMessage::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_sessions_are_listed_and_a_handoff_is_settled() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start("[queues.orders]\nhandler = \"flaky\"\nsessions = true\n")
        .await;
    let a1 = host
        .router
        .enqueue("orders", in_session(1, true))
        .await
        .unwrap()
        .key;
    let a2 = host
        .router
        .enqueue("orders", in_session(2, true))
        .await
        .unwrap()
        .key;
    let a3 = host
        .router
        .enqueue("orders", in_session(3, false))
        .await
        .unwrap()
        .key;
    wait_status(&host, a1, Status::HandedOff, T).await;
    wait_status(&host, a3, Status::Parked, T).await;

    let blocked = get(&host, "/api/v1/sessions?queue=orders").await;
    assert_eq!(blocked.status, 200, "{}", blocked.body);
    assert_eq!(blocked.body[0]["session"], "order-7");
    assert_eq!(blocked.body[0]["blocked_by_key"], a1);
    assert_eq!(blocked.body[0]["status"], "handed-off");
    assert_eq!(blocked.body[0]["parked"], 2);
    let listed = get(&host, "/api/v1/messages?session=order-7").await;
    assert_eq!(listed.body["messages"].as_array().unwrap().len(), 3);
    assert_eq!(listed.body["messages"][0]["session"], "order-7");
    let nothing = get(&host, "/api/v1/messages?session=order-8").await;
    assert!(nothing.body["messages"].as_array().unwrap().is_empty());
    let unknown = get(&host, "/api/v1/sessions?queue=nope").await;
    assert_eq!(unknown.status, 404);

    let refused = call(
        &host,
        "POST",
        &format!("/api/v1/messages/{a2}/complete"),
        None,
        None,
    )
    .await;
    assert_eq!(refused.status, 409);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("is parked"),
        "{}",
        refused.body
    );
    let hand = call(
        &host,
        "POST",
        &format!("/api/v1/messages/{a2}/move"),
        Some(json!({"status": "handed-off"})),
        None,
    )
    .await;
    assert_eq!(hand.status, 400, "the host's statuses are not set by hand");

    let failed = call(
        &host,
        "POST",
        &format!("/api/v1/messages/{a1}/fail"),
        Some(json!({"error": "partner refused"})),
        None,
    )
    .await;
    assert_eq!((failed.status, &failed.body), (200, &json!({"changed": 1})));
    let m = host.store.get(a1).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.last_error.as_deref()),
        (Status::Failed, Some("partner refused"))
    );
    // The session drained to the next handoff; completing it (no body) lets the last run.
    wait_status(&host, a2, Status::HandedOff, T).await;
    let done = call(
        &host,
        "POST",
        &format!("/api/v1/messages/{a2}/complete"),
        None,
        None,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    wait_status(&host, a3, Status::Processed, T).await;
    let none = get(&host, "/api/v1/sessions").await;
    assert_eq!(none.body, json!([]));
    host.shutdown().await;
}

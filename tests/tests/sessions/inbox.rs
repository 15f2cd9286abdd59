//! The consumer inbox's session rules: the inbox answers before the session rules, a drained
//! message already recorded is a duplicate, an aborted dispatch keeps its place.

use serde_json::json;
use wharf_host::inbox::{InboxKey, InboxStore};
use wharf_host::queue::Status;
use wharf_tests::{TestDir, messages, wait_for, wait_status};

use super::{Inbox, T, event, get, order_per_session, put, start};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_is_skipped_before_the_session_rules_and_leaves_a_later_block_alone() {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let host = start(&dir, &inbox, 8).await;
    let a1 = put(&host, event("a", 1, json!({}))).await;
    let a2 = put(&host, event("a", 2, json!({"permanent": "bad"}))).await;
    let a3 = put(&host, event("a", 3, json!({}))).await;
    wait_status(&host, a2, Status::Failed, T).await;
    wait_status(&host, a3, Status::Parked, T).await;
    // A redelivery of a1 (same delivery id, as after a lost completion) while its session is
    // blocked by a later message: the inbox answers first.
    assert!(host.store.move_to(a1, &Status::Pending).await.unwrap());
    let again = wait_for(T, "the redelivery to be skipped", || async {
        Some(get(&host, a1).await).filter(|m| m.outcome.as_deref() == Some("skipped: duplicate"))
    })
    .await;
    assert_eq!(again.status, Status::Processed);
    assert_eq!(
        messages(&host, "replies").await.len(),
        1,
        "a1 did not run again"
    );
    assert_eq!(
        get(&host, a3).await.status,
        Status::Parked,
        "the later block holds"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_message_already_recorded_is_a_duplicate() {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let host = start(&dir, &inbox, 8).await;
    let a1 = put(&host, event("a", 1, json!({"permanent": "bad"}))).await;
    let a2 = put(&host, event("a", 2, json!({}))).await;
    wait_status(&host, a1, Status::Failed, T).await;
    let parked = wait_status(&host, a2, Status::Parked, T).await;
    // Its delivery was already recorded (a second delivery of a message parked behind the
    // same block).
    let key = InboxKey::new("orders", &parked.delivery_id).unwrap();
    inbox.inner.record(&key, 60_000).await.unwrap();
    let (ok, _, err) = dir.wharf(&["messages", "delete", &a1.to_string()]);
    assert!(ok, "{err}");
    let done = wait_status(&host, a2, Status::Processed, T).await;
    assert_eq!(done.outcome.as_deref(), Some("skipped: duplicate"));
    assert!(messages(&host, "replies").await.is_empty());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_dispatch_of_a_drained_message_keeps_its_place() {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let host = start(&dir, &inbox, 8).await;
    let a1 = put(&host, event("a", 1, json!({"permanent": "bad"}))).await;
    let a2 = put(&host, event("a", 2, json!({}))).await;
    let a3 = put(&host, event("a", 3, json!({}))).await;
    wait_status(&host, a1, Status::Failed, T).await;
    let parked = wait_status(&host, a2, Status::Parked, T).await;
    wait_status(&host, a3, Status::Parked, T).await;
    // The inbox fails for a2 while the session drains: its dispatch aborts before the guest,
    // twice (it waits for its retry in between).
    *inbox.fail_checks_of.lock().unwrap() = Some(parked.delivery_id.clone());
    assert!(host.store.delete(a1).await.unwrap());
    wait_for(T, "two aborted attempts of a2", || async {
        Some(get(&host, a2).await).filter(|m| {
            m.attempts >= 2
                && m.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("inbox check failed"))
        })
    })
    .await;
    assert!(
        messages(&host, "replies").await.is_empty()
            && !matches!(
                get(&host, a3).await.status,
                Status::Processing | Status::Processed
            ),
        "a3 waits behind a2"
    );
    *inbox.fail_checks_of.lock().unwrap() = None;
    wait_status(&host, a3, Status::Processed, T).await;
    assert_eq!(order_per_session(&host).await["a"], [2, 3]);
    host.shutdown().await;
}

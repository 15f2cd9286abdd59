//! Identity: one message per (queue, id), updates instead of duplicates, idempotency,
//! custom statuses.

use std::sync::Arc;

use wharf_host::queue::{Disposition, EnqueueStatus, NewMessage, QueueStore, Selector, Status};

use super::{message, settle, status_of};

pub async fn same_id_updates_instead_of_adding(store: Arc<dyn QueueStore>) {
    let first = store
        .enqueue("q", message(Some("order-1"), r#"{"v":1}"#), false)
        .await
        .unwrap();
    assert_eq!(first.status, EnqueueStatus::Added);
    let other = store
        .enqueue("other", message(Some("order-1"), r#"{"v":1}"#), false)
        .await
        .unwrap();
    assert_ne!(
        other.key, first.key,
        "the same id in another queue is another message"
    );
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    settle(
        &store,
        leased[0].lease,
        Disposition::Fail {
            error: "boom".into(),
        },
    )
    .await;
    assert_eq!(status_of(&store, first.key).await, Status::Failed);
    let again = store
        .enqueue("q", message(Some("order-1"), r#"{"v":2}"#), false)
        .await
        .unwrap();
    assert_eq!(
        (again.key, again.status),
        (first.key, EnqueueStatus::Updated)
    );
    let m = store.get(first.key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.attempts, m.payload.as_str()),
        (Status::Pending, 0, r#"{"v":2}"#),
        "failed → pending"
    );
    assert_ne!(
        m.delivery_id, leased[0].delivery_id,
        "an update is a new delivery"
    );
    assert_eq!(m.version, 2);
    // The replaced version is readable as history, with the status it had.
    let history = store.history("q", "order-1").await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].status.clone(), history[0].payload.as_str()),
        (Status::Failed, r#"{"v":1}"#)
    );
    assert_eq!(history[0].last_error.as_deref(), Some("boom"));
    let a = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    let b = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    assert_ne!(a.key, b.key, "messages without an id never collide");
}

pub async fn concurrent_enqueues_of_one_id_leave_one_row(store: Arc<dyn QueueStore>) {
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..24 {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .enqueue(
                    "q",
                    message(Some("same"), &format!(r#"{{"n":{n}}}"#)),
                    false,
                )
                .await
                .unwrap()
        });
    }
    let results = tasks.join_all().await;
    assert!(
        results.iter().all(|r| r.key == results[0].key),
        "one key for every producer"
    );
    assert_eq!(
        results
            .iter()
            .filter(|r| r.status == EnqueueStatus::Added)
            .count(),
        1
    );
    assert_eq!(store.counts("q").await.unwrap(), vec![(Status::Pending, 1)]);
}

pub async fn idempotent_discards_equal_json_values(store: Arc<dyn QueueStore>) {
    let first = store
        .enqueue("q", message(Some("p-1"), r#"{"a":1,"b":[1,2]}"#), true)
        .await
        .unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    settle(&store, leased[0].lease, Disposition::Complete).await;
    // Equal as JSON values (key order, whitespace): discarded, nothing changes.
    let same = store
        .enqueue(
            "q",
            message(Some("p-1"), "{ \"b\": [1, 2], \"a\": 1 }"),
            true,
        )
        .await
        .unwrap();
    assert_eq!(
        (same.key, same.status),
        (first.key, EnqueueStatus::Discarded)
    );
    let m = store.get(first.key).await.unwrap().unwrap();
    assert_eq!((m.status, m.version), (Status::Processed, 1));
    // Without idempotency the same values update the message.
    let non = store
        .enqueue("q", message(Some("p-1"), r#"{"a":1,"b":[1,2]}"#), false)
        .await
        .unwrap();
    assert_eq!(non.status, EnqueueStatus::Updated);
    // Changed values are applied.
    let changed = store
        .enqueue("q", message(Some("p-1"), r#"{"a":2,"b":[1,2]}"#), true)
        .await
        .unwrap();
    assert_eq!(changed.status, EnqueueStatus::Updated);
    assert_eq!(
        store.get(first.key).await.unwrap().unwrap().payload,
        r#"{"a":2,"b":[1,2]}"#
    );
}

pub async fn custom_status_is_kept_until_moved(store: Arc<dyn QueueStore>) {
    let parked = Status::Custom("on-hold".into());
    let m = NewMessage {
        status: Some(parked.clone()),
        ..message(Some("x"), "{}")
    };
    let added = store.enqueue("q", m, false).await.unwrap();
    assert_eq!(status_of(&store, added.key).await, parked);
    assert!(
        store.lease("q", 10, 30_000).await.unwrap().is_empty(),
        "a custom status is not processed"
    );
    assert!(store.move_to(added.key, &Status::Pending).await.unwrap());
    assert_eq!(store.lease("q", 10, 30_000).await.unwrap().len(), 1);
    // Retrying by status picks messages of that custom status only.
    let other = NewMessage {
        status: Some(Status::Custom("held".into())),
        ..message(None, "{}")
    };
    let held = store.enqueue("q", other, false).await.unwrap();
    let selector = Selector::QueueStatus {
        queue: "q".into(),
        status: Status::Custom("held".into()),
    };
    assert_eq!(store.retry(&selector).await.unwrap(), 1);
    assert_eq!(status_of(&store, held.key).await, Status::Pending);
}

pub async fn enqueue_stores_an_error_and_a_source_delivery(store: Arc<dyn QueueStore>) {
    // E.g. a message moved in from an external provider after it failed there.
    let moved_in = |id: Option<&str>| NewMessage {
        status: Some(Status::Failed),
        last_error: Some("boom".into()),
        source_delivery_id: Some("ext-1".into()),
        ..message(id, r#"{"v":1}"#)
    };
    let added = store
        .enqueue("q", moved_in(Some("m-1")), false)
        .await
        .unwrap();
    assert_eq!(added.status, EnqueueStatus::Added);
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(
        (
            m.status,
            m.last_error.as_deref(),
            m.source_delivery_id.as_deref()
        ),
        (Status::Failed, Some("boom"), Some("ext-1"))
    );
    assert!(
        store.lease("q", 10, 30_000).await.unwrap().is_empty(),
        "a failed message is not processed"
    );
    // Without an id too (the insert outside a transaction).
    let anonymous = store.enqueue("q", moved_in(None), false).await.unwrap();
    let m = store.get(anonymous.key).await.unwrap().unwrap();
    assert_eq!(
        (
            m.status,
            m.last_error.as_deref(),
            m.source_delivery_id.as_deref()
        ),
        (Status::Failed, Some("boom"), Some("ext-1"))
    );
    // A plain enqueue of the same id replaces it and clears both.
    let plain = store
        .enqueue("q", message(Some("m-1"), r#"{"v":2}"#), false)
        .await
        .unwrap();
    assert_eq!(
        (plain.key, plain.status),
        (added.key, EnqueueStatus::Updated)
    );
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(
        (
            m.status,
            m.last_error.as_deref(),
            m.source_delivery_id.as_deref()
        ),
        (Status::Pending, None, None)
    );
    // A replacing enqueue stores them as given.
    let replaced = store
        .enqueue("q", moved_in(Some("m-1")), false)
        .await
        .unwrap();
    assert_eq!(
        (replaced.key, replaced.status),
        (added.key, EnqueueStatus::Updated)
    );
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(
        (
            m.status,
            m.last_error.as_deref(),
            m.source_delivery_id.as_deref()
        ),
        (Status::Failed, Some("boom"), Some("ext-1"))
    );
    // Resubmitted, it is delivered as standing in for the source delivery.
    assert_eq!(store.retry(&Selector::Key(added.key)).await.unwrap(), 1);
    let leased = store.lease("q", 10, 30_000).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].lease.key, added.key);
    assert_eq!(leased[0].source_delivery_id.as_deref(), Some("ext-1"));
}

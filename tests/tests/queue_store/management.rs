//! Operator commands: retry, move, delete.

use std::sync::Arc;

use wharf_host::queue::{Disposition, MessageFilter, QueueStore, Selector, Status};

use super::{message, settle, status_of};

pub async fn retry_resubmits_failed_messages(store: Arc<dyn QueueStore>) {
    let mut keys = Vec::new();
    for n in 0..3 {
        keys.push(
            store
                .enqueue("q", message(None, &format!("{{\"n\":{n}}}")), false)
                .await
                .unwrap()
                .key,
        );
    }
    for m in store.lease("q", 10, 30_000).await.unwrap() {
        settle(
            &store,
            m.lease,
            Disposition::Fail {
                error: "bad".into(),
            },
        )
        .await;
    }
    let before = store.get(keys[0]).await.unwrap().unwrap();
    assert_eq!(store.retry(&Selector::Key(keys[0])).await.unwrap(), 1);
    let after = store.get(keys[0]).await.unwrap().unwrap();
    assert_eq!((after.status, after.attempts), (Status::Pending, 0));
    assert_ne!(
        after.delivery_id, before.delivery_id,
        "a resubmission is a new delivery"
    );
    let all_failed = Selector::QueueStatus {
        queue: "q".into(),
        status: Status::Failed,
    };
    assert_eq!(store.retry(&all_failed).await.unwrap(), 2);
    assert_eq!(store.counts("q").await.unwrap(), vec![(Status::Pending, 3)]);
}

pub async fn move_and_delete_skip_leased_messages(store: Arc<dyn QueueStore>) {
    let a = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    store.lease("q", 1, 30_000).await.unwrap();
    let b = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    assert!(
        !store.move_to(a.key, &Status::Failed).await.unwrap(),
        "a leased message is not moved"
    );
    assert!(!store.delete(a.key).await.unwrap(), "nor deleted");
    assert_eq!(
        store.retry(&Selector::Key(a.key)).await.unwrap(),
        0,
        "nor resubmitted"
    );
    assert_eq!(status_of(&store, a.key).await, Status::Processing);
    assert!(
        store
            .move_to(b.key, &Status::Custom("on-hold".into()))
            .await
            .unwrap()
    );
    assert!(store.delete(b.key).await.unwrap());
    assert!(store.get(b.key).await.unwrap().is_none());
}

pub async fn list_pages_by_cursor_and_filters_by_id(store: Arc<dyn QueueStore>) {
    let mut keys = Vec::new();
    for n in 0..5 {
        let id = (n == 2).then(|| "order-2".to_string());
        keys.push(
            store
                .enqueue(
                    "q",
                    message(id.as_deref(), &format!("{{\"n\":{n}}}")),
                    false,
                )
                .await
                .unwrap()
                .key,
        );
    }
    store
        .enqueue("other", message(None, "{}"), false)
        .await
        .unwrap();
    let page = |before_key: Option<i64>| MessageFilter {
        queue: Some("q".into()),
        before_key,
        limit: 2,
        ..Default::default()
    };
    let first: Vec<i64> = store
        .list(&page(None))
        .await
        .unwrap()
        .iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(first, vec![keys[4], keys[3]], "newest first");
    let second: Vec<i64> = store
        .list(&page(Some(keys[3])))
        .await
        .unwrap()
        .iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(second, vec![keys[2], keys[1]], "the page after the cursor");
    let by_id = store
        .list(&MessageFilter {
            id: Some("order-2".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_id.len(), 1);
    assert_eq!(by_id[0].key, keys[2]);
}

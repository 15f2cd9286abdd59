//! Retention of processed messages and history.

use std::sync::Arc;
use std::time::Duration;

use wharf_host::queue::{Disposition, QueueStore, Retention, Settlement, Status};

use super::message;

async fn process_all(store: &Arc<dyn QueueStore>, keep: bool) {
    for m in store.lease("q", 1000, 30_000).await.unwrap() {
        let s = Settlement {
            keep_processed: keep,
            ..Settlement::new(m.lease, Disposition::Complete)
        };
        store.settle(&[s]).await.unwrap();
    }
}

pub async fn retention_zero_still_records_the_previous_version(store: Arc<dyn QueueStore>) {
    let plain = store
        .enqueue("q", message(None, r#"{"plain":1}"#), false)
        .await
        .unwrap();
    let identified = store
        .enqueue("q", message(Some("o-1"), r#"{"v":1}"#), false)
        .await
        .unwrap();
    process_all(&store, false).await;
    assert!(
        store.get(plain.key).await.unwrap().is_none(),
        "processed and not kept"
    );
    assert!(store.get(identified.key).await.unwrap().is_none());
    let history = store.history("q", "o-1").await.unwrap();
    assert_eq!(
        history.len(),
        1,
        "the processed version is recorded as the previous message"
    );
    assert_eq!(
        (history[0].status.clone(), history[0].payload.as_str()),
        (Status::Processed, r#"{"v":1}"#)
    );
    // Also when a newer version was waiting for release.
    let again = store
        .enqueue("q", message(Some("o-1"), r#"{"v":2}"#), false)
        .await
        .unwrap();
    let lease = store.lease("q", 1, 30_000).await.unwrap()[0].lease;
    store
        .enqueue("q", message(Some("o-1"), r#"{"v":3}"#), false)
        .await
        .unwrap();
    let s = Settlement {
        keep_processed: false,
        ..Settlement::new(lease, Disposition::Complete)
    };
    store.settle(&[s]).await.unwrap();
    let history = store.history("q", "o-1").await.unwrap();
    assert_eq!(history.last().unwrap().payload, r#"{"v":2}"#);
    assert_eq!(history.last().unwrap().status, Status::Processed);
    assert_eq!(
        store.get(again.key).await.unwrap().unwrap().payload,
        r#"{"v":3}"#
    );
}

pub async fn purge_by_age_and_count_is_bounded(store: Arc<dyn QueueStore>) {
    for n in 0..30 {
        store
            .enqueue("q", message(None, &format!("{{\"n\":{n}}}")), false)
            .await
            .unwrap();
    }
    store
        .enqueue("other", message(None, "{}"), false)
        .await
        .unwrap();
    process_all(&store, true).await;
    let count_only = Retention {
        max_age_ms: None,
        max_count: Some(10),
        history_versions: 10,
    };
    assert_eq!(
        store.purge("q", &count_only, 15).await.unwrap(),
        15,
        "bounded by the batch"
    );
    assert_eq!(store.purge("q", &count_only, 15).await.unwrap(), 5);
    let left = store
        .list(&wharf_host::queue::MessageFilter {
            queue: Some("q".into()),
            status: None,
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(left.len(), 10);
    let kept: Vec<i64> = left
        .iter()
        .map(|m| {
            serde_json::from_str::<serde_json::Value>(&m.payload).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert!(
        kept.iter().all(|n| *n >= 20),
        "the newest are kept: {kept:?}"
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    let by_age = Retention {
        max_age_ms: Some(10),
        max_count: None,
        history_versions: 10,
    };
    assert_eq!(store.purge("q", &by_age, 100).await.unwrap(), 10);
    assert_eq!(
        store.counts("other").await.unwrap(),
        vec![(Status::Pending, 1)],
        "other queues untouched"
    );
}

pub async fn history_keeps_the_newest_versions(store: Arc<dyn QueueStore>) {
    for v in 0..6 {
        store
            .enqueue("q", message(Some("o-1"), &format!("{{\"v\":{v}}}")), false)
            .await
            .unwrap();
    }
    assert_eq!(store.history("q", "o-1").await.unwrap().len(), 5);
    let keep_two = Retention {
        max_age_ms: None,
        max_count: None,
        history_versions: 2,
    };
    store.purge("q", &keep_two, 100).await.unwrap();
    let history: Vec<String> = store
        .history("q", "o-1")
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.payload)
        .collect();
    assert_eq!(history, vec![r#"{"v":3}"#, r#"{"v":4}"#]);
}

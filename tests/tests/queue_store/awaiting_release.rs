//! Enqueue while leased: the newer version waits for the current processor (AwaitingRelease).

use std::sync::Arc;
use std::time::Duration;

use wharf_host::queue::{
    Disposition, EnqueueStatus, NewMessage, QueueStore, SettleResult, Status, now_ms,
};

use super::{message, settle, status_of};

/// Enqueue `id` with `payload`, lease it; returns (key, lease).
async fn leased(
    store: &Arc<dyn QueueStore>,
    id: &str,
    payload: &str,
) -> (i64, wharf_host::queue::Lease) {
    let added = store
        .enqueue("q", message(Some(id), payload), false)
        .await
        .unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    assert_eq!(leased[0].lease.key, added.key);
    (added.key, leased[0].lease)
}

pub async fn enqueue_while_leased_waits_for_release(store: Arc<dyn QueueStore>) {
    let (key, lease) = leased(&store, "o-1", r#"{"v":1}"#).await;
    let newer = NewMessage {
        priority: 7,
        ..message(Some("o-1"), r#"{"v":2}"#)
    };
    let update = store.enqueue("q", newer, false).await.unwrap();
    assert_eq!((update.key, update.status), (key, EnqueueStatus::Updated));
    let m = store.get(key).await.unwrap().unwrap();
    assert_eq!(m.status, Status::AwaitingRelease);
    assert_eq!(m.payload, r#"{"v":1}"#, "the running version is untouched");
    assert_eq!(m.version, 1, "the running payload keeps its version number");
    assert_eq!(m.next.as_ref().unwrap().payload, r#"{"v":2}"#);
    assert!(
        store.lease("q", 10, 30_000).await.unwrap().is_empty(),
        "no one else can lease the newer version"
    );
    assert_eq!(
        settle(&store, lease, Disposition::Complete).await,
        SettleResult::Applied
    );
    let m = store.get(key).await.unwrap().unwrap();
    assert_eq!(
        (m.status.clone(), m.payload.as_str(), m.priority, m.attempts),
        (Status::Pending, r#"{"v":2}"#, 7, 0)
    );
    // The processed version is recorded as the previous message.
    let history = store.history("q", "o-1").await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].status.clone(), history[0].payload.as_str()),
        (Status::Processed, r#"{"v":1}"#)
    );
    assert!(history[0].processed_at_ms.is_some());
    // Versions name payloads one to one: 1 was processed, the released one is 2.
    assert_eq!((history[0].version, m.version), (1, 2));
    let next = store.lease("q", 10, 30_000).await.unwrap();
    assert_eq!((next.len(), next[0].payload.as_str()), (1, r#"{"v":2}"#));
}

pub async fn future_destination_sleeps_and_past_is_ready(store: Arc<dyn QueueStore>) {
    let (key, lease) = leased(&store, "o-1", "{}").await;
    let later = NewMessage {
        process_at_ms: Some(now_ms() + 250),
        ..message(Some("o-1"), r#"{"v":2}"#)
    };
    store.enqueue("q", later, false).await.unwrap();
    settle(&store, lease, Disposition::Release).await;
    assert_eq!(
        status_of(&store, key).await,
        Status::Sleeping,
        "a future destination sleeps"
    );
    assert!(store.lease("q", 1, 30_000).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.lease("q", 1, 30_000).await.unwrap().len(), 1);

    // A date that has passed by the time of release is ready at once.
    let (key, lease) = leased(&store, "o-2", "{}").await;
    let soon = NewMessage {
        process_at_ms: Some(now_ms() + 50),
        ..message(Some("o-2"), r#"{"v":2}"#)
    };
    store.enqueue("q", soon, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    settle(&store, lease, Disposition::Complete).await;
    assert_eq!(status_of(&store, key).await, Status::Pending);
    assert_eq!(store.lease("q", 1, 30_000).await.unwrap()[0].lease.key, key);
}

pub async fn custom_destination_keeps_its_status(store: Arc<dyn QueueStore>) {
    let (key, lease) = leased(&store, "o-1", "{}").await;
    let parked = NewMessage {
        status: Some(Status::Custom("on-hold".into())),
        ..message(Some("o-1"), r#"{"v":2}"#)
    };
    store.enqueue("q", parked, false).await.unwrap();
    settle(&store, lease, Disposition::Complete).await;
    let m = store.get(key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.payload.as_str()),
        (Status::Custom("on-hold".into()), r#"{"v":2}"#)
    );
    assert!(store.lease("q", 1, 30_000).await.unwrap().is_empty());
}

pub async fn older_outcomes_do_not_overwrite_the_newer_enqueue(store: Arc<dyn QueueStore>) {
    let outcomes = [
        Disposition::Fail {
            error: "old processor failed".into(),
        },
        Disposition::Retry {
            at_ms: now_ms() + 60_000,
            error: Some("old processor retries".into()),
        },
        Disposition::Release,
    ];
    for (n, outcome) in outcomes.into_iter().enumerate() {
        let id = format!("o-{n}");
        let (key, lease) = leased(&store, &id, r#"{"v":1}"#).await;
        let newer = NewMessage {
            priority: 3,
            ..message(Some(&id), r#"{"v":2}"#)
        };
        store.enqueue("q", newer, false).await.unwrap();
        assert_eq!(
            settle(&store, lease, outcome.clone()).await,
            SettleResult::Applied
        );
        let m = store.get(key).await.unwrap().unwrap();
        assert_eq!(
            m.status,
            Status::Pending,
            "{outcome:?}: the newer enqueue decides the status"
        );
        assert_eq!(
            (m.payload.as_str(), m.priority, m.attempts),
            (r#"{"v":2}"#, 3, 0),
            "{outcome:?}"
        );
        assert!(
            m.last_error.is_none(),
            "{outcome:?}: the older failure is not the newer version's"
        );
        assert!(
            m.process_at_ms <= now_ms(),
            "{outcome:?}: the older reschedule does not apply"
        );
        // Take it out of the way for the next case.
        let next = store.lease("q", 1, 30_000).await.unwrap();
        settle(&store, next[0].lease, Disposition::Complete).await;
    }
}

pub async fn further_enqueues_replace_the_deferred_values(store: Arc<dyn QueueStore>) {
    let (key, lease) = leased(&store, "o-1", r#"{"v":1}"#).await;
    store
        .enqueue(
            "q",
            NewMessage {
                priority: 1,
                ..message(Some("o-1"), r#"{"v":2}"#)
            },
            false,
        )
        .await
        .unwrap();
    let later = NewMessage {
        priority: 9,
        process_at_ms: Some(now_ms() - 1),
        ..message(Some("o-1"), r#"{"v":3}"#)
    };
    store.enqueue("q", later, false).await.unwrap();
    assert_eq!(
        store.get(key).await.unwrap().unwrap().next.unwrap().payload,
        r#"{"v":3}"#
    );
    settle(&store, lease, Disposition::Complete).await;
    let m = store.get(key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.payload.as_str(), m.priority),
        (Status::Pending, r#"{"v":3}"#, 9)
    );
}

pub async fn idempotent_compares_with_the_deferred_version(store: Arc<dyn QueueStore>) {
    let (key, lease) = leased(&store, "o-1", r#"{"v":1}"#).await;
    // Equal to the running version, but not to "the latest": while nothing is deferred the
    // running version is the latest, so this is discarded.
    let same = store
        .enqueue("q", message(Some("o-1"), r#"{"v":1}"#), true)
        .await
        .unwrap();
    assert_eq!(same.status, EnqueueStatus::Discarded);
    assert_eq!(status_of(&store, key).await, Status::Processing);
    store
        .enqueue("q", message(Some("o-1"), r#"{"v":2}"#), true)
        .await
        .unwrap();
    let again = store
        .enqueue("q", message(Some("o-1"), r#"{ "v": 2 }"#), true)
        .await
        .unwrap();
    assert_eq!(
        again.status,
        EnqueueStatus::Discarded,
        "equal to the deferred version"
    );
    let back = store
        .enqueue("q", message(Some("o-1"), r#"{"v":1}"#), true)
        .await
        .unwrap();
    assert_eq!(
        back.status,
        EnqueueStatus::Updated,
        "differs from the deferred version"
    );
    settle(&store, lease, Disposition::Complete).await;
    assert_eq!(store.get(key).await.unwrap().unwrap().payload, r#"{"v":1}"#);
}

pub async fn abandonment_with_retry_applies_the_newer_version(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(Some("o-1"), r#"{"v":1}"#), false)
        .await
        .unwrap();
    let lease = store.lease("q", 1, 20).await.unwrap()[0].lease;
    store
        .enqueue("q", message(Some("o-1"), r#"{"v":2}"#), false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.expire_leases("q", 5, true).await.unwrap(), 1);
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.payload.as_str(), m.attempts),
        (Status::Pending, r#"{"v":2}"#, 0)
    );
    assert_eq!(
        settle(&store, lease, Disposition::Complete).await,
        SettleResult::LeaseLost,
        "the old lease is fenced"
    );
}

pub async fn abandonment_without_retry_fails_the_newer_version(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(Some("o-1"), r#"{"v":1}"#), false)
        .await
        .unwrap();
    store.lease("q", 1, 20).await.unwrap();
    store
        .enqueue("q", message(Some("o-1"), r#"{"v":2}"#), false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.expire_leases("q", 5, false).await.unwrap(), 1);
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.payload.as_str()),
        (Status::Failed, r#"{"v":2}"#)
    );
    assert!(m.last_error.unwrap().contains("retry_abandoned = false"));
}

pub async fn a_moved_in_version_keeps_its_attempts_error_and_source(store: Arc<dyn QueueStore>) {
    // A message moved in from a broker while its held-back publication is still leased.
    let (key, lease) = leased(&store, "o-1", r#"{"v":1}"#).await;
    let moved = NewMessage {
        attempts: 1,
        last_error: Some("transient error: db down".into()),
        source_delivery_id: Some("o-1".into()),
        process_at_ms: Some(now_ms() - 1),
        ..message(Some("o-1"), r#"{"v":2}"#)
    };
    store.enqueue("q", moved, false).await.unwrap();
    assert_eq!(
        settle(&store, lease, Disposition::Complete).await,
        SettleResult::Applied
    );
    let m = store.get(key).await.unwrap().unwrap();
    assert_eq!((m.status.clone(), m.attempts), (Status::Pending, 1));
    assert_eq!(m.last_error.as_deref(), Some("transient error: db down"));
    assert_eq!(m.source_delivery_id.as_deref(), Some("o-1"));
    let next = store.lease("q", 10, 30_000).await.unwrap();
    assert_eq!(next[0].attempt, 2, "the attempt made in the broker counts");
    assert_eq!(next[0].source_delivery_id.as_deref(), Some("o-1"));
}

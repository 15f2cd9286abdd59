//! Leases, fencing, expiry and abandonment, lease order, scheduling.

use std::sync::Arc;
use std::time::Duration;

use wharf_host::queue::{
    Disposition, NewMessage, QueueStore, SettleResult, Settlement, Status, now_ms,
};

use super::{message, settle, status_of};

pub async fn fencing_rejects_a_stale_lease(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    let first = store.lease("q", 10, 50).await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(
        store.lease("q", 10, 50).await.unwrap().is_empty(),
        "a leased message is not leased twice"
    );
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(store.expire_leases("q", 5, true).await.unwrap(), 1);
    let second = store.lease("q", 10, 30_000).await.unwrap();
    assert_eq!(second.len(), 1);
    assert!(
        second[0].lease.token > first[0].lease.token,
        "a new lease has a larger token"
    );
    assert_eq!(second[0].attempt, 2);
    for stale in [
        Disposition::Complete,
        Disposition::Fail {
            error: "late".into(),
        },
        Disposition::Release,
    ] {
        assert_eq!(
            settle(&store, first[0].lease, stale).await,
            SettleResult::LeaseLost
        );
    }
    let retry = Disposition::Retry {
        at_ms: now_ms(),
        error: Some("late".into()),
    };
    assert_eq!(
        settle(&store, first[0].lease, retry).await,
        SettleResult::LeaseLost
    );
    // The stale and the live lease of one message in one batch: each judged by its token.
    let both = store
        .settle(&[
            Settlement::new(first[0].lease, Disposition::Complete),
            Settlement::new(second[0].lease, Disposition::Complete),
        ])
        .await
        .unwrap();
    assert_eq!(both, vec![SettleResult::LeaseLost, SettleResult::Applied]);
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(m.status, Status::Processed);
    assert!(
        m.last_error.unwrap().contains("lease expired"),
        "the expiry is recorded"
    );
}

pub async fn expired_lease_on_the_last_attempt_fails(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    store.lease("q", 1, 10).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(store.expire_leases("q", 1, true).await.unwrap(), 1);
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!((m.status, m.attempts), (Status::Failed, 1));
    assert!(m.last_error.unwrap().contains("lease expired"));
}

pub async fn abandoned_without_retry_fails(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    store.lease("q", 1, 10).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(store.expire_leases("q", 5, false).await.unwrap(), 1);
    assert_eq!(status_of(&store, added.key).await, Status::Failed);
    // Leases that have not expired are left alone.
    let other = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    store.lease("q", 1, 30_000).await.unwrap();
    assert_eq!(store.expire_leases("q", 5, false).await.unwrap(), 0);
    assert_eq!(status_of(&store, other.key).await, Status::Processing);
}

pub async fn release_does_not_count_the_attempt(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    assert_eq!(
        settle(&store, leased[0].lease, Disposition::Release).await,
        SettleResult::Applied
    );
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!((m.status, m.attempts), (Status::Pending, 0));
}

pub async fn priority_then_date_then_fifo(store: Arc<dyn QueueStore>) {
    let now = now_ms();
    let cases = [
        (0, now - 10),
        (5, now - 5),
        (0, now - 20),
        (5, now - 5),
        (-3, now - 100),
    ];
    let mut keys = Vec::new();
    for (n, (priority, at)) in cases.iter().enumerate() {
        let m = NewMessage {
            priority: *priority,
            process_at_ms: Some(*at),
            ..message(None, &format!("{{\"n\":{n}}}"))
        };
        keys.push(store.enqueue("q", m, false).await.unwrap().key);
    }
    let leased: Vec<i64> = store
        .lease("q", 10, 30_000)
        .await
        .unwrap()
        .iter()
        .map(|m| m.lease.key)
        .collect();
    assert_eq!(leased, vec![keys[1], keys[3], keys[2], keys[0], keys[4]]);
}

pub async fn scheduled_messages_wait_for_their_date(store: Arc<dyn QueueStore>) {
    let later = NewMessage {
        process_at_ms: Some(now_ms() + 300),
        ..message(None, "{}")
    };
    let added = store.enqueue("q", later, false).await.unwrap();
    assert_eq!(status_of(&store, added.key).await, Status::Sleeping);
    assert!(store.lease("q", 10, 30_000).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        store.lease("q", 10, 30_000).await.unwrap().len(),
        1,
        "due: leased from sleeping"
    );
}

pub async fn retries_sleep_until_due(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(None, "{}"), false)
        .await
        .unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    let retry = Disposition::Retry {
        at_ms: now_ms() + 300,
        error: Some("db down".into()),
    };
    assert_eq!(
        settle(&store, leased[0].lease, retry).await,
        SettleResult::Applied
    );
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.attempts, m.last_error.as_deref()),
        (Status::Sleeping, 1, Some("db down"))
    );
    assert!(store.lease("q", 1, 30_000).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(350)).await;
    let again = store.lease("q", 1, 30_000).await.unwrap();
    assert_eq!(again[0].attempt, 2);
}

/// A settlement retried after its completion went through (its answer was lost, or what
/// followed it in the batch failed) is applied, once: not reported as a lost lease.
pub async fn a_retried_completion_is_applied_once(store: Arc<dyn QueueStore>) {
    let added = store
        .enqueue("q", message(Some("retried"), "{}"), false)
        .await
        .unwrap();
    let leased = store.lease("q", 10, 30_000).await.unwrap();
    let lease = leased[0].lease;
    for _ in 0..2 {
        assert_eq!(
            settle(&store, lease, Disposition::Complete).await,
            SettleResult::Applied
        );
    }
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!((m.status, m.attempts), (Status::Processed, 1));
    assert!(
        store.history("q", "retried").await.unwrap().is_empty(),
        "completing twice records nothing in history"
    );
    // A failure is not a completion: a completed lease settled as failed is lost.
    let fail = Disposition::Fail {
        error: "late".into(),
    };
    assert_eq!(settle(&store, lease, fail).await, SettleResult::LeaseLost);
    assert_eq!(status_of(&store, added.key).await, Status::Processed);
}

//! The `QueueStore` contract, written once and run against every store.

use std::sync::Arc;
use std::time::Duration;

use wharf_host::queue::{
    Disposition, EnqueueStatus, NewMessage, QueueStore, SettleResult, Settlement, SqliteStore,
    Status,
};

/// A store for one test, with whatever keeps its database alive.
struct Subject {
    store: Arc<dyn QueueStore>,
    _guard: Box<dyn std::any::Any + Send>,
}

async fn sqlite() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("queue.db").display());
    Subject {
        store: Arc::new(SqliteStore::open(&url, 4).await.unwrap()),
        _guard: Box::new(dir),
    }
}

fn message(id: Option<&str>, payload: &str) -> NewMessage {
    NewMessage {
        id: id.map(str::to_string),
        payload: payload.to_string(),
        ..NewMessage::default()
    }
}

macro_rules! conformance {
    ($store:ident) => {
        mod $store {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fencing_rejects_a_stale_lease() {
                super::fencing_rejects_a_stale_lease(super::$store().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_lease_on_the_last_attempt_fails() {
                super::expired_lease_on_the_last_attempt_fails(super::$store().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn same_id_updates_instead_of_adding() {
                super::same_id_updates_instead_of_adding(super::$store().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_enqueues_of_one_id_leave_one_row() {
                super::concurrent_enqueues_of_one_id_leave_one_row(super::$store().await.store)
                    .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_does_not_count_the_attempt() {
                super::release_does_not_count_the_attempt(super::$store().await.store).await
            }
        }
    };
}

conformance!(sqlite);

async fn fencing_rejects_a_stale_lease(store: Arc<dyn QueueStore>) {
    let added = store.enqueue("q", message(None, "{}")).await.unwrap();
    let first = store.lease("q", 10, 50).await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(
        store.lease("q", 10, 50).await.unwrap().is_empty(),
        "a leased message is not leased twice"
    );
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(store.expire_leases("q", 5).await.unwrap(), 1);
    let second = store.lease("q", 10, 30_000).await.unwrap();
    assert_eq!(second.len(), 1);
    assert!(
        second[0].lease.token > first[0].lease.token,
        "a new lease has a larger token"
    );
    assert_eq!(second[0].attempt, 2);
    let stale = Settlement {
        lease: first[0].lease,
        disposition: Disposition::Complete,
    };
    assert_eq!(
        store.settle(&[stale]).await.unwrap(),
        vec![SettleResult::LeaseLost]
    );
    let stale_fail = Settlement {
        lease: first[0].lease,
        disposition: Disposition::Fail {
            error: "late".into(),
        },
    };
    assert_eq!(
        store.settle(&[stale_fail]).await.unwrap(),
        vec![SettleResult::LeaseLost]
    );
    let current = Settlement {
        lease: second[0].lease,
        disposition: Disposition::Complete,
    };
    assert_eq!(
        store.settle(&[current]).await.unwrap(),
        vec![SettleResult::Applied]
    );
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!(m.status, Status::Processed);
    assert_eq!(
        m.last_error.as_deref().map(|e| e.contains("lease expired")),
        Some(true)
    );
}

async fn expired_lease_on_the_last_attempt_fails(store: Arc<dyn QueueStore>) {
    let added = store.enqueue("q", message(None, "{}")).await.unwrap();
    store.lease("q", 1, 10).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(store.expire_leases("q", 1).await.unwrap(), 1);
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!((m.status, m.attempts), (Status::Failed, 1));
    assert!(m.last_error.unwrap().contains("lease expired"));
}

async fn same_id_updates_instead_of_adding(store: Arc<dyn QueueStore>) {
    let first = store
        .enqueue("q", message(Some("order-1"), r#"{"v":1}"#))
        .await
        .unwrap();
    assert_eq!(first.status, EnqueueStatus::Added);
    // The same id in another queue is another message.
    let other = store
        .enqueue("other", message(Some("order-1"), r#"{"v":1}"#))
        .await
        .unwrap();
    assert_ne!(other.key, first.key);
    // Fail it, then enqueue the same id again: updated and pending again.
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    let fail = Settlement {
        lease: leased[0].lease,
        disposition: Disposition::Fail {
            error: "boom".into(),
        },
    };
    store.settle(&[fail]).await.unwrap();
    assert_eq!(
        store.get(first.key).await.unwrap().unwrap().status,
        Status::Failed
    );
    let again = store
        .enqueue("q", message(Some("order-1"), r#"{"v":2}"#))
        .await
        .unwrap();
    assert_eq!(
        (again.key, again.status),
        (first.key, EnqueueStatus::Updated)
    );
    let m = store.get(first.key).await.unwrap().unwrap();
    assert_eq!(
        (m.status, m.attempts, m.payload.as_str()),
        (Status::Pending, 0, r#"{"v":2}"#)
    );
    assert_ne!(
        m.delivery_id, leased[0].delivery_id,
        "an update is a new delivery"
    );
    // Messages without an id never collide.
    let a = store.enqueue("q", message(None, "{}")).await.unwrap();
    let b = store.enqueue("q", message(None, "{}")).await.unwrap();
    assert_ne!(a.key, b.key);
}

async fn concurrent_enqueues_of_one_id_leave_one_row(store: Arc<dyn QueueStore>) {
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..20 {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .enqueue("q", message(Some("same"), &format!(r#"{{"n":{n}}}"#)))
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
    let counts = store.counts("q").await.unwrap();
    assert_eq!(counts, vec![(Status::Pending, 1)]);
}

async fn release_does_not_count_the_attempt(store: Arc<dyn QueueStore>) {
    let added = store.enqueue("q", message(None, "{}")).await.unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    let release = Settlement {
        lease: leased[0].lease,
        disposition: Disposition::Release,
    };
    assert_eq!(
        store.settle(&[release]).await.unwrap(),
        vec![SettleResult::Applied]
    );
    let m = store.get(added.key).await.unwrap().unwrap();
    assert_eq!((m.status, m.attempts), (Status::Pending, 0));
}

//! Batch enqueue (`enqueue_many`, behind `wharf enqueue --file`): the identity rules hold
//! inside a batch exactly as for single enqueues, in batch order.

use std::sync::Arc;

use wharf_host::queue::{EnqueueStatus, QueueStore, Status};

use super::message;

pub async fn a_batch_applies_repeated_ids_in_order(store: Arc<dyn QueueStore>) {
    let batch = vec![
        message(Some("a"), r#"{"v":1}"#),
        message(None, r#"{"anonymous":1}"#),
        message(Some("b"), r#"{"v":1}"#),
        message(Some("a"), r#"{"v":2}"#),
        message(Some("a"), r#"{"v":3}"#),
    ];
    let done = store.enqueue_many("q", batch, false).await.unwrap();
    let statuses: Vec<EnqueueStatus> = done.iter().map(|d| d.status).collect();
    use EnqueueStatus::{Added, Updated};
    assert_eq!(statuses, vec![Added, Added, Added, Updated, Updated]);
    assert_eq!(done[0].key, done[3].key, "one message per id");
    assert_eq!(done[0].key, done[4].key);
    let a = store.get(done[0].key).await.unwrap().unwrap();
    assert_eq!((a.payload.as_str(), a.version), (r#"{"v":3}"#, 3));
    let history = store.history("q", "a").await.unwrap();
    let payloads: Vec<&str> = history.iter().map(|h| h.payload.as_str()).collect();
    assert_eq!(payloads, vec![r#"{"v":1}"#, r#"{"v":2}"#], "file order");
    // First enqueued, first leased.
    let leased = store.lease("q", 10, 30_000).await.unwrap();
    let keys: Vec<i64> = leased.iter().map(|m| m.lease.key).collect();
    assert_eq!(keys, vec![done[0].key, done[1].key, done[2].key]);
}

pub async fn a_batch_defers_leased_ids_and_discards_equal_values(store: Arc<dyn QueueStore>) {
    let first = store
        .enqueue_many(
            "q",
            vec![
                message(Some("a"), r#"{"v":1}"#),
                message(Some("b"), r#"{"v":1}"#),
            ],
            true,
        )
        .await
        .unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap();
    assert_eq!(leased[0].lease.key, first[0].key);
    let batch = vec![
        message(Some("a"), r#"{"v":2}"#),
        message(Some("b"), r#"{ "v": 1 }"#),
        message(Some("c"), r#"{"v":1}"#),
        message(Some("c"), r#"{"v":1}"#),
        // Equal to the deferred version, not to the running one.
        message(Some("a"), r#"{"v": 2}"#),
    ];
    let done = store.enqueue_many("q", batch, true).await.unwrap();
    use EnqueueStatus::{Added, Discarded, Updated};
    let statuses: Vec<EnqueueStatus> = done.iter().map(|d| d.status).collect();
    assert_eq!(
        statuses,
        vec![Updated, Discarded, Added, Discarded, Discarded]
    );
    let a = store.get(first[0].key).await.unwrap().unwrap();
    assert_eq!(a.status, Status::AwaitingRelease, "the lease is kept");
    assert_eq!(a.payload, r#"{"v":1}"#, "the running version is kept");
    assert_eq!(
        a.next.map(|n| n.payload).as_deref(),
        Some(r#"{"v":2}"#),
        "the new version waits for release"
    );
}

pub async fn batches_larger_than_a_transaction_keep_every_message(store: Arc<dyn QueueStore>) {
    // 2,500 messages: three transactions, ids and anonymous messages mixed.
    let batch: Vec<_> = (0..2500)
        .map(|n| {
            let id = (n % 2 == 0).then(|| format!("id-{n}"));
            message(id.as_deref(), &format!(r#"{{"n":{n}}}"#))
        })
        .collect();
    let done = store.enqueue_many("q", batch, false).await.unwrap();
    assert_eq!(done.len(), 2500);
    assert!(done.iter().all(|d| d.status == EnqueueStatus::Added));
    assert!(
        done.windows(2).all(|w| w[0].key < w[1].key),
        "keys follow the batch order"
    );
    let counts = store.counts("q").await.unwrap();
    assert_eq!(counts, vec![(Status::Pending, 2500)]);
    let last = store.get(done[2499].key).await.unwrap().unwrap();
    assert_eq!(last.payload, r#"{"n":2499}"#);
}

pub async fn concurrent_batches_of_the_same_ids_leave_one_row_each(store: Arc<dyn QueueStore>) {
    // Opposite orders would make the two transactions wait for each other in a cycle (on
    // PostgreSQL, where the store takes its id locks in one order); several rounds make the
    // overlap likely.
    for round in 0..5 {
        let forward: Vec<String> = (0..1000).map(|n| format!("r{round}-{n}")).collect();
        let batch = |ids: &[String], tag: &str| {
            ids.iter()
                .map(|id| message(Some(id), &format!(r#"{{"by":"{tag}"}}"#)))
                .collect::<Vec<_>>()
        };
        let backward: Vec<String> = forward.iter().rev().cloned().collect();
        let (one, two) = (store.clone(), store.clone());
        let (b1, b2) = (batch(&forward, "one"), batch(&backward, "two"));
        let (r1, r2) = tokio::join!(
            tokio::spawn(async move { one.enqueue_many("q", b1, false).await }),
            tokio::spawn(async move { two.enqueue_many("q", b2, false).await }),
        );
        let (r1, r2) = (r1.unwrap().unwrap(), r2.unwrap().unwrap());
        let added = r1
            .iter()
            .chain(&r2)
            .filter(|d| d.status == EnqueueStatus::Added)
            .count();
        assert_eq!(
            added, 1000,
            "each id added once, updated by the other batch"
        );
    }
    let counts = store.counts("q").await.unwrap();
    assert_eq!(counts, vec![(Status::Pending, 5000)]);
}

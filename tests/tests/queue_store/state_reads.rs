//! Reads of handlers' committed key-value state, many at once: every read gets its own key's
//! value however the reads are coalesced, and reads cancelled while they wait or lead never
//! stall the ones after them.

use std::sync::Arc;
use std::time::Duration;

use wharf_host::queue::{Disposition, QueueStore, Settlement, StateChange, StateWrite};

use super::message;

const KEYS: u64 = 40;

/// Commit counter `k{i}` = `i + 1` for every key, through settlements as a handler's would.
async fn commit_counters(store: &Arc<dyn QueueStore>) {
    store.enqueue("q", message(None, "1"), false).await.unwrap();
    let leased = store.lease("q", 1, 30_000).await.unwrap().remove(0);
    let mut settlement = Settlement::new(leased.lease, Disposition::Complete);
    settlement.state = (0..KEYS)
        .map(|i| StateWrite {
            bucket: "b".into(),
            key: format!("k{i}"),
            change: StateChange::Add(i + 1),
            expect: None,
        })
        .collect();
    store.settle(&[settlement]).await.unwrap();
}

async fn read(store: &Arc<dyn QueueStore>, i: u64) -> Option<String> {
    store
        .state_read("b", &format!("k{i}"))
        .await
        .unwrap()
        .map(|(value, _)| String::from_utf8(value).unwrap())
}

pub async fn concurrent_reads_each_get_their_key(store: Arc<dyn QueueStore>) {
    commit_counters(&store).await;
    // Every read started before any is awaited, so they run at once.
    let reads: Vec<_> = (0..400u64)
        .map(|n| {
            let store = store.clone();
            // Some keys absent, many read by several callers at once.
            let i = n % (KEYS + 5);
            tokio::spawn(async move { (i, read(&store, i).await) })
        })
        .collect();
    for read in reads {
        let (i, value) = read.await.unwrap();
        let expected = (i < KEYS).then(|| (i + 1).to_string());
        assert_eq!(value, expected, "read of k{i}");
    }
}

pub async fn cancelled_reads_never_stall_the_others(store: Arc<dyn QueueStore>) {
    commit_counters(&store).await;
    for round in 0..20u64 {
        let reads: Vec<_> = (0..64u64)
            .map(|n| {
                let store = store.clone();
                let i = n % KEYS;
                tokio::spawn(async move {
                    if n % 3 == round % 3 {
                        // Dropped at some point of its wait or its own statement.
                        let _ = tokio::time::timeout(
                            Duration::from_micros(50 * (n % 7)),
                            read(&store, i),
                        )
                        .await;
                        None
                    } else {
                        Some((i, read(&store, i).await))
                    }
                })
            })
            .collect();
        let answered = tokio::time::timeout(Duration::from_secs(30), async {
            for read in reads {
                if let Some((i, value)) = read.await.unwrap() {
                    assert_eq!(value, Some((i + 1).to_string()), "read of k{i}");
                }
            }
        })
        .await;
        assert!(
            answered.is_ok(),
            "round {round}: reads stalled after cancellations"
        );
    }
}

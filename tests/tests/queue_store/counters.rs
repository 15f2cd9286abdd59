//! Increments of key-value counters committed with a batch of settlements: added up per key
//! in order, applied only with the completions that are applied (not with a lost lease), and
//! an increment that cannot apply (a value that is not a counter, or a sum past the largest)
//! a state conflict of its settlement alone, the others of the batch committed.

use std::sync::Arc;

use wharf_host::queue::{
    Disposition, Lease, QueueStore, SettleResult, Settlement, StateChange, StateWrite, Status,
};

use super::{message, status_of};

fn write(key: &str, change: StateChange) -> StateWrite {
    StateWrite {
        bucket: "b".into(),
        key: key.into(),
        change,
        expect: None,
    }
}

/// `n` messages enqueued and leased, in key order.
async fn leased(store: &Arc<dyn QueueStore>, n: usize) -> Vec<Lease> {
    for i in 0..n {
        store
            .enqueue("q", message(None, &i.to_string()), false)
            .await
            .unwrap();
    }
    let mut leases: Vec<Lease> = (store.lease("q", n as u32, 30_000).await.unwrap())
        .into_iter()
        .map(|m| m.lease)
        .collect();
    leases.sort_by_key(|l| l.key);
    assert_eq!(leases.len(), n);
    leases
}

/// A completion of `lease` staging `state`.
fn completing(lease: Lease, state: Vec<StateWrite>) -> Settlement {
    let mut settlement = Settlement::new(lease, Disposition::Complete);
    settlement.state = state;
    settlement
}

async fn value(store: &Arc<dyn QueueStore>, key: &str) -> Option<String> {
    store
        .state_read("b", key)
        .await
        .unwrap()
        .map(|(v, _)| String::from_utf8(v).unwrap())
}

/// Set `key` to `value` through a settlement, as a handler would.
async fn set(store: &Arc<dyn QueueStore>, key: &str, value: &str) {
    let lease = leased(store, 1).await[0];
    let set = write(key, StateChange::Set(value.as_bytes().to_vec()));
    let result = store.settle(&[completing(lease, vec![set])]).await.unwrap();
    assert_eq!(result, vec![SettleResult::Applied]);
}

pub async fn increments_sum_per_key_and_follow_their_completion(store: Arc<dyn QueueStore>) {
    set(&store, "a", "10").await;
    let l = leased(&store, 4).await;
    let stale = Lease {
        token: l[3].token + 1000,
        ..l[3]
    };
    let batch = [
        completing(l[0], vec![write("a", StateChange::Add(1))]),
        completing(
            l[1],
            vec![
                write("a", StateChange::Add(2)),
                write("b", StateChange::Add(5)),
            ],
        ),
        completing(l[2], vec![write("b", StateChange::Add(7))]),
        // Not this processor's lease: its increment is never applied.
        completing(stale, vec![write("a", StateChange::Add(100))]),
    ];
    let results = store.settle(&batch).await.unwrap();
    assert_eq!(
        results,
        [
            SettleResult::Applied,
            SettleResult::Applied,
            SettleResult::Applied,
            SettleResult::LeaseLost
        ]
    );
    assert_eq!(value(&store, "a").await.as_deref(), Some("13"));
    assert_eq!(value(&store, "b").await.as_deref(), Some("12"));
    assert_eq!(status_of(&store, l[3].key).await, Status::Processing);
}

pub async fn an_increment_that_cannot_apply_is_a_conflict_of_its_settlement_alone(
    store: Arc<dyn QueueStore>,
) {
    set(&store, "text", "abc").await;
    set(&store, "top", &(u64::MAX - 1).to_string()).await;
    let l = leased(&store, 4).await;
    let batch = [
        completing(l[0], vec![write("text", StateChange::Add(1))]),
        completing(l[1], vec![write("top", StateChange::Add(1))]),
        // Past the largest counter once the one before it is applied.
        completing(l[2], vec![write("top", StateChange::Add(1))]),
        completing(l[3], vec![write("fresh", StateChange::Add(3))]),
    ];
    let results = store.settle(&batch).await.unwrap();
    assert_eq!(
        results,
        [
            SettleResult::StateConflict("b/text".into()),
            SettleResult::Applied,
            SettleResult::StateConflict("b/top".into()),
            SettleResult::Applied,
        ]
    );
    assert_eq!(value(&store, "text").await.as_deref(), Some("abc"));
    assert_eq!(
        value(&store, "top").await,
        Some(u64::MAX.to_string()),
        "the first increment applied, the second not"
    );
    assert_eq!(value(&store, "fresh").await.as_deref(), Some("3"));
    // A conflicting settlement is released (its default), the others processed.
    let statuses = [
        status_of(&store, l[0].key).await,
        status_of(&store, l[1].key).await,
        status_of(&store, l[2].key).await,
        status_of(&store, l[3].key).await,
    ];
    assert_eq!(
        statuses,
        [
            Status::Pending,
            Status::Processed,
            Status::Pending,
            Status::Processed
        ]
    );
}

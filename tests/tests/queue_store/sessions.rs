//! Ordered sessions: one message per session in flight, in key order; a failure or handoff
//! blocks its session and parks what follows; resolving the blocker drains it in order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use wharf_host::queue::{
    Disposition, LeasedMessage, NewMessage, QueueStore, Settlement, Status, sessions,
};

use super::status_of;

fn in_session(session: &str, payload: &str) -> NewMessage {
    NewMessage {
        payload: payload.to_string(),
        session: Some(session.to_string()),
        ..NewMessage::default()
    }
}

async fn put(store: &Arc<dyn QueueStore>, session: &str, payload: &str) -> i64 {
    store
        .enqueue("q", in_session(session, payload), false)
        .await
        .unwrap()
        .key
}

async fn heads(store: &Arc<dyn QueueStore>) -> Vec<LeasedMessage> {
    store
        .lease_in_sessions("q", 100, 30_000, None)
        .await
        .unwrap()
}

fn payloads(leased: &[LeasedMessage]) -> Vec<&str> {
    let mut p: Vec<&str> = leased.iter().map(|m| m.payload.as_str()).collect();
    p.sort_unstable();
    p
}

/// Settle `m` as a session message of queue `q`.
async fn settle(store: &Arc<dyn QueueStore>, m: &LeasedMessage, disposition: Disposition) {
    let mut s = Settlement::new(m.lease, disposition);
    s.session = m.session.clone().map(|k| ("q".to_string(), k));
    store.settle(&[s]).await.unwrap();
}

fn fail() -> Disposition {
    Disposition::Fail {
        error: "bad data".into(),
    }
}

pub async fn one_head_per_session_in_key_order(store: Arc<dyn QueueStore>) {
    put(&store, "a", "1").await;
    // Priority orders sessions, never messages inside one.
    let mut urgent = in_session("a", "2");
    urgent.priority = 9;
    store.enqueue("q", urgent, false).await.unwrap();
    put(&store, "b", "3").await;
    put(&store, "a", "4").await;
    store
        .enqueue("q", super::message(None, "5"), false)
        .await
        .unwrap();
    let first = heads(&store).await;
    assert_eq!(
        payloads(&first),
        ["1", "3", "5"],
        "the head of each session"
    );
    assert!(
        heads(&store).await.is_empty(),
        "heads in flight hold their sessions"
    );
    let one = first.iter().find(|m| m.payload == "1").unwrap();
    assert_eq!(one.session.as_deref(), Some("a"));
    settle(&store, one, Disposition::Complete).await;
    let next = heads(&store).await;
    assert_eq!(
        payloads(&next),
        ["2"],
        "then the next of session a, despite priority"
    );
    // A retry keeps its place: the session waits for it.
    settle(
        &store,
        &next[0],
        Disposition::Retry {
            at_ms: wharf_host::queue::now_ms() + 60_000,
            error: Some("later".into()),
        },
    )
    .await;
    assert!(
        heads(&store).await.is_empty(),
        "a sleeping retry holds its session"
    );
}

pub async fn a_failure_parks_the_session_and_a_successful_retry_drains_it(
    store: Arc<dyn QueueStore>,
) {
    let blocker = put(&store, "a", "1").await;
    let a2 = put(&store, "a", "2").await;
    let a3 = put(&store, "a", "3").await;
    let first = heads(&store).await;
    assert_eq!(payloads(&first), ["1"]);
    settle(&store, &first[0], fail()).await;
    assert_eq!(status_of(&store, blocker).await, Status::Failed);
    for key in [a2, a3] {
        assert_eq!(status_of(&store, key).await, Status::Parked);
    }
    // Enqueued into a blocked session: parked at once. Other sessions go on.
    let a4 = put(&store, "a", "4").await;
    assert_eq!(status_of(&store, a4).await, Status::Parked);
    put(&store, "b", "5").await;
    assert_eq!(payloads(&heads(&store).await), ["5"]);
    let blocked = store.blocked_sessions(Some("q"), 10).await.unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(
        (
            blocked[0].session.as_str(),
            blocked[0].blocked_by_key,
            blocked[0].parked
        ),
        ("a", blocker, 3)
    );
    // A retry of the blocker runs alone; the parked ones wait for its success.
    assert_eq!(
        store
            .retry(&wharf_host::queue::Selector::Key(blocker))
            .await
            .unwrap(),
        1
    );
    assert_eq!(status_of(&store, a2).await, Status::Parked);
    let retried = heads(&store).await;
    assert_eq!(payloads(&retried), ["1"]);
    settle(&store, &retried[0], Disposition::Complete).await;
    assert!(store.blocked_sessions(None, 10).await.unwrap().is_empty());
    // Drained in order, one at a time.
    let mut order = Vec::new();
    loop {
        let leased = heads(&store).await;
        if leased.is_empty() {
            break;
        }
        assert_eq!(leased.len(), 1, "one message of the session at a time");
        order.push(leased[0].payload.clone());
        settle(&store, &leased[0], Disposition::Complete).await;
    }
    assert_eq!(order, ["2", "3", "4"]);
}

pub async fn deleting_or_moving_the_blocker_drains_the_session(store: Arc<dyn QueueStore>) {
    put(&store, "a", "1").await;
    let a2 = put(&store, "a", "2").await;
    let a3 = put(&store, "a", "3").await;
    let first = heads(&store).await;
    settle(&store, &first[0], fail()).await;
    assert_eq!(status_of(&store, a2).await, Status::Parked);
    assert!(store.delete(first[0].lease.key).await.unwrap());
    assert_eq!(
        status_of(&store, a2).await,
        Status::Pending,
        "a delete resolves"
    );
    let second = heads(&store).await;
    assert_eq!(payloads(&second), ["2"]);
    settle(&store, &second[0], fail()).await;
    assert_eq!(status_of(&store, a3).await, Status::Parked);
    assert!(
        store
            .move_to(a2, &Status::Custom("skipped".into()))
            .await
            .unwrap()
    );
    assert_eq!(
        status_of(&store, a3).await,
        Status::Pending,
        "a skip resolves"
    );
    assert_eq!(payloads(&heads(&store).await), ["3"]);
}

pub async fn a_handoff_blocks_until_an_operator_settles_it(store: Arc<dyn QueueStore>) {
    put(&store, "a", "1").await;
    let a2 = put(&store, "a", "2").await;
    let a3 = put(&store, "a", "3").await;
    let first = heads(&store).await;
    settle(&store, &first[0], Disposition::HandOff).await;
    let handed = first[0].lease.key;
    assert_eq!(status_of(&store, handed).await, Status::HandedOff);
    assert_eq!(status_of(&store, a2).await, Status::Parked);
    assert!(heads(&store).await.is_empty());
    assert!(
        !store.settle_handoff(a2, None).await.unwrap(),
        "only a handed-off message is settled"
    );
    assert!(store.settle_handoff(handed, None).await.unwrap());
    let done = store.get(handed).await.unwrap().unwrap();
    assert_eq!(done.status, Status::Processed);
    assert_eq!(done.outcome.as_deref(), Some(sessions::HANDOFF_COMPLETED));
    let second = heads(&store).await;
    assert_eq!(payloads(&second), ["2"]);
    // A handoff settled as failed is kept failed and does not block.
    settle(&store, &second[0], Disposition::HandOff).await;
    assert_eq!(status_of(&store, a3).await, Status::Parked);
    assert!(
        store
            .settle_handoff(a2, Some("partner refused"))
            .await
            .unwrap()
    );
    let failed = store.get(a2).await.unwrap().unwrap();
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.last_error.as_deref(), Some("partner refused"));
    assert_eq!(status_of(&store, a3).await, Status::Pending);
    assert!(store.blocked_sessions(None, 10).await.unwrap().is_empty());
}

pub async fn an_abandoned_lease_blocks_its_session(store: Arc<dyn QueueStore>) {
    put(&store, "a", "1").await;
    let a2 = put(&store, "a", "2").await;
    let first = store.lease_in_sessions("q", 10, 1, None).await.unwrap();
    assert_eq!(first.len(), 1);
    // The 1 ms lease runs out: the sweep abandons it as soon as it has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.expire_leases("q", 5, false).await.unwrap() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never expired"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(status_of(&store, first[0].lease.key).await, Status::Failed);
    assert!(
        heads(&store).await.is_empty(),
        "the failed message blocks its session"
    );
    store.tend_sessions("q").await.unwrap();
    assert_eq!(status_of(&store, a2).await, Status::Parked);
}

pub async fn concurrent_processors_keep_every_session_in_order(store: Arc<dyn QueueStore>) {
    const SESSIONS: usize = 100;
    const PER_SESSION: usize = 5;
    let mut batch = Vec::new();
    for n in 0..PER_SESSION {
        for s in 0..SESSIONS {
            batch.push(in_session(&format!("s{s}"), &format!("{n}")));
        }
    }
    store.enqueue_many("q", batch, false).await.unwrap();
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, Vec<usize>>>> = Arc::default();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (store, in_flight, seen) = (store.clone(), in_flight.clone(), seen.clone());
        workers.spawn(async move {
            let mut idle = 0;
            while idle < 50 {
                let leased = store.lease_in_sessions("q", 4, 30_000, None).await.unwrap();
                if leased.is_empty() {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle = 0;
                for m in &leased {
                    let session = m.session.clone().unwrap();
                    assert!(
                        in_flight.lock().unwrap().insert(session.clone()),
                        "two messages of session {session} in flight at once"
                    );
                }
                tokio::task::yield_now().await;
                for m in &leased {
                    let session = m.session.clone().unwrap();
                    seen.lock()
                        .unwrap()
                        .entry(session.clone())
                        .or_default()
                        .push(m.payload.parse().unwrap());
                    in_flight.lock().unwrap().remove(&session);
                    settle(&store, m, Disposition::Complete).await;
                }
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), SESSIONS);
    for (session, order) in seen.iter() {
        assert_eq!(
            *order,
            (0..PER_SESSION).collect::<Vec<_>>(),
            "session {session} ran in enqueue order, each once"
        );
    }
}

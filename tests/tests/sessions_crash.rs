//! Ordered sessions through crashes: `wharf run` is killed (SIGKILL) again and again while
//! sessions block, park, get resolved by an operator and drain — on a SQL queue, and on
//! external queues (Kafka, RabbitMQ), where messages also wait on the host behind their
//! session and move between the broker and the SQL queue. Afterwards every message is
//! processed, no session is blocked or parked, and every session ran in order (a message
//! that ran again after a crash runs again before the next one, never after it).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use wharf_host::external::rabbitmq::RabbitSettings;
use wharf_host::queue::{MessageFilter, NewMessage, QueueStore, Status};
use wharf_tests::kafka::{TEST_PROPERTIES, kafka_brokers};
use wharf_tests::{TestDir, amqp_delete, amqp_url, spawn_wharf, unique_prefix};

const SESSIONS: usize = 12;
const PER_SESSION: u64 = 6;

const QUEUES: &str = r#"
[queues.orders]
handler = "flaky"
sessions = true
concurrency = 8
lease = "1s"
timeout = "500ms"
max_attempts = 50
backoff = "20ms"
max_backoff = "50ms"
inbox = { store = "sql" }

[queues.replies]
handler = "not-deployed"
"#;

/// Message 2 of each session fails until the operator fixes it; message 4 is handed off.
fn payload(session: usize, n: u64, fixed: bool) -> String {
    let mut p = json!({"s": session, "n": n, "reply_to": "replies", "sleep_ms": 15});
    if n == 2 && !fixed {
        p["permanent"] = json!("needs the operator");
    }
    if n == 4 {
        p["handoff"] = json!(true);
    }
    p.to_string()
}

async fn all(store: &dyn QueueStore, queue: &str) -> Vec<wharf_host::queue::StoredMessage> {
    store
        .list(&MessageFilter {
            queue: Some(queue.into()),
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// What an operator does with blocked sessions: fix and retry a failed blocker, complete a
/// handed-off one. Returns how many it resolved.
async fn resolve(dir: &TestDir, store: &dyn QueueStore) -> usize {
    let blocked = store.blocked_sessions(Some("orders"), 100).await.unwrap();
    for b in &blocked {
        match b.status {
            Status::Failed => {
                let m = store.get(b.blocked_by_key).await.unwrap().unwrap();
                let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
                let fixed = payload(v["s"].as_u64().unwrap() as usize, 2, true);
                let pool = sqlx::SqlitePool::connect(&format!(
                    "sqlite://{}",
                    dir.path("wharf.db").display()
                ))
                .await
                .unwrap();
                sqlx::query("UPDATE messages SET payload = ?1 WHERE key = ?2")
                    .bind(fixed)
                    .bind(b.blocked_by_key)
                    .execute(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                store
                    .retry(&wharf_host::queue::Selector::Key(b.blocked_by_key))
                    .await
                    .unwrap();
            }
            Status::HandedOff => {
                store.settle_handoff(b.blocked_by_key, None).await.unwrap();
            }
            _ => {}
        }
    }
    blocked.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_block_park_resolve_and_drain_loses_and_reorders_nothing() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    dir.write_config(QUEUES);
    let store = dir.sqlite_store().await;
    let mut batch = Vec::new();
    for n in 0..PER_SESSION {
        for s in 0..SESSIONS {
            batch.push(NewMessage {
                payload: payload(s, n, false),
                session: Some(format!("s{s}")),
                ..NewMessage::default()
            });
        }
    }
    store.enqueue_many("orders", batch, false).await.unwrap();

    let total = SESSIONS * PER_SESSION as usize;
    crash_until_done(&dir, &*store, async || {
        let done = all(&*store, "orders")
            .await
            .iter()
            .filter(|m| m.status == Status::Processed)
            .count();
        (done, done == total)
    })
    .await;
    assert!(store.blocked_sessions(None, 10).await.unwrap().is_empty());
    let counts = counts(&*store).await;
    assert_eq!(
        counts,
        vec![(Status::Processed, total as u64)],
        "{counts:?}"
    );

    assert_each_session_in_order(&*store).await;
}

/// Run `wharf run` in `dir`, SIGKILL it and start it again (up to eight times, each time once
/// it is working again, at a varying moment after that) while an operator resolves what blocks,
/// until `progress` says it is finished; it returns how far the work is and whether it is done.
async fn crash_until_done(
    dir: &TestDir,
    store: &dyn QueueStore,
    mut progress: impl AsyncFnMut() -> (usize, bool),
) {
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut kills = 0;
    let mut host = spawn_wharf(dir.dir.path());
    // The progress when the host was (re)started, and when it first moved since.
    let mut done_at_start = 0;
    let mut working_since: Option<Instant> = None;
    loop {
        resolve(dir, store).await;
        let (done, finished) = progress().await;
        if finished {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not done after {kills} kills: at {done}, {:?}",
            counts(store).await
        );
        if done > done_at_start && working_since.is_none() {
            working_since = Some(Instant::now());
        }
        let kill_after = Duration::from_millis(40 * (kills % 5));
        if kills < 8 && working_since.is_some_and(|t| t.elapsed() >= kill_after) {
            host.kill();
            kills += 1;
            host = spawn_wharf(dir.dir.path());
            done_at_start = done;
            working_since = None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    host.terminate();
    assert!(kills >= 3, "the host was killed {kills} times");
}

/// Every session replied to each of its messages, in order: a rerun after a crash may repeat
/// a message, never go back.
async fn assert_each_session_in_order(store: &dyn QueueStore) {
    let mut replies = all(store, "replies").await;
    replies.sort_by_key(|m| m.key);
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for m in replies {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        seen.entry(v["seen"]["s"].as_u64().unwrap())
            .or_default()
            .push(v["seen"]["n"].as_u64().unwrap());
    }
    assert_eq!(seen.len(), SESSIONS);
    for (session, order) in &seen {
        let mut firsts = order.clone();
        firsts.dedup();
        assert_eq!(
            firsts,
            (0..PER_SESSION).collect::<Vec<_>>(),
            "session {session} ran out of order: {order:?}"
        );
    }
}

async fn counts(store: &dyn QueueStore) -> Vec<(Status, u64)> {
    store.counts("orders").await.unwrap()
}

/// The queues of the external case: `orders` on the provider `section`, otherwise as in
/// [`QUEUES`].
fn external_queues(section: &str) -> String {
    let queues = QUEUES.replace(
        "handler = \"flaky\"\n",
        "handler = \"flaky\"\nstorage = \"external\"\nprovider = \"broker\"\n",
    );
    format!("[external]\nreconcile_interval = \"300ms\"\n\n[providers.broker]\n{section}\n{queues}")
}

/// The external case: the messages are published into the broker by `wharf enqueue --file`
/// (with MessageIds, so the inbox skips what ran before a crash), then a host is killed
/// again and again while an operator resolves what blocks.
async fn sigkill_on_an_external_queue(section: &str) {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    dir.write_config(&external_queues(section));
    let mut lines = String::new();
    for n in 0..PER_SESSION {
        for s in 0..SESSIONS {
            let mut line: serde_json::Value = serde_json::from_str(&payload(s, n, false)).unwrap();
            line["id"] = json!(format!("s{s}-{n}"));
            line["session"] = json!(format!("s{s}"));
            lines.push_str(&format!("{line}\n"));
        }
    }
    std::fs::write(dir.path("events.jsonl"), lines).unwrap();
    let (ok, _, err) = dir.wharf(&[
        "enqueue",
        "orders",
        "--file",
        "events.jsonl",
        "--id-from",
        "/id",
        "--session-from",
        "/session",
    ]);
    assert!(ok, "{err}");
    let store = dir.sqlite_store().await;

    let total = SESSIONS * PER_SESSION as usize;
    crash_until_done(&dir, &*store, async || {
        let done = replied(&*store).await;
        let settled = counts(&*store)
            .await
            .iter()
            .all(|(status, _)| *status == Status::Processed);
        (done, done == total && settled)
    })
    .await;
    assert!(store.blocked_sessions(None, 10).await.unwrap().is_empty());
    assert_each_session_in_order(&*store).await;
}

/// How many distinct messages replied.
async fn replied(store: &dyn QueueStore) -> usize {
    let mut seen: Vec<(u64, u64)> = all(store, "replies")
        .await
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
            (
                v["seen"]["s"].as_u64().unwrap(),
                v["seen"]["n"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_on_a_kafka_session_queue_loses_and_reorders_nothing() {
    let prefix = unique_prefix("crash").replace(':', ".");
    let section = format!(
        "type = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{prefix}\"\nprocessing_group = \"{prefix}processing\"\nreadiness_group = \"{prefix}readiness\"\npartitions = 3\n{TEST_PROPERTIES}",
        kafka_brokers()
    );
    sigkill_on_an_external_queue(&section).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_on_a_rabbitmq_session_queue_loses_and_reorders_nothing() {
    let prefix = unique_prefix("crash").replace(':', ".");
    let section = format!(
        "type = \"rabbitmq\"\nurl = \"{}\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\nsingle_active_consumer = true",
        amqp_url()
    );
    let names = RabbitSettings {
        exchange_prefix: prefix.clone(),
        queue_prefix: prefix.clone(),
        ..RabbitSettings::new(amqp_url())
    }
    .names("orders");
    sigkill_on_an_external_queue(&section).await;
    amqp_delete(
        &amqp_url(),
        &[names.processing, names.readiness],
        &[names.exchange],
    )
    .await;
}

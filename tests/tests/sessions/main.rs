//! Ordered sessions in a running host: order within each session under concurrency, no two
//! messages of a session in flight across two hosts, block → park → resolve → drain through
//! the CLI; the consumer inbox's session rules ([`inbox`]) and the CLI and config ([`cli`]).

mod cli;
mod external;
mod inbox;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::inbox::{InboxError, InboxKey, InboxStore, MemoryInbox};
use wharf_host::queue::{NewMessage, Status, StoredMessage};
use wharf_host::{Config, RunningHost, StartOptions};
use wharf_tests::{PgSchema, TestDir, database_url, messages, wait_for, wait_status};

pub(crate) const T: Duration = Duration::from_secs(60);

pub(crate) fn queues(concurrency: u32) -> String {
    format!(
        r#"
[queues.orders]
handler = "flaky"
sessions = true
concurrency = {concurrency}
batch = 32
max_attempts = 10
backoff = "50ms"
max_backoff = "100ms"
inbox = {{ store = "memory" }}

[queues.replies]
handler = "not-deployed"
"#
    )
}

pub(crate) fn event(session: &str, n: usize, extra: serde_json::Value) -> NewMessage {
    let mut payload = json!({"s": session, "n": n, "reply_to": "replies"});
    for (k, v) in extra.as_object().unwrap() {
        payload[k] = v.clone();
    }
    NewMessage {
        payload: payload.to_string(),
        session: Some(session.to_string()),
        ..NewMessage::default()
    }
}

/// An inbox store kept in memory whose checks of one delivery can be made to fail.
#[derive(Default)]
pub(crate) struct Inbox {
    inner: MemoryInbox,
    fail_checks_of: std::sync::Mutex<Option<String>>,
}

#[async_trait]
impl InboxStore for Inbox {
    async fn is_processed(&self, key: &InboxKey) -> Result<bool, InboxError> {
        let failing = self.fail_checks_of.lock().unwrap().clone();
        if failing.is_some_and(|id| InboxKey::new("orders", &id).ok().as_ref() == Some(key)) {
            return Err(InboxError::Setup("injected inbox outage".into()));
        }
        self.inner.is_processed(key).await
    }
    async fn record(&self, key: &InboxKey, retention_ms: i64) -> Result<(), InboxError> {
        self.inner.record(key, retention_ms).await
    }
    async fn purge_expired(
        &self,
        endpoint: &str,
        cutoff_ms: i64,
        batch: u32,
    ) -> Result<u64, InboxError> {
        self.inner.purge_expired(endpoint, cutoff_ms, batch).await
    }
}

pub(crate) async fn start(dir: &TestDir, inbox: &Arc<Inbox>, concurrency: u32) -> RunningHost {
    dir.deploy("flaky", "flaky");
    let config = Config::load(&dir.write_config(&queues(concurrency))).unwrap();
    let options = StartOptions {
        inbox_store: Some(inbox.clone()),
    };
    wharf_host::start_with(config, options).await.unwrap()
}

/// The `n` of each reply per session, in the order the replies were written.
pub(crate) async fn order_per_session(host: &RunningHost) -> BTreeMap<String, Vec<u64>> {
    let mut replies = messages(host, "replies").await;
    replies.sort_by_key(|m| m.key);
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for m in replies {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        out.entry(v["seen"]["s"].as_str().unwrap().to_string())
            .or_default()
            .push(v["seen"]["n"].as_u64().unwrap());
    }
    out
}

pub(crate) async fn wait_replies(host: &RunningHost, n: usize) {
    wait_for(T, &format!("{n} replies"), || async {
        (messages(host, "replies").await.len() >= n).then_some(())
    })
    .await;
}

pub(crate) async fn get(host: &RunningHost, key: i64) -> StoredMessage {
    host.store.get(key).await.unwrap().unwrap()
}

pub(crate) async fn put(host: &RunningHost, m: NewMessage) -> i64 {
    host.router.enqueue("orders", m).await.unwrap().key
}

pub(crate) const SESSIONS: usize = 100;
pub(crate) const PER_SESSION: usize = 5;

/// Every session's messages one after the other; the first of each is slow, so a later one
/// would overtake it if a session let two run at once.
pub(crate) fn workload() -> Vec<NewMessage> {
    let mut batch = Vec::new();
    for s in 0..SESSIONS {
        for n in 0..PER_SESSION {
            let slow = if n == 0 {
                json!({"sleep_ms": 30})
            } else {
                json!({})
            };
            batch.push(event(&format!("s{s}"), n, slow));
        }
    }
    batch
}

pub(crate) fn assert_in_order(order: &BTreeMap<String, Vec<u64>>) {
    assert_eq!(order.len(), SESSIONS);
    for (session, seen) in order {
        assert_eq!(
            *seen,
            (0..PER_SESSION as u64).collect::<Vec<_>>(),
            "session {session} ran in enqueue order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_runs_in_order_under_concurrency_32() {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let host = start(&dir, &inbox, 32).await;
    host.router
        .enqueue_many("orders", workload())
        .await
        .unwrap();
    wait_replies(&host, SESSIONS * PER_SESSION).await;
    assert_in_order(&order_per_session(&host).await);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_never_run_two_messages_of_a_session_at_once() {
    let schema = PgSchema::new();
    let (a, b) = (TestDir::new(), TestDir::new());
    for dir in [&a, &b] {
        dir.deploy("flaky", "flaky");
    }
    let q = queues(16).replace("inbox = { store = \"memory\" }", "");
    let first = a.start_postgres(&schema, "20ms", &q).await;
    let second = b.start_postgres(&schema, "20ms", &q).await;
    // Watch the database while both hosts work: a session with two messages processing at
    // once breaks the rule.
    let pool = sqlx::PgPool::connect(&database_url()).await.unwrap();
    let doubled_sql = format!(
        "SELECT session_key, COUNT(*) FROM \"{}\".messages WHERE status = 'processing'
         AND session_key IS NOT NULL GROUP BY session_key HAVING COUNT(*) > 1",
        schema.name
    );
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (pool, watching) = (pool.clone(), watching.clone());
        tokio::spawn(async move {
            let mut samples = 0u32;
            while watching.load(Ordering::SeqCst) {
                let doubled: Vec<(String, i64)> =
                    sqlx::query_as(sqlx::AssertSqlSafe(doubled_sql.clone()))
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                assert!(doubled.is_empty(), "in flight together: {doubled:?}");
                samples += 1;
            }
            samples
        })
    };
    first
        .router
        .enqueue_many("orders", workload())
        .await
        .unwrap();
    wait_replies(&first, SESSIONS * PER_SESSION).await;
    watching.store(false, Ordering::SeqCst);
    let samples = watcher.await.unwrap();
    assert!(samples > 10, "the watcher looked {samples} times");
    assert_in_order(&order_per_session(&first).await);
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_parks_its_session_and_a_successful_retry_drains_it() {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let host = start(&dir, &inbox, 8).await;
    let a1 = put(&host, event("a", 1, json!({}))).await;
    let a2 = put(&host, event("a", 2, json!({"permanent": "card expired"}))).await;
    let a3 = put(&host, event("a", 3, json!({}))).await;
    let a4 = put(&host, event("a", 4, json!({}))).await;
    let b1 = put(&host, event("b", 1, json!({}))).await;
    let failed = wait_status(&host, a2, Status::Failed, T).await;
    wait_status(&host, b1, Status::Processed, T).await;
    assert_eq!(get(&host, a1).await.status, Status::Processed);
    for key in [a3, a4] {
        wait_status(&host, key, Status::Parked, T).await;
    }
    let (ok, out, err) = dir.wharf(&["sessions", "list"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("orders") && out.contains("card expired"),
        "{out}"
    );
    let (ok, out, _) = dir.wharf(&["--json", "sessions", "list", "--queue", "orders"]);
    assert!(ok);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["session"], "a");
    assert_eq!(listed[0]["parked"], 2);
    assert_eq!(
        listed[0]["blocked_by_delivery_id"],
        failed.delivery_id.as_str()
    );
    let (ok, out, _) = dir.wharf(&["--json", "messages", "list", "--session", "a"]);
    assert!(ok);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.len(), 4, "only session a: {out}");

    // The operator fixes the cause and retries: the retry runs alone, then the rest drains.
    set_payload(
        &dir,
        a2,
        &json!({"s": "a", "n": 2, "reply_to": "replies"}).to_string(),
    )
    .await;
    let (ok, _, err) = dir.wharf(&["messages", "retry", &a2.to_string()]);
    assert!(ok, "{err}");
    wait_status(&host, a4, Status::Processed, T).await;
    let order = order_per_session(&host).await;
    assert_eq!(order["a"], [1, 2, 3, 4]);
    // The resubmission recorded the blocker's delivery first, then its own.
    let done = get(&host, a2).await;
    for delivery in [&failed.delivery_id, &done.delivery_id] {
        let key = InboxKey::new("orders", delivery).unwrap();
        assert!(inbox.inner.is_processed(&key).await.unwrap(), "{delivery}");
    }
    let (_, out, _) = dir.wharf(&["sessions", "list"]);
    assert!(out.contains("no blocked sessions"), "{out}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_blocks_until_completed_and_is_not_recorded() {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let host = start(&dir, &inbox, 8).await;
    let a1 = put(&host, event("a", 1, json!({"handoff": true}))).await;
    let a2 = put(&host, event("a", 2, json!({}))).await;
    let handed = wait_status(&host, a1, Status::HandedOff, T).await;
    wait_status(&host, a2, Status::Parked, T).await;
    let key = InboxKey::new("orders", &handed.delivery_id).unwrap();
    assert!(
        !inbox.inner.is_processed(&key).await.unwrap(),
        "a handoff records nothing"
    );
    let (ok, _, err) = dir.wharf(&["messages", "complete", &a2.to_string()]);
    assert!(
        !ok && err.contains("is not handed-off (it is parked)"),
        "{err}"
    );
    let (ok, _, err) = dir.wharf(&["messages", "complete", &a1.to_string()]);
    assert!(ok, "{err}");
    wait_status(&host, a2, Status::Processed, T).await;
    assert_eq!(get(&host, a1).await.status, Status::Processed);
    host.shutdown().await;
}

pub(crate) async fn set_payload(dir: &TestDir, key: i64, payload: &str) {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path("wharf.db").display()))
        .await
        .unwrap();
    sqlx::query("UPDATE messages SET payload = ?1 WHERE key = ?2")
        .bind(payload)
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
}

//! The consumer inbox in the dispatch loop: check → guest → record, duplicates skipped and
//! counted, failures never recorded, store failures transient, bypass rules.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::inbox::{InboxError, InboxKey, InboxStore, MemoryInbox};
use wharf_host::queue::{NewMessage, QueueStore, Status};
use wharf_host::{Config, RunningHost, StartOptions};
use wharf_tests::{TestDir, messages, msg, wait_for, wait_status};

const T: Duration = Duration::from_secs(30);

/// A real (in-memory) store that logs calls and can be made to fail, and checks at each
/// call whether the guest has run yet (its reply exists).
#[derive(Default)]
struct Spy {
    inner: MemoryInbox,
    log: Mutex<Vec<String>>,
    checks: AtomicUsize,
    records: AtomicUsize,
    fail_check: AtomicBool,
    fail_record: AtomicBool,
    store: Mutex<Option<Arc<dyn QueueStore>>>,
}

impl Spy {
    async fn replies(&self) -> usize {
        let store = self.store.lock().unwrap().clone();
        match store {
            Some(s) => s
                .counts("replies")
                .await
                .unwrap()
                .iter()
                .map(|(_, n)| *n as usize)
                .sum(),
            None => 0,
        }
    }
}

#[async_trait]
impl InboxStore for Spy {
    async fn is_processed(&self, key: &InboxKey) -> Result<bool, InboxError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        let replies = self.replies().await;
        self.log
            .lock()
            .unwrap()
            .push(format!("check {} (replies: {replies})", key.endpoint));
        if self.fail_check.load(Ordering::SeqCst) {
            return Err(InboxError::Setup("injected check failure".into()));
        }
        self.inner.is_processed(key).await
    }
    async fn record(&self, key: &InboxKey, retention_ms: i64) -> Result<(), InboxError> {
        self.records.fetch_add(1, Ordering::SeqCst);
        let replies = self.replies().await;
        self.log
            .lock()
            .unwrap()
            .push(format!("record {} (replies: {replies})", key.endpoint));
        if self.fail_record.load(Ordering::SeqCst) {
            return Err(InboxError::Setup("injected record failure".into()));
        }
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

const QUEUES: &str = r#"
[queues.work]
handler = "flaky"
endpoint = "billing"
max_attempts = 3
backoff = "10ms"
max_backoff = "20ms"
inbox = { store = "memory" }

[queues.other]
handler = "flaky"
endpoint = "shipping"
inbox = { store = "memory" }

[queues.replies]
handler = "not-deployed"
"#;

async fn start(dir: &TestDir, spy: &Arc<Spy>) -> RunningHost {
    dir.deploy("flaky", "flaky");
    let config = Config::load(&dir.write_config(QUEUES)).unwrap();
    let options = StartOptions {
        inbox_store: Some(spy.clone()),
    };
    let host = wharf_host::start_with(config, options).await.unwrap();
    *spy.store.lock().unwrap() = Some(host.store.clone());
    host
}

/// Make a processed message run again with the same delivery id, as after a lost completion.
async fn redeliver(host: &RunningHost, key: i64) {
    assert!(host.store.move_to(key, &Status::Pending).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_guest_then_record_and_a_redelivery_is_skipped() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let host = start(&dir, &spy).await;
    let m = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 1})))
        .await
        .unwrap();
    let first = wait_status(&host, m.key, Status::Processed, T).await;
    assert_eq!(first.outcome.as_deref(), Some("completed"));
    // An inbox outside the queue database is recorded right after the settlement is applied,
    // so the message can be seen processed a moment before its record.
    wait_for(T, "the inbox record", || async {
        (spy.log.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    assert_eq!(
        *spy.log.lock().unwrap(),
        vec![
            "check billing (replies: 0)".to_string(),
            "record billing (replies: 1)".to_string()
        ],
        "check before the guest ran, record after it"
    );
    assert_eq!(
        (
            spy.checks.load(Ordering::SeqCst),
            spy.records.load(Ordering::SeqCst)
        ),
        (1, 1),
        "one check and one record per fresh delivery"
    );

    redeliver(&host, m.key).await;
    let again = wait_for(T, "the redelivery to be settled", || async {
        host.store
            .get(m.key)
            .await
            .unwrap()
            .filter(|m| m.outcome.as_deref() == Some("skipped: duplicate"))
    })
    .await;
    assert_eq!(again.status, Status::Processed);
    assert_eq!(
        messages(&host, "replies").await.len(),
        1,
        "the guest did not run again"
    );
    assert_eq!(
        spy.records.load(Ordering::SeqCst),
        1,
        "a duplicate records nothing"
    );
    let metrics = wharf_host::metrics::render();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("wharf_inbox_duplicates_total"))
        .expect("duplicate counter");
    assert_eq!(
        line, r#"wharf_inbox_duplicates_total{endpoint="billing",queue="work",storage="sql"} 1"#,
        "bounded labels only"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_not_recorded_and_its_redelivery_runs() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let host = start(&dir, &spy).await;
    let m = host
        .router
        .enqueue(
            "work",
            msg(json!({"transient_until": 2, "reply_to": "replies"})),
        )
        .await
        .unwrap();
    let done = wait_status(&host, m.key, Status::Processed, T).await;
    assert_eq!(done.attempts, 2);
    assert_eq!(spy.checks.load(Ordering::SeqCst), 2, "each attempt checks");
    assert_eq!(
        spy.records.load(Ordering::SeqCst),
        1,
        "only the successful attempt records"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_handoff_is_not_recorded_and_runs_again_on_redelivery() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let host = start(&dir, &spy).await;
    let m = host
        .router
        .enqueue("work", msg(json!({"handoff": true, "reply_to": "replies"})))
        .await
        .unwrap();
    let done = wait_status(&host, m.key, Status::Processed, T).await;
    assert_eq!(done.outcome.as_deref(), Some("pending-handoff"));
    assert_eq!(spy.records.load(Ordering::SeqCst), 0);
    redeliver(&host, m.key).await;
    wait_for(T, "the handler to run again", || async {
        (messages(&host, "replies").await.len() == 2).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_is_transient_never_a_duplicate() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    spy.fail_check.store(true, Ordering::SeqCst);
    let host = start(&dir, &spy).await;
    let m = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies"})))
        .await
        .unwrap();
    wait_for(T, "a failed check", || async {
        host.store.get(m.key).await.unwrap().filter(|m| {
            m.last_error
                .as_deref()
                .is_some_and(|e| e.contains("inbox check failed"))
        })
    })
    .await;
    assert!(
        messages(&host, "replies").await.is_empty(),
        "the guest did not run"
    );
    spy.fail_check.store(false, Ordering::SeqCst);
    let done = wait_status(&host, m.key, Status::Processed, T).await;
    assert_eq!(
        done.outcome.as_deref(),
        Some("completed"),
        "retried and run, not skipped"
    );
    assert_eq!(messages(&host, "replies").await.len(), 1);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_record_after_the_guest_is_transient() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    spy.fail_record.store(true, Ordering::SeqCst);
    let host = start(&dir, &spy).await;
    // No follow-ups: the record comes before the settlement, so its failure fails the attempt.
    let m = host.router.enqueue("work", msg(json!({}))).await.unwrap();
    wait_for(T, "a failed record", || async {
        host.store.get(m.key).await.unwrap().filter(|m| {
            m.last_error
                .as_deref()
                .is_some_and(|e| e.contains("inbox record failed"))
        })
    })
    .await;
    spy.fail_record.store(false, Ordering::SeqCst);
    let done = wait_status(&host, m.key, Status::Processed, T).await;
    assert!(
        done.attempts >= 2,
        "the attempt whose record failed was retried"
    );
    assert_eq!(spy.records.load(Ordering::SeqCst) as u32, done.attempts);
    host.shutdown().await;
}

/// With follow-ups, an inbox outside the queue database is recorded after the settlement
/// that commits them: a failing record cannot run the handler again (its follow-ups would be
/// sent twice); the message stays processed, its follow-up sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_follow_ups_the_record_follows_the_settlement() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    spy.fail_record.store(true, Ordering::SeqCst);
    let host = start(&dir, &spy).await;
    let m = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies"})))
        .await
        .unwrap();
    wait_for(T, "the record after the settlement", || async {
        (spy.records.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let done = wait_status(&host, m.key, Status::Processed, T).await;
    assert_eq!(done.attempts, 1);
    assert_eq!(messages(&host, "replies").await.len(), 1);
    let log = spy.log.lock().unwrap().clone();
    assert!(
        log.iter().any(|line| line.ends_with("(replies: 1)")),
        "recorded once the follow-up was committed: {log:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ids_bypass_the_inbox_and_512_uses_it() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    // Enqueue while no handler serves the queue, then give the messages external-size ids.
    let config = Config::load(&dir.write_config(QUEUES)).unwrap();
    let host = wharf_host::start_with(
        config,
        StartOptions {
            inbox_store: Some(spy.clone()),
        },
    )
    .await
    .unwrap();
    *spy.store.lock().unwrap() = Some(host.store.clone());
    let long = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 513})))
        .await
        .unwrap();
    let ok = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 512})))
        .await
        .unwrap();
    set_delivery_id(&dir, long.key, &"x".repeat(513)).await;
    set_delivery_id(&dir, ok.key, &"y".repeat(512)).await;
    dir.deploy("flaky", "flaky");
    wait_status(&host, long.key, Status::Processed, T).await;
    wait_status(&host, ok.key, Status::Processed, T).await;
    assert_eq!(messages(&host, "replies").await.len(), 2, "both ran");
    assert_eq!(
        spy.checks.load(Ordering::SeqCst),
        1,
        "only the 512-character id was checked"
    );
    assert_eq!(spy.records.load(Ordering::SeqCst), 1, "and recorded");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_endpoints_sharing_a_store_each_run_the_same_delivery() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let config = Config::load(&dir.write_config(QUEUES)).unwrap();
    let host = wharf_host::start_with(
        config,
        StartOptions {
            inbox_store: Some(spy.clone()),
        },
    )
    .await
    .unwrap();
    *spy.store.lock().unwrap() = Some(host.store.clone());
    let a = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 1})))
        .await
        .unwrap();
    let b = host
        .router
        .enqueue("other", msg(json!({"reply_to": "replies", "n": 2})))
        .await
        .unwrap();
    set_delivery_id(&dir, a.key, "same-message-id").await;
    set_delivery_id(&dir, b.key, "same-message-id").await;
    dir.deploy("flaky", "flaky");
    for key in [a.key, b.key] {
        let m = wait_status(&host, key, Status::Processed, T).await;
        assert_eq!(
            m.outcome.as_deref(),
            Some("completed"),
            "not skipped by the other endpoint's record"
        );
    }
    assert_eq!(messages(&host, "replies").await.len(), 2);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resubmission_records_the_source_delivery_too() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let host = start(&dir, &spy).await;
    let m = host
        .router
        .enqueue(
            "work",
            msg(json!({"permanent": "bad data", "reply_to": "replies"})),
        )
        .await
        .unwrap();
    let failed = wait_status(&host, m.key, Status::Failed, T).await;
    // The operator fixes the cause and resubmits; simulate the fix by replacing the payload
    // in place so the delivery keeps its identity chain.
    set_payload(&dir, m.key, r#"{"reply_to":"replies"}"#).await;
    assert_eq!(
        host.store
            .retry(&wharf_host::queue::Selector::Key(m.key))
            .await
            .unwrap(),
        1
    );
    let done = wait_status(&host, m.key, Status::Processed, T).await;
    assert_eq!(
        done.source_delivery_id.as_deref(),
        Some(failed.delivery_id.as_str())
    );
    // With a follow-up, an inbox outside the queue database is recorded after the settlement.
    wait_for(T, "the records after the settlement", || async {
        (spy.records.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert_eq!(
        spy.records.load(Ordering::SeqCst),
        2,
        "the source id, then its own"
    );
    // A late redelivery of the original delivery is now a duplicate.
    assert!(
        spy.inner
            .is_processed(&InboxKey::new("billing", &failed.delivery_id).unwrap())
            .await
            .unwrap()
    );
    host.shutdown().await;
}

async fn sqlite(dir: &TestDir) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path("wharf.db").display()))
        .await
        .unwrap()
}

async fn set_delivery_id(dir: &TestDir, key: i64, id: &str) {
    sqlx::query("UPDATE messages SET delivery_id = ?1 WHERE key = ?2")
        .bind(id)
        .bind(key)
        .execute(&sqlite(dir).await)
        .await
        .unwrap();
}

async fn set_payload(dir: &TestDir, key: i64, payload: &str) {
    sqlx::query("UPDATE messages SET payload = ?1 WHERE key = ?2")
        .bind(payload)
        .bind(key)
        .execute(&sqlite(dir).await)
        .await
        .unwrap();
}

/// The 512-character rule is about the inbox key: an external queue keys on the envelope's
/// MessageId, so a longer one bypasses the inbox; a SQL queue keys on the delivery id it
/// assigns, so a long message id uses the inbox like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_600_character_id_bypasses_only_an_external_queues_inbox() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let host = start_with_redis(&dir, &spy, &wharf_tests::unique_prefix("inbox")).await;
    let long = |n: i64| NewMessage {
        id: Some("z".repeat(600)),
        ..msg(json!({"reply_to": "replies", "n": n}))
    };
    let sql = host.router.enqueue("work", long(1)).await.unwrap();
    wait_status(&host, sql.key, Status::Processed, T).await;
    assert_eq!(
        (
            spy.checks.load(Ordering::SeqCst),
            spy.records.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the SQL queue checked and recorded its delivery id"
    );
    host.router.enqueue("ext", long(2)).await.unwrap();
    wait_for(T, "the external message's reply", || async {
        (messages(&host, "replies").await.len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        (
            spy.checks.load(Ordering::SeqCst),
            spy.records.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the external message ran without the inbox"
    );
    host.shutdown().await;
}

/// [`QUEUES`] and `ext`, an external queue on Redis under `prefix` with one attempt.
async fn start_with_redis(dir: &TestDir, spy: &Arc<Spy>, prefix: &str) -> RunningHost {
    dir.deploy("flaky", "flaky");
    let queues = format!(
        r#"{QUEUES}
[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"

[queues.ext]
handler = "flaky"
storage = "external"
provider = "main"
endpoint = "ext"
max_attempts = 1
inbox = {{ store = "memory" }}
"#,
        url = wharf_tests::redis_url(),
    );
    let config = Config::load(&dir.write_config(&queues)).unwrap();
    let options = StartOptions {
        inbox_store: Some(spy.clone()),
    };
    let host = wharf_host::start_with(config, options).await.unwrap();
    *spy.store.lock().unwrap() = Some(host.store.clone());
    host
}

/// A message that succeeded on its last attempt and whose settlement was lost comes back
/// with no attempts left: the inbox knows it, so it is skipped as a duplicate, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_past_its_last_attempt_that_already_succeeded_is_skipped() {
    let (dir, spy) = (TestDir::new(), Arc::new(Spy::default()));
    let prefix = wharf_tests::unique_prefix("inbox");
    let host = start_with_redis(&dir, &spy, &prefix).await;
    // Its one attempt ran and was recorded; the broker delivers it once more.
    let id = "order-7";
    spy.inner
        .record(&InboxKey::new("ext", id).unwrap(), 3_600_000)
        .await
        .unwrap();
    let envelope = wharf_host::external::Envelope::new(
        json!({"reply_to": "replies", "n": 7}).to_string(),
        Some(id.to_string()),
        0,
    )
    .to_json();
    let keys = wharf_host::external::redis::Keys::new(&prefix, "ext");
    let mut redis = redis::Client::open(wharf_tests::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&keys.attempts)
        .arg(&envelope)
        .arg(1)
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: i64 = redis::Script::new(wharf_host::external::redis::DIRECT_PRODUCER)
        .key(&keys.ready)
        .key(&keys.readiness)
        .arg(0)
        .arg(&envelope)
        .arg("ext")
        .invoke_async(&mut redis)
        .await
        .unwrap();
    wait_for(T, "the redelivery to be settled", || async {
        let leased: u64 = redis::cmd("ZCARD")
            .arg(&keys.leases)
            .query_async(&mut redis.clone())
            .await
            .unwrap();
        let ready: u64 = redis::cmd("ZCARD")
            .arg(&keys.ready)
            .query_async(&mut redis.clone())
            .await
            .unwrap();
        (spy.checks.load(Ordering::SeqCst) == 1 && leased + ready == 0).then_some(())
    })
    .await;
    assert!(
        messages(&host, "ext").await.is_empty(),
        "not moved into the SQL queue as failed"
    );
    assert!(
        messages(&host, "replies").await.is_empty(),
        "the handler did not run"
    );
    let metrics = wharf_host::metrics::render();
    assert!(
        metrics.contains(
            r#"wharf_inbox_duplicates_total{endpoint="ext",queue="ext",storage="redis"} 1"#
        ),
        "{metrics}"
    );
    host.shutdown().await;
}

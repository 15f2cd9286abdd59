//! A handler's follow-ups are staged during its call and committed with its outcome: they
//! exist if and only if the attempt that made them succeeded, exactly once. Checked on
//! SQLite and PostgreSQL with a SQL source and a SQL target; the broker sources are in the
//! conformance suite.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{Db, PgSchema, TestDir, messages, msg, replies_by_n, wait_status};

const T: Duration = Duration::from_secs(30);

const QUEUES: &str = r#"
[queues.work]
handler = "flaky"
max_attempts = 4
backoff = "10ms"
max_backoff = "20ms"

[queues.once]
handler = "flaky"
max_attempts = 1
timeout = "300ms"

[queues.ordered]
handler = "flaky"
sessions = true
concurrency = 8

[queues.replies]
handler = "not-deployed"
"#;

/// A host on `db` with the `flaky` guest deployed.
async fn start(db: Db) -> (TestDir, Option<PgSchema>, RunningHost) {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let (schema, host) = dir.start_on(db, QUEUES).await;
    (dir, schema, host)
}

async fn enqueue(host: &RunningHost, queue: &str, payload: serde_json::Value) -> i64 {
    host.router.enqueue(queue, msg(payload)).await.unwrap().key
}

async fn only_the_attempt_that_succeeded_sends_its_follow_ups(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let first = json!({"reply_to": "replies", "reply_first": true});
    let with = |extra: serde_json::Value| {
        let mut payload = first.clone();
        payload
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        payload
    };
    let retried = enqueue(&host, "work", with(json!({"n": 1, "transient_until": 3}))).await;
    let permanent = enqueue(&host, "work", with(json!({"n": 2, "permanent": "bad"}))).await;
    let trapped = enqueue(&host, "once", with(json!({"n": 3, "trap": true}))).await;
    let timed_out = enqueue(&host, "once", with(json!({"n": 4, "sleep_ms": 2000}))).await;
    let later = enqueue(&host, "work", with(json!({"n": 5, "retry_after_ms": 10}))).await;
    let handed = enqueue(&host, "work", with(json!({"n": 6, "handoff": true}))).await;

    let m = wait_status(&host, retried, Status::Processed, T).await;
    assert_eq!(m.attempts, 3);
    for (key, error) in [
        (permanent, "permanent error: bad"),
        (trapped, "handler trapped"),
        (timed_out, "timed out"),
    ] {
        let m = wait_status(&host, key, Status::Failed, T).await;
        let last = m.last_error.unwrap_or_default();
        assert!(last.contains(error), "{last}");
    }
    assert_eq!(
        wait_status(&host, later, Status::Processed, T)
            .await
            .attempts,
        2
    );
    wait_status(&host, handed, Status::Processed, T).await;

    // Every source message is settled, and follow-ups are written with the settlement:
    // what is here now is all there will be.
    let replies = replies_by_n(&host).await;
    let expected = BTreeMap::from([(1, vec![3]), (5, vec![2]), (6, vec![1])]);
    assert_eq!(
        replies, expected,
        "one follow-up, from the attempt that succeeded"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_attempt_that_succeeded_sends_its_follow_ups_on_sqlite() {
    only_the_attempt_that_succeeded_sends_its_follow_ups(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_attempt_that_succeeded_sends_its_follow_ups_on_postgres() {
    only_the_attempt_that_succeeded_sends_its_follow_ups(Db::Postgres).await
}

async fn a_call_stages_at_most_the_limit(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let max = wharf_host::dispatch::MAX_FOLLOW_UPS as i64;
    let at_limit = enqueue(
        &host,
        "once",
        json!({"reply_to": "replies", "n": 1, "fan_out": max}),
    )
    .await;
    let over = json!({"reply_to": "replies", "n": 2, "fan_out": max + 1});
    let over = enqueue(&host, "once", over).await;
    wait_status(&host, at_limit, Status::Processed, T).await;
    let failed = wait_status(&host, over, Status::Failed, T).await;
    let error = failed.last_error.unwrap_or_default();
    assert!(
        error.contains(&format!("at most {max} follow-up messages")),
        "{error}"
    );
    let replies = replies_by_n(&host).await;
    assert_eq!(replies.get(&1).map(Vec::len), Some(max as usize));
    assert_eq!(replies.get(&2), None, "nothing of the call over the limit");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stages_at_most_the_limit_on_sqlite() {
    a_call_stages_at_most_the_limit(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stages_at_most_the_limit_on_postgres() {
    a_call_stages_at_most_the_limit(Db::Postgres).await
}

/// The explicit opt-out: a follow-up sent with `wharf.send-now` goes out at once, so it
/// exists even though the handler then failed, and the host removes the header.
async fn a_send_now_follow_up_goes_out_whatever_the_outcome(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let payload = json!({"reply_to": "replies", "reply_first": true, "send_now": true, "n": 1, "permanent": "bad"});
    let failed = enqueue(&host, "work", payload).await;
    wait_status(&host, failed, Status::Failed, T).await;
    let replies = messages(&host, "replies").await;
    assert_eq!(replies.len(), 1, "sent before the handler failed");
    assert!(
        replies[0]
            .headers
            .iter()
            .all(|(name, _)| name != "wharf.send-now"),
        "{:?}",
        replies[0].headers
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_now_follow_up_goes_out_whatever_the_outcome_on_sqlite() {
    a_send_now_follow_up_goes_out_whatever_the_outcome(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_now_follow_up_goes_out_whatever_the_outcome_on_postgres() {
    a_send_now_follow_up_goes_out_whatever_the_outcome(Db::Postgres).await
}

/// The follow-ups of one session's messages are committed in the session's order: one
/// message of a session settles at a time, each with its follow-ups.
async fn a_sessions_follow_ups_keep_its_order(db: Db) {
    let (_dir, _schema, host) = start(db).await;
    let sessions = ["a", "b", "c"];
    let mut keys = Vec::new();
    for n in 0..30_i64 {
        let session = sessions[n as usize % 3];
        // Earlier messages take longer: without sessions they would finish out of order.
        let payload =
            json!({"reply_to": "replies", "n": n, "s": session, "sleep_ms": (30 - n) % 7 * 3});
        let mut message = msg(payload);
        message.session = Some(session.to_string());
        keys.push(host.router.enqueue("ordered", message).await.unwrap().key);
    }
    for key in keys {
        wait_status(&host, key, Status::Processed, T).await;
    }
    let mut replies = messages(&host, "replies").await;
    replies.sort_by_key(|m| m.key);
    let mut by_session: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for m in replies {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        let session = v["seen"]["s"].as_str().unwrap().to_string();
        by_session
            .entry(session)
            .or_default()
            .push(v["seen"]["n"].as_i64().unwrap());
    }
    for (i, session) in sessions.iter().enumerate() {
        let expected: Vec<i64> = (0..30).filter(|n| n % 3 == i as i64).collect();
        assert_eq!(
            by_session[*session], expected,
            "session `{session}` in order"
        );
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_follow_ups_keep_its_order_on_sqlite() {
    a_sessions_follow_ups_keep_its_order(Db::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_follow_ups_keep_its_order_on_postgres() {
    a_sessions_follow_ups_keep_its_order(Db::Postgres).await
}

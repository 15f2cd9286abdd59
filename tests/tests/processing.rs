//! Messages flow from enqueue through a guest to their final status on SQLite. The outcome
//! cases run against the same fixture written in Rust, JavaScript and Python.

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{NewMessage, Status};
use wharf_tests::{Lang, TestDir, count, messages, msg, wait_for, wait_status};

const T: Duration = Duration::from_secs(20);

const FLAKY: &str = r#"
[queues.work]
handler = "flaky"
max_attempts = 4
backoff = "10ms"
max_backoff = "50ms"

[queues.replies]
handler = "not-deployed"
"#;

async fn enqueued_message_is_processed_by_the_guest(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("flaky", lang, "flaky");
    let host = dir.start(FLAKY).await;
    let done = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "order": 7})))
        .await
        .unwrap();
    let m = wait_status(&host, done.key, Status::Processed, T).await;
    assert_eq!(m.attempts, 1);
    assert!(m.processed_at_ms.is_some());
    assert!(m.last_error.is_none());
    // The guest saw the payload exactly as enqueued.
    let replies = wait_for(T, "the reply", || async {
        let r = messages(&host, "replies").await;
        (!r.is_empty()).then_some(r)
    })
    .await;
    let reply: serde_json::Value = serde_json::from_str(&replies[0].payload).unwrap();
    assert_eq!(reply["seen"], json!({"reply_to": "replies", "order": 7}));
    assert_eq!(reply["attempt"], 1);
    // It also saw when the message was enqueued, and its (empty) headers.
    let enqueued_at = reply["enqueued_at_ms"].as_i64().unwrap();
    assert!(
        enqueued_at > 0 && enqueued_at <= m.processed_at_ms.unwrap(),
        "{reply}"
    );
    assert_eq!(reply["headers"], json!([]));
    host.shutdown().await;
}

async fn transient_errors_are_retried_then_succeed(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("flaky", lang, "flaky");
    let host = dir.start(FLAKY).await;
    let done = host
        .router
        .enqueue("work", msg(json!({"transient_until": 3})))
        .await
        .unwrap();
    let m = wait_status(&host, done.key, Status::Processed, T).await;
    assert_eq!(m.attempts, 3, "two failed attempts, then success");
    // The last error of the failed attempts is kept for inspection.
    assert_eq!(
        m.last_error.as_deref(),
        Some("transient error: not yet: attempt 2 of 3")
    );
    host.shutdown().await;
}

async fn transient_errors_fail_after_max_attempts(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("flaky", lang, "flaky");
    let host = dir.start(FLAKY).await;
    let done = host
        .router
        .enqueue("work", msg(json!({"transient_until": 100})))
        .await
        .unwrap();
    let m = wait_status(&host, done.key, Status::Failed, T).await;
    assert_eq!(m.attempts, 4);
    let error = m.last_error.unwrap();
    assert!(
        error.contains("not yet: attempt 4 of 100") && error.contains("no attempts left"),
        "{error}"
    );
    host.shutdown().await;
}

async fn permanent_error_fails_at_once_with_its_text(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("flaky", lang, "flaky");
    let host = dir.start(FLAKY).await;
    let done = host
        .router
        .enqueue("work", msg(json!({"permanent": "sku 42 does not exist"})))
        .await
        .unwrap();
    let m = wait_status(&host, done.key, Status::Failed, T).await;
    assert_eq!(m.attempts, 1);
    assert_eq!(
        m.last_error.as_deref(),
        Some("permanent error: sku 42 does not exist")
    );
    host.shutdown().await;
}

async fn retry_after_runs_the_message_again_later(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("flaky", lang, "flaky");
    let host = dir.start(FLAKY).await;
    let done = host
        .router
        .enqueue("work", msg(json!({"retry_after_ms": 300})))
        .await
        .unwrap();
    let slept = wait_status(&host, done.key, Status::Sleeping, T).await;
    assert!(
        slept.process_at_ms >= slept.created_at_ms + 300,
        "scheduled ~300 ms later"
    );
    let m = wait_status(&host, done.key, Status::Processed, T).await;
    assert_eq!(m.attempts, 2);
    assert!(m.processed_at_ms.unwrap() >= slept.process_at_ms);
    host.shutdown().await;
}

async fn a_refused_enqueue_reaches_the_guest_with_its_reason(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("flaky", lang, "flaky");
    let host = dir.start(FLAKY).await;
    let done = host
        .router
        .enqueue("work", msg(json!({"reply_to": "nope"})))
        .await
        .unwrap();
    let m = wait_status(&host, done.key, Status::Failed, T).await;
    let error = m.last_error.unwrap();
    assert!(
        error.starts_with("transient error:") && error.contains("unknown queue `nope`"),
        "{error}"
    );
    host.shutdown().await;
}

/// The outcome cases, once per language.
macro_rules! in_every_language {
    ($($case:ident),* $(,)?) => {
        mod rust {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(wharf_tests::Lang::Rust).await })*
        }
        mod js {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(wharf_tests::Lang::Js).await })*
        }
        mod python {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(wharf_tests::Lang::Python).await })*
        }
    };
}

in_every_language!(
    enqueued_message_is_processed_by_the_guest,
    transient_errors_are_retried_then_succeed,
    transient_errors_fail_after_max_attempts,
    permanent_error_fails_at_once_with_its_text,
    retry_after_runs_the_message_again_later,
    follow_up_enqueued_by_a_guest_lands_in_its_queue,
    a_refused_enqueue_reaches_the_guest_with_its_reason,
);

async fn follow_up_enqueued_by_a_guest_lands_in_its_queue(lang: Lang) {
    let dir = TestDir::new();
    dir.deploy_in("order-export", lang, "order-export");
    let host = dir
        .start("[queues.orders]\nhandler = \"order-export\"\n\n[queues.notifications]\nhandler = \"not-deployed\"\n")
        .await;
    let order = json!({"order_id": "A-17", "customer": "Ada", "total_cents": 1999});
    let done = host.router.enqueue("orders", msg(order)).await.unwrap();
    wait_status(&host, done.key, Status::Processed, T).await;
    let notes = messages(&host, "notifications").await;
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].status, Status::Pending);
    let note: serde_json::Value = serde_json::from_str(&notes[0].payload).unwrap();
    assert_eq!(note["order_id"], "A-17");
    assert!(
        note["exported_by"]
            .as_str()
            .unwrap()
            .starts_with("order-export v1"),
        "{note}"
    );
    // An order with a zero total fails at once, with the handler's words.
    let empty = json!({"order_id": "A-0", "customer": "Ada", "total_cents": 0});
    let failed = host.router.enqueue("orders", msg(empty)).await.unwrap();
    let m = wait_status(&host, failed.key, Status::Failed, T).await;
    assert_eq!(
        (m.attempts, m.last_error.as_deref()),
        (1, Some("permanent error: order A-0 has a zero total"))
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_runs_first_and_delayed_messages_wait() {
    let dir = TestDir::new();
    let host = dir
        .start("[queues.work]\nhandler = \"flaky\"\nconcurrency = 1\n\n[queues.replies]\nhandler = \"not-deployed\"\n")
        .await;
    // Enqueue before the handler exists so that all are waiting together.
    for (n, priority) in [(1, 0), (2, 5), (3, 0), (4, 9)] {
        let m = NewMessage {
            priority,
            ..msg(json!({"reply_to": "replies", "n": n}))
        };
        host.router.enqueue("work", m).await.unwrap();
    }
    let delayed = NewMessage {
        process_at_ms: Some(wharf_host::queue::now_ms() + 1_000),
        ..msg(json!({"reply_to": "replies", "n": 5}))
    };
    let delayed = host.router.enqueue("work", delayed).await.unwrap();
    assert_eq!(
        host.store.get(delayed.key).await.unwrap().unwrap().status,
        Status::Sleeping
    );
    dir.deploy("flaky", "flaky");
    let order = wait_for(T, "five replies", || async {
        let r = messages(&host, "replies").await;
        (r.len() == 5).then_some(r)
    })
    .await;
    let seen: Vec<i64> = order
        .iter()
        .map(|m| {
            serde_json::from_str::<serde_json::Value>(&m.payload).unwrap()["seen"]["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        seen,
        vec![4, 2, 1, 3, 5],
        "priority order, then FIFO, the delayed one last"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_rejects_unknown_queue_and_invalid_json() {
    let dir = TestDir::new();
    let host = dir.start(FLAKY).await;
    let err = host
        .router
        .enqueue("nope", msg(json!({})))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown queue `nope`") && err.contains("replies, work"),
        "{err}"
    );
    let bad = NewMessage {
        payload: "{not json".into(),
        ..NewMessage::default()
    };
    let err = host
        .router
        .enqueue("work", bad)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not valid JSON"), "{err}");
    host.shutdown().await;
}

/// A queue whose handler proved fast leases its next batch while the current one runs, up to
/// its whole `batch` beyond what runs. With `concurrency = 1` a message is `processing` while
/// it runs (1), while its outcome waits for its write (at most 8 per unit of concurrency) and
/// while it waits leased ahead. The next batch is read once at most half a batch still waits
/// for the slot: so at times more than 9 + `batch`, never more than 9 + `batch` × 1.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_queue_leases_its_whole_batch_ahead_of_its_concurrency() {
    const BATCH: u64 = 40;
    const RUNNING_AND_SETTLING: u64 = 9;
    let dir = TestDir::new();
    dir.deploy("noop", "noop");
    let host = dir
        .start(&format!(
            "[queues.bulk]\nhandler = \"noop\"\nconcurrency = 1\nbatch = {BATCH}\n"
        ))
        .await;
    for chunk in 0..10 {
        let messages = (0..1_000)
            .map(|n| msg(json!({ "n": chunk * 1_000 + n })))
            .collect();
        host.router.enqueue_many("bulk", messages).await.unwrap();
    }
    // Sampled while the backlog drains: leased at once, the running one included. The next
    // batch is read while up to half a batch still waits for the slot, so more than one
    // batch is leased at times, never more than one and a half.
    let ahead = wharf_tests::poll_until(T, || async {
        let processing = count(&host, "bulk", Status::Processing).await;
        assert!(
            processing <= RUNNING_AND_SETTLING + BATCH / 2 + BATCH,
            "{processing} leased at once with concurrency 1 and batch {BATCH}"
        );
        (processing > RUNNING_AND_SETTLING + BATCH).then_some(processing)
    })
    .await;
    assert!(
        ahead.is_some(),
        "never more than {} leased at once: the queue did not read its next batch before \
         the last one had a slot",
        RUNNING_AND_SETTLING + BATCH
    );
    host.shutdown().await;
}

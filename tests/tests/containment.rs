//! A guest that traps (in Rust, JavaScript or Python), loops forever or allocates without
//! bound is contained: the attempt
//! fails transiently, the message is retried then failed, and other messages keep flowing.

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{Lang, TestDir, count, msg, wait_for, wait_status};

const T: Duration = Duration::from_secs(30);

fn config(handler: &str) -> String {
    format!(
        r#"
[handlers.memory-bomb]
memory = "16MiB"

[queues.bad]
handler = "{handler}"
max_attempts = 2
timeout = "300ms"
lease = "10s"
backoff = "10ms"
max_backoff = "20ms"

[queues.good]
handler = "noop"
concurrency = 4
"#
    )
}

async fn contained(handler: &str, expected_error: &str) {
    contained_in(Lang::Rust, handler, expected_error).await
}

async fn contained_in(lang: Lang, handler: &str, expected_error: &str) {
    let dir = TestDir::new();
    dir.deploy_in(handler, lang, handler);
    dir.deploy("noop", "noop");
    let host = dir.start(&config(handler)).await;
    let bad = host
        .router
        .enqueue("bad", msg(json!({"n": 1})))
        .await
        .unwrap();
    for n in 0..200 {
        host.router
            .enqueue("good", msg(json!({ "n": n })))
            .await
            .unwrap();
    }
    let failed = wait_status(&host, bad.key, Status::Failed, T).await;
    assert_eq!(failed.attempts, 2, "retried once, then failed");
    let error = failed.last_error.unwrap();
    assert!(
        error.contains(expected_error),
        "error `{error}` should mention `{expected_error}`"
    );
    wait_for(T, "all good messages processed", || async {
        (count(&host, "good", Status::Processed).await == 200).then_some(())
    })
    .await;
    // The host is still serving: a new message after the bad ones is processed.
    let after = host
        .router
        .enqueue("good", msg(json!({"n": "after"})))
        .await
        .unwrap();
    wait_status(&host, after.key, Status::Processed, T).await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trap_is_contained() {
    contained("trap", "handler trapped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_trap_is_contained() {
    contained_in(Lang::Js, "trap", "handler trapped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_trap_is_contained() {
    contained_in(Lang::Python, "trap", "handler trapped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_interrupted_by_the_timeout() {
    contained("spin", "handler timed out after 300ms").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_hits_the_memory_cap() {
    contained("memory-bomb", "exceeded its memory limit of 16.0 MiB").await;
}

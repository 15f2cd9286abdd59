//! The guides' code runs as written: the JavaScript guide's handler (its enqueue options
//! exactly as shown) is the fixture `sample-handlers/js/fixtures/guide.js`, built like every
//! fixture and run here in a host.

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{Lang, TestDir, messages, msg, wait_for, wait_status};

const T: Duration = Duration::from_secs(60);

/// The first ```js block after `## The code` in the JavaScript guide.
fn guide_code() -> String {
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk/javascript.md"),
    )
    .unwrap();
    let after = guide.split_once("## The code").expect("the section").1;
    let block = after.split_once("```js\n").expect("a js block").1;
    block
        .split_once("```")
        .expect("the block's end")
        .0
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_guides_handler_runs_as_written() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers/js/fixtures/guide.js");
    assert_eq!(
        std::fs::read_to_string(fixture).unwrap(),
        guide_code(),
        "the fixture is the guide's code, character for character"
    );
    let dir = TestDir::new();
    dir.deploy_in("orders", Lang::Js, "guide");
    let host = dir
        .start("[queues.orders]\nhandler = \"orders\"\n\n[queues.notifications]\n")
        .await;
    let ok = host
        .router
        .enqueue(
            "orders",
            msg(json!({"order_id": "o-1", "total_cents": 1250})),
        )
        .await
        .unwrap();
    wait_status(&host, ok.key, Status::Processed, T).await;
    let note = wait_for(T, "the notification", || async {
        messages(&host, "notifications").await.into_iter().next()
    })
    .await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&note.payload).unwrap(),
        json!({"order_id": "o-1"})
    );
    let zero = host
        .router
        .enqueue("orders", msg(json!({"order_id": "o-2", "total_cents": 0})))
        .await
        .unwrap();
    let failed = wait_status(&host, zero.key, Status::Failed, T).await;
    assert_eq!(
        failed.last_error.as_deref(),
        Some("permanent error: order o-2 has a zero total")
    );
    host.shutdown().await;
}

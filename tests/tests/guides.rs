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

/// The first ```LANG block after `## State` in `guide` (under `guest-sdk/`).
fn state_code(guide: &str, lang: &str) -> String {
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../guest-sdk")
            .join(guide),
    )
    .unwrap();
    let after = guide.split_once("## State").expect("the section").1;
    let block = after
        .split_once(&format!("```{lang}\n"))
        .expect("a code block")
        .1;
    block.split_once("```").expect("its end").0.to_string()
}

/// The state guide's handler in `lang`: a counter per customer and a saga per order, each
/// change committed with the message's outcome.
async fn the_state_guide_runs_as_written(
    lang: Lang,
    (fixture, built): (&str, &str),
    guide: &str,
    block: &str,
) {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-handlers")
        .join(fixture);
    assert_eq!(
        std::fs::read_to_string(source).unwrap(),
        state_code(guide, block),
        "the fixture is the guide's code, character for character"
    );
    let dir = TestDir::new();
    dir.deploy_in("orders", lang, built);
    let host = dir
        .start("[handlers.orders]\nkeyvalue = [\"orders\"]\n\n[queues.orders]\nhandler = \"orders\"\nmax_attempts = 1\n")
        .await;
    for step in ["placed", "paid"] {
        let event = json!({"customer": "c1", "order": "o-1", "step": step});
        let key = host.router.enqueue("orders", msg(event)).await.unwrap().key;
        wait_status(&host, key, Status::Processed, T).await;
    }
    let early = json!({"customer": "c2", "order": "o-2", "step": "shipped"});
    let early = host.router.enqueue("orders", msg(early)).await.unwrap().key;
    let failed = wait_status(&host, early, Status::Failed, T).await;
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("order o-2 is new: it cannot be shipped"),
        "{:?}",
        failed.last_error
    );
    let read = |key: &'static str| {
        let store = host.store.clone();
        async move {
            let value = store.state_read("orders", key).await.unwrap();
            value.map(|(v, _)| String::from_utf8(v).unwrap())
        }
    };
    assert_eq!(read("step:o-1").await.as_deref(), Some("paid"));
    assert_eq!(read("events:c1").await.as_deref(), Some("2"));
    assert_eq!(
        read("events:c2").await,
        None,
        "the failed event counted nothing"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_state_guide_runs_as_written() {
    the_state_guide_runs_as_written(
        Lang::Js,
        ("js/fixtures/state.js", "state"),
        "javascript.md",
        "js",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_state_guide_runs_as_written() {
    the_state_guide_runs_as_written(
        Lang::Python,
        ("python/fixtures/state/app.py", "state"),
        "python.md",
        "python",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_state_guide_runs_as_written() {
    // The Rust guide is the SDK's README; its example is the fixture `state-saga`.
    the_state_guide_runs_as_written(
        Lang::Rust,
        ("fixtures/state-saga/src/lib.rs", "state_saga"),
        "README.md",
        "rust",
    )
    .await
}

//! A full instance pool is never the handler's failure: a call that finds every one of
//! `host.max_instances` in use waits for one to come back, and one that cannot start before
//! its message's time is up returns `NoInstance` (handed back uncounted by the pipeline),
//! never an instantiation error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use wharf_host::Config;
use wharf_host::enqueue::{EnqueueError, Enqueuer};
use wharf_host::metrics::render;
use wharf_host::queue::{EnqueueStatus, Enqueued, NewMessage};
use wharf_host::runtime::{
    HandlerRegistry, InvokeError, Message, Outcome, invoke, invoke_starting_by,
};
use wharf_tests::TestDir;

/// Follow-ups are not what these tests look at.
struct Accept;

#[async_trait]
impl Enqueuer for Accept {
    async fn enqueue(&self, _: &str, _: NewMessage) -> Result<Enqueued, EnqueueError> {
        Ok(Enqueued {
            key: 1,
            status: EnqueueStatus::Added,
        })
    }
}

/// A registry whose pool holds one instance, serving the `flaky` fixture.
fn one_instance(dir: &TestDir) -> Arc<HandlerRegistry> {
    let mut config = Config::empty(dir.path("wharf.toml"));
    config.host.max_instances = 1;
    config.host.cache_dir = dir.path("cache");
    let registry = Arc::new(HandlerRegistry::new(Arc::new(config)).unwrap());
    dir.deploy("flaky", "flaky");
    registry.load_file(&dir.handler_path("flaky")).unwrap();
    registry
}

fn message(payload: &str) -> Message {
    Message {
        queue: "q".into(),
        id: None,
        delivery_id: "d".into(),
        payload: payload.into(),
        priority: 0,
        attempt: 1,
        max_attempts: 5,
        enqueued_at_ms: 0,
        headers: vec![],
    }
}

/// Start a call that holds the only instance for `ms`, and wait until it has it.
async fn hold_the_instance(
    registry: &Arc<HandlerRegistry>,
    ms: u64,
) -> tokio::task::JoinHandle<wharf_host::runtime::InvokeResult> {
    let handler = registry.get("flaky").unwrap();
    let before = instantiations(&render());
    let holder = tokio::spawn(async move {
        let payload = format!(r#"{{"sleep_ms":{ms}}}"#);
        invoke(
            &handler,
            message(&payload),
            Duration::from_secs(30),
            Arc::new(Accept) as Arc<dyn wharf_host::enqueue::Enqueuer>,
        )
        .await
    });
    wharf_tests::wait_for(Duration::from_secs(30), "the holder's instance", || async {
        (instantiations(&render()) > before).then_some(())
    })
    .await;
    holder
}

/// How many instances of `flaky` were created so far.
fn instantiations(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("wharf_instantiate_seconds_count{handler=\"flaky\"}"))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_finds_the_pool_full_waits_for_an_instance() {
    let dir = TestDir::new();
    let registry = one_instance(&dir);
    // Held long enough that the next call finds the pool full however slow the machine.
    let holder = hold_the_instance(&registry, 2_000).await;
    let handler = registry.get("flaky").unwrap();
    let waiter = invoke(
        &handler,
        message("{}"),
        Duration::from_secs(30),
        Arc::new(Accept) as Arc<dyn wharf_host::enqueue::Enqueuer>,
    )
    .await;
    assert!(
        matches!(waiter, Ok(Ok(Outcome::Completed))),
        "it waited and ran: {waiter:?}"
    );
    let held = holder.await.unwrap();
    assert!(matches!(held, Ok(Ok(Outcome::Completed))), "{held:?}");
    let metrics = render();
    assert!(
        metrics.contains("wharf_instance_waits_total{handler=\"flaky\"} 1"),
        "the wait is counted: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_cannot_start_in_time_never_ran_and_says_so() {
    let dir = TestDir::new();
    let registry = one_instance(&dir);
    let holder = hold_the_instance(&registry, 3_000).await;
    let handler = registry.get("flaky").unwrap();
    let started = Instant::now();
    let refused = invoke_starting_by(
        &handler,
        message("{}"),
        Duration::from_secs(30),
        started + Duration::from_millis(200),
        Arc::new(Accept) as Arc<dyn wharf_host::enqueue::Enqueuer>,
    )
    .await;
    match refused {
        Err(InvokeError::NoInstance(waited)) => {
            assert!(waited >= Duration::from_millis(150), "{waited:?}")
        }
        other => panic!("expected NoInstance, got {other:?}"),
    }
    let held = holder.await.unwrap();
    assert!(matches!(held, Ok(Ok(Outcome::Completed))), "{held:?}");
}

/// An external queue's messages come from two sources, the broker and the SQL queue that
/// serves its retries; its `concurrency` bounds the calls of both together. With the pool
/// sized to the configured concurrency, no call ever finds it full: each message takes
/// exactly the two attempts it asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_queue_and_its_retries_share_one_concurrency() {
    let prefix = wharf_tests::unique_prefix("pool");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let path = dir.write_config(&format!(
        r#"
[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"

[queues.export_order]
handler = "flaky"
storage = "external"
provider = "main"
concurrency = 4

[queues.replies]
handler = "not-deployed"
concurrency = 1
"#,
        url = wharf_tests::redis_url()
    ));
    let mut config = Config::load(&path).unwrap();
    // Exactly the queues' concurrency: 4 + 1.
    config.host.max_instances = 5;
    let host = wharf_host::start(config).await.unwrap();
    const N: i64 = 40;
    let batch = (0..N)
        .map(|n| {
            wharf_tests::msg(serde_json::json!({
                "sleep_ms": 300, "retry_after_ms": 1, "reply_to": "replies", "n": n
            }))
        })
        .collect();
    host.router
        .enqueue_many("export_order", batch)
        .await
        .unwrap();
    let replies = wharf_tests::wait_for(Duration::from_secs(120), "every reply", || async {
        let replies = wharf_tests::messages(&host, "replies").await;
        (replies.len() as i64 >= N).then_some(replies)
    })
    .await;
    let mut seen: Vec<(i64, i64)> = replies
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
            (
                v["seen"]["n"].as_i64().unwrap(),
                v["attempt"].as_i64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    let expected: Vec<(i64, i64)> = (0..N).map(|n| (n, 2)).collect();
    assert_eq!(
        seen, expected,
        "each message ran twice: asked to run again, then done"
    );
    let metrics = render();
    assert!(
        !metrics.contains("wharf_instance_waits_total"),
        "no call found the pool full: {metrics}"
    );
    host.shutdown().await;
}

//! `wharf replay`: failed messages run against a candidate that fixes the bug — the report
//! shows it completing them and the enqueues it would make, none of which reach a queue, and
//! the stored messages are unchanged.

use std::time::Duration;

use serde_json::{Value, json};
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, guest, messages, msg, wait_status};

const T: Duration = Duration::from_secs(30);

fn replay(dir: &TestDir, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    dir.wharf(&all)
}

/// A host whose `orders` handler (`export`) traps on every message, with `failing` messages
/// that ended failed; `replies` has no handler, so anything enqueued there stays visible.
async fn host_with_failures(
    dir: &TestDir,
    extra: &str,
    failing: u32,
) -> (wharf_host::RunningHost, Vec<i64>) {
    dir.deploy("export", "trap");
    let host = dir
        .start(&format!(
            "{extra}\n[queues.orders]\nhandler = \"export\"\nmax_attempts = 1\n\n[queues.replies]\nhandler = \"not-deployed\"\n"
        ))
        .await;
    let mut keys = Vec::new();
    for n in 0..failing {
        let m = msg(json!({"reply_to": "replies", "n": n}));
        keys.push(host.router.enqueue("orders", m).await.unwrap().key);
    }
    for key in &keys {
        wait_status(&host, *key, Status::Failed, T).await;
    }
    (host, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_candidate_completes_the_failed_messages_without_side_effects() {
    let dir = TestDir::new();
    // The serving version traps on every message.
    let (host, keys) = host_with_failures(&dir, "", 3).await;
    let before = messages(&host, "orders").await;
    host.shutdown().await;

    // The candidate (the `flaky` fixture echoes into `reply_to` and completes).
    let candidate = guest("flaky");
    let candidate = candidate.to_str().unwrap();
    let (ok, stdout, stderr) = replay(
        &dir,
        &[
            "--queue", "orders", "--status", "failed", "--with", candidate, "--json",
        ],
    );
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        report["summary"],
        "the candidate completes 3 of 3 failed messages"
    );
    for result in report["results"].as_array().unwrap() {
        assert_eq!(result["candidate"], "completed", "{result}");
        assert!(
            result["last"].as_str().unwrap().contains("trapped"),
            "the last outcome stands beside: {result}"
        );
        assert_eq!(result["enqueues"][0]["queue"], "replies");
        let echo: Value =
            serde_json::from_str(result["enqueues"][0]["payload"].as_str().unwrap()).unwrap();
        assert_eq!(echo["seen"]["reply_to"], "replies");
    }

    // One message in detail, as text.
    let (ok, text, stderr) = replay(&dir, &[&keys[0].to_string(), "--with", candidate]);
    assert!(ok, "{stderr}");
    assert!(text.contains("candidate: completed"), "{text}");
    assert!(text.contains("would enqueue into `replies`"), "{text}");
    assert!(
        text.contains("the candidate completes 1 of 1 message"),
        "{text}"
    );

    // Nothing reached a queue, nothing stored changed.
    let store = dir.sqlite_store().await;
    let list = |queue: &str| {
        let filter = wharf_host::queue::MessageFilter {
            queue: Some(queue.into()),
            limit: 100,
            ..Default::default()
        };
        let store = store.clone();
        async move { store.list(&filter).await.unwrap() }
    };
    let after = list("orders").await;
    let replies = list("replies").await;
    assert!(replies.is_empty(), "no enqueue was executed: {replies:?}");
    let shape = |ms: &[wharf_host::queue::StoredMessage]| {
        let mut v: Vec<(i64, String, u32, i64)> = ms
            .iter()
            .map(|m| (m.key, m.status.as_str().to_string(), m.attempts, m.version))
            .collect();
        v.sort();
        v
    };
    assert_eq!(shape(&before), shape(&after), "stored messages unchanged");

    // A candidate that is not a component is refused with the reason.
    let bad = dir.path("bad.wasm");
    std::fs::write(&bad, b"nope").unwrap();
    let (ok, _, stderr) = replay(
        &dir,
        &[&keys[0].to_string(), "--with", bad.to_str().unwrap()],
    );
    assert!(!ok);
    assert!(
        stderr.contains("the candidate cannot run as handler `export`"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_narrows_the_handlers_grants() {
    let dir = TestDir::new();
    std::fs::create_dir_all(dir.path("data")).unwrap();
    let path = dir.write_config(
        r#"
[handlers.export]
network = true
inherit_stdio = true
preopens = [{ host = "data", guest = "/data", read_only = false }]
allowed_outbound_hosts = ["https://erp.example.com"]

[queues.orders]
handler = "export"
"#,
    );
    let config = std::sync::Arc::new(wharf_host::Config::load(&path).unwrap());
    let file = dir.handler_path("export");
    std::fs::copy(guest("flaky"), &file).unwrap();
    for (dry, registry) in [
        (
            false,
            wharf_host::runtime::HandlerRegistry::new(config.clone()).unwrap(),
        ),
        (
            true,
            wharf_host::runtime::HandlerRegistry::dry_run(config.clone()).unwrap(),
        ),
    ] {
        registry.load_file(&file).unwrap();
        let grants = &registry.get("export").unwrap().grants;
        assert_eq!(grants.network, !dry);
        assert_eq!(grants.inherit_stdio, !dry);
        assert_eq!(grants.preopens[0].read_only, dry);
        assert_eq!(
            grants.outbound.is_empty(),
            dry,
            "outbound HTTP refused in a dry run"
        );
        assert!(grants.http, "wasi:http stays linked");
    }
}

/// `POST /api/v1/replay` with the candidate as the body: (status, JSON body).
async fn replay_api(host: &wharf_host::RunningHost, query: &str, body: Vec<u8>) -> (u16, Value) {
    replay_api_as(host, query, body, "application/wasm").await
}

/// [`replay_api`] with another content type.
async fn replay_api_as(
    host: &wharf_host::RunningHost,
    query: &str,
    body: Vec<u8>,
    content_type: &'static str,
) -> (u16, Value) {
    let url = format!("http://{}/api/v1/replay?{query}", host.admin_addr);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent
            .post(&url)
            .header("Authorization", "Bearer replay-token")
            .content_type(content_type)
            .send(&body[..])
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_replays_an_uploaded_candidate_without_side_effects() {
    let dir = TestDir::new();
    let (host, keys) = host_with_failures(&dir, "[admin]\ntoken = \"replay-token\"\n", 2).await;
    let candidate = std::fs::read(guest("flaky")).unwrap();

    let (status, report) = replay_api(&host, "queue=orders&status=failed", candidate.clone()).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["summary"],
        json!("the candidate completes 2 of 2 failed messages")
    );
    assert_eq!(report["succeeded"], json!(2));
    for result in report["results"].as_array().unwrap() {
        assert_eq!(result["candidate"], json!("completed"), "{result}");
        assert_eq!(result["enqueues"][0]["queue"], json!("replies"), "{result}");
    }
    let (status, one) = replay_api(&host, &format!("key={}", keys[0]), candidate.clone()).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["results"][0]["key"], json!(keys[0]));
    // Nothing was enqueued and the failed messages are unchanged.
    assert!(messages(&host, "replies").await.is_empty());
    assert_eq!(wharf_tests::count(&host, "orders", Status::Failed).await, 2);

    // Errors name what was wrong.
    let (status, error) = replay_api(&host, "key=999999", candidate.clone()).await;
    assert_eq!(
        (status, &error["error"]),
        (404, &json!("no message with key 999999"))
    );
    let (status, error) = replay_api(&host, "queue=nope", candidate.clone()).await;
    assert_eq!(status, 404, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("`nope`"),
        "{error}"
    );
    let (status, error) = replay_api(&host, "queue=orders", Vec::new()).await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("candidate component"),
        "{error}"
    );
    let (status, error) = replay_api(&host, "queue=orders", b"not wasm".to_vec()).await;
    assert_eq!(status, 422, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("handler `export`"),
        "{error}"
    );
    let (status, error) = replay_api(&host, "limit=3", candidate.clone()).await;
    assert_eq!(status, 400, "{error}");
    // Only `application/wasm` (a cross-site form post cannot send it without a preflight).
    let (status, error) = replay_api_as(&host, "queue=orders", candidate, "text/plain").await;
    assert_eq!(status, 415, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("application/wasm"),
        "{error}"
    );
    host.shutdown().await;
}

/// A candidate with key-value state reads the committed state; the report shows what it read
/// and the changes it would make, and none of them is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_shows_state_reads_and_changes_without_committing_them() {
    let dir = TestDir::new();
    dir.deploy("export", "kv_state");
    let host = dir
        .start("[handlers.export]\nkeyvalue = [\"counters\"]\n\n[queues.orders]\nhandler = \"export\"\nmax_attempts = 1\n")
        .await;
    let seed = msg(json!({"incr": ["total"], "set": {"rmw": "4"}}));
    let seed = host.router.enqueue("orders", seed).await.unwrap().key;
    wait_status(&host, seed, Status::Processed, T).await;
    let failing = msg(json!({"incr": ["total"], "read_set": "rmw", "fail": "permanent"}));
    let failing = host.router.enqueue("orders", failing).await.unwrap().key;
    wait_status(&host, failing, Status::Failed, T).await;
    host.shutdown().await;

    let candidate = guest("kv_state");
    let key = failing.to_string();
    let (ok, stdout, stderr) = replay(
        &dir,
        &[&key, "--with", candidate.to_str().unwrap(), "--json"],
    );
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let result = &report["results"][0];
    let reads = result["state_reads"].as_array().unwrap();
    assert!(
        reads.iter().any(|r| r["key"] == "rmw" && r["value"] == "4"),
        "{result}"
    );
    let changes = result["state_changes"].as_array().unwrap();
    assert!(
        changes
            .iter()
            .any(|c| c["key"] == "total" && c["value"] == "+1")
            && changes
                .iter()
                .any(|c| c["key"] == "rmw" && c["value"] == "5"),
        "{result}"
    );
    let store = dir.sqlite_store().await;
    let total = store
        .state_read("counters", "total")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(total.0, b"1", "nothing of the replay committed");
    let rmw = store.state_read("counters", "rmw").await.unwrap().unwrap();
    assert_eq!(rmw.0, b"4");
}

//! The message API under `/api/v1/`: every endpoint against a running host, errors as JSON
//! naming what was wrong, and the admin token (refused without it or with a wrong one;
//! health and metrics stay open).

use std::time::Duration;

use serde_json::{Value, json};
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, msg, wait_for, wait_status};

mod enqueue;
mod schedules;
mod sessions;
mod state;
mod token;

const T: Duration = Duration::from_secs(30);

/// One answer: status and JSON body.
struct Answer {
    status: u16,
    body: Value,
}

/// Call the admin server of `host` (`method`, `path`, optional JSON `body` and token).
async fn call(
    host: &wharf_host::RunningHost,
    method: &'static str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> Answer {
    let url = format!("http://{}{path}", host.admin_addr);
    let token = token.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut response = match method {
            "GET" | "DELETE" => {
                let mut request = if method == "GET" {
                    agent.get(&url)
                } else {
                    agent.delete(&url)
                };
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.call()
            }
            _ => {
                let mut request = agent.post(&url).content_type("application/json");
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.send(body.map(|b| b.to_string()).unwrap_or_default())
            }
        }
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer { status, body }
    })
    .await
    .unwrap()
}

async fn get(host: &wharf_host::RunningHost, path: &str) -> Answer {
    call(host, "GET", path, None, None).await
}

const QUEUES: &str = r#"
[queues.work]
handler = "flaky"
max_attempts = 1

[queues.parked]
handler = "not-deployed"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_and_errors_name_the_problem() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    dir.deploy_bytes("broken", b"not a component");
    let host = dir.start(QUEUES).await;
    let ok = host
        .router
        .enqueue("work", msg(json!({"n": 1})))
        .await
        .unwrap();
    let bad = host
        .router
        .enqueue("work", msg(json!({"permanent": "bad sku"})))
        .await
        .unwrap();
    wait_status(&host, ok.key, Status::Processed, T).await;
    wait_status(&host, bad.key, Status::Failed, T).await;
    let mut parked = Vec::new();
    for n in 0..5 {
        let m = wharf_host::queue::NewMessage {
            id: Some(format!("p-{n}")),
            ..msg(json!({ "n": n }))
        };
        parked.push(host.router.enqueue("parked", m).await.unwrap().key);
    }

    // Queues with counts by status: sampled, so they catch up within a few seconds of being
    // asked for (each call asks for a fresh count).
    let find = |body: &Value, name: &str| {
        body.as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == name)
            .cloned()
            .unwrap()
    };
    let queues = wait_for(T, "the sampled counts to catch up", || async {
        let queues = get(&host, "/api/v1/queues").await;
        assert_eq!(queues.status, 200, "{}", queues.body);
        (find(&queues.body, "work")["counts"] == json!({"processed": 1, "failed": 1})
            && find(&queues.body, "parked")["counts"] == json!({"pending": 5}))
        .then_some(queues)
    })
    .await;
    let work = find(&queues.body, "work");
    assert_eq!(work["handler_deployed"], true);
    assert!(
        work["counted_at_ms"].as_i64().unwrap() > wharf_host::queue::now_ms() - 60_000,
        "{work}"
    );
    let idle = find(&queues.body, "parked");
    assert_eq!(idle["handler_deployed"], false);

    // Filtered, paged listing: 5 pending in pages of 2.
    let mut seen = Vec::new();
    let mut cursor = None::<i64>;
    loop {
        let path = match cursor {
            Some(c) => format!("/api/v1/messages?queue=parked&status=pending&limit=2&cursor={c}"),
            None => "/api/v1/messages?queue=parked&status=pending&limit=2".to_string(),
        };
        let page = get(&host, &path).await;
        assert_eq!(page.status, 200, "{}", page.body);
        for m in page.body["messages"].as_array().unwrap() {
            seen.push(m["key"].as_i64().unwrap());
        }
        match page.body["next_cursor"].as_i64() {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut expected = parked.clone();
    expected.reverse();
    assert_eq!(seen, expected, "every message once, newest first");
    let by_id = get(&host, "/api/v1/messages?id=p-3").await;
    assert_eq!(by_id.body["messages"][0]["key"], parked[3]);

    // One message with payload, error and history.
    let one = get(&host, &format!("/api/v1/messages/{}", bad.key)).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body["message"]["status"], "failed");
    assert!(
        one.body["message"]["last_error"]
            .as_str()
            .unwrap()
            .contains("bad sku")
    );
    assert_eq!(one.body["history"], json!([]));

    // Retry the failed one: it runs again (and fails again: the payload is still bad).
    let retried = call(
        &host,
        "POST",
        &format!("/api/v1/messages/{}/retry", bad.key),
        None,
        None,
    )
    .await;
    assert_eq!(
        (retried.status, retried.body["changed"].clone()),
        (200, json!(1))
    );
    wait_status(&host, bad.key, Status::Failed, T).await;
    let all = call(
        &host,
        "POST",
        "/api/v1/messages/retry?queue=work&status=failed",
        None,
        None,
    )
    .await;
    assert_eq!(all.body["changed"], 1, "{}", all.body);

    // Move and delete.
    let moved = call(
        &host,
        "POST",
        &format!("/api/v1/messages/{}/move", parked[0]),
        Some(json!({"status": "on-hold"})),
        None,
    )
    .await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(
        host.store.get(parked[0]).await.unwrap().unwrap().status,
        Status::parse("on-hold")
    );
    let deleted = call(
        &host,
        "DELETE",
        &format!("/api/v1/messages/{}", parked[1]),
        None,
        None,
    )
    .await;
    assert_eq!(deleted.status, 200);
    assert!(host.store.get(parked[1]).await.unwrap().is_none());

    // Move and delete by filter, bounded by `limit`: parked[2..5] are still pending.
    let moved = call(
        &host,
        "POST",
        "/api/v1/messages/move?queue=parked&status=pending&limit=2",
        Some(json!({"status": "on-hold"})),
        None,
    )
    .await;
    assert_eq!(moved.body, json!({"changed": 2, "skipped": 0}));
    let held = get(&host, "/api/v1/messages?queue=parked&status=on-hold").await;
    assert_eq!(
        held.body["messages"].as_array().unwrap().len(),
        3,
        "parked[0] and two more"
    );
    let deleted = call(
        &host,
        "DELETE",
        "/api/v1/messages?queue=parked&status=on-hold&limit=1000",
        None,
        None,
    )
    .await;
    assert_eq!(deleted.body, json!({"changed": 3, "skipped": 0}));
    let left = get(&host, "/api/v1/messages?queue=parked").await;
    assert_eq!(
        left.body["messages"][0]["key"], parked[2],
        "only the oldest pending one is left"
    );
    let too_many = call(
        &host,
        "DELETE",
        "/api/v1/messages?queue=parked&status=pending&limit=5000",
        None,
        None,
    )
    .await;
    assert_eq!(too_many.status, 400);
    assert!(
        too_many.body["error"]
            .as_str()
            .unwrap()
            .contains("between 1 and 1000")
    );

    // Handlers.
    let handlers = get(&host, "/api/v1/handlers").await;
    assert_eq!(handlers.body[0]["name"], "flaky");
    assert_eq!(handlers.body[0]["sha256"].as_str().unwrap().len(), 64);

    // The deploy log: accepted and rejected files, the reason of a rejection.
    let deploys = get(&host, "/api/v1/deploys").await;
    let events = deploys.body.as_array().unwrap();
    let flaky = events.iter().find(|e| e["handler"] == "flaky").unwrap();
    assert_eq!(flaky["result"], "deployed");
    assert_eq!(flaky["sha256"], handlers.body[0]["sha256"]);
    let broken = events.iter().find(|e| e["handler"] == "broken").unwrap();
    assert_eq!(broken["result"], "rejected");
    assert!(
        broken["reason"]
            .as_str()
            .unwrap()
            .contains("not a valid WebAssembly component"),
        "{broken}"
    );

    // The OpenAPI document is served, and each of its parameterless GETs answers.
    let doc = get(&host, "/api/v1/openapi.json").await;
    assert_eq!(doc.body["openapi"], "3.1.0");
    for (path, operations) in doc.body["paths"].as_object().unwrap() {
        if operations.get("get").is_some() && !path.contains('{') {
            let answer = get(&host, &format!("/api/v1{path}")).await;
            assert_eq!(answer.status, 200, "GET {path}: {}", answer.body);
        }
    }

    // Errors are JSON and name what was wrong.
    let cases = [
        (
            "GET",
            "/api/v1/messages?queue=nope".to_string(),
            None,
            404,
            "no queue `nope`",
        ),
        (
            "GET",
            "/api/v1/messages?limit=0".to_string(),
            None,
            400,
            "limit must be between 1 and 500",
        ),
        (
            "GET",
            "/api/v1/messages/999999".to_string(),
            None,
            404,
            "no message with key 999999",
        ),
        (
            "DELETE",
            "/api/v1/messages/999999".to_string(),
            None,
            404,
            "no message with key 999999",
        ),
        (
            "POST",
            format!("/api/v1/messages/{}/move", parked[2]),
            Some(json!({"wrong": 1})),
            400,
            "the body must be",
        ),
        (
            "POST",
            format!("/api/v1/messages/{}/move", parked[2]),
            Some(json!({"status": "processing"})),
            400,
            "cannot move a message to `processing`",
        ),
        (
            "GET",
            "/api/v1/nothing-here".to_string(),
            None,
            404,
            "no such API endpoint",
        ),
        (
            "GET",
            "/api/v1/messages/abc".to_string(),
            None,
            400,
            "bad path",
        ),
        (
            "GET",
            "/api/v1/messages?limit=many".to_string(),
            None,
            400,
            "bad query parameters",
        ),
        (
            "POST",
            "/api/v1/messages/retry?queue=work".to_string(),
            None,
            400,
            "bad query parameters",
        ),
        (
            "POST",
            "/api/v1/queues".to_string(),
            None,
            405,
            "does not take that method",
        ),
        (
            "POST",
            format!("/api/v1/messages/{}/move", parked[2]),
            Some(json!({"status": "awaiting-release"})),
            400,
            "cannot move a message to `awaiting-release`",
        ),
    ];
    for (method, path, body, status, text) in cases {
        let answer = call(&host, method, &path, body, None).await;
        assert_eq!(answer.status, status, "{method} {path}: {}", answer.body);
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.contains(text), "{method} {path}: {error}");
    }
    host.shutdown().await;
}

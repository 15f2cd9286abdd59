//! Outbound HTTP: a handler with `allowed_outbound_hosts` (a JavaScript handler calling
//! `fetch`, SpiderMonkey engine) reaches an allowed local server; a request to any other
//! origin is refused before it connects and logged; the queue's timeout still bounds a
//! request that gets no answer; without the setting the component is rejected at deploy,
//! naming the setting.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{Lang, TestDir, capture_logs, msg, wait_status};

const T: Duration = Duration::from_secs(30);

/// A local HTTP server recording the bodies POSTed to `/hook`; `/silent` never answers.
struct Server {
    port: u16,
    bodies: Arc<Mutex<Vec<String>>>,
}

async fn serve() -> Server {
    let bodies: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = bodies.clone();
    let app = Router::new()
        .route(
            "/hook",
            post(move |body: String| async move {
                seen.lock().unwrap().push(body);
                "accepted"
            }),
        )
        .route("/silent", post(std::future::pending::<&'static str>));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server { port, bodies }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_are_reachable_others_refused_and_the_timeout_bounds_a_request() {
    let logs = capture_logs();
    let allowed = serve().await;
    let other = serve().await;
    let dir = TestDir::new();
    dir.deploy_in("caller", Lang::JsSpiderMonkey, "fetch");
    let host = dir
        .start(&format!(
            r#"
[handlers.caller]
allowed_outbound_hosts = ["http://127.0.0.1:{}"]

[queues.calls]
handler = "caller"
max_attempts = 1
timeout = "2s"
"#,
            allowed.port
        ))
        .await;
    let call = |url: String| msg(json!({ "url": url }));

    let ok = host
        .router
        .enqueue(
            "calls",
            call(format!("http://127.0.0.1:{}/hook", allowed.port)),
        )
        .await
        .unwrap();
    let done = wait_status(&host, ok.key, Status::Processed, T).await;
    let bodies = allowed.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1, "the allowed server got the request");
    assert!(
        bodies[0].starts_with("from "),
        "the guest's body arrived: {bodies:?}"
    );
    assert!(done.last_error.is_none());

    let refused_url = format!("http://127.0.0.1:{}/hook", other.port);
    let refused = host
        .router
        .enqueue("calls", call(refused_url.clone()))
        .await
        .unwrap();
    let failed = wait_status(&host, refused.key, Status::Failed, T).await;
    let error = failed.last_error.unwrap();
    assert!(
        error.contains(&format!("fetch {refused_url} failed")),
        "the guest saw the refusal: {error}"
    );
    assert!(
        other.bodies.lock().unwrap().is_empty(),
        "a refused request never reaches the other server"
    );
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("outbound HTTP request refused"))
        .expect("the refusal is logged");
    assert!(
        line.contains("handler=caller") || line.contains("handler=\"caller\""),
        "{line}"
    );
    assert!(line.contains(&refused_url), "{line}");

    let silent = host
        .router
        .enqueue(
            "calls",
            call(format!("http://127.0.0.1:{}/silent", allowed.port)),
        )
        .await
        .unwrap();
    let timed_out = wait_status(&host, silent.key, Status::Failed, T).await;
    let error = timed_out.last_error.unwrap();
    assert!(error.contains("timed out"), "{error}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_calls_out_without_allowed_hosts_is_rejected_naming_the_setting() {
    let dir = TestDir::new();
    // The same file under two names: only `caller` may call out, so `other` must not
    // share its `wasi:http`-linked component.
    dir.deploy_in("caller", Lang::JsSpiderMonkey, "fetch");
    dir.deploy_in("other", Lang::JsSpiderMonkey, "fetch");
    let host = dir
        .start(
            r#"
[handlers.caller]
allowed_outbound_hosts = ["https://api.example.com"]

[queues.calls]
handler = "caller"

[queues.others]
handler = "other"
"#,
        )
        .await;
    assert!(host.registry.get("caller").is_some(), "caller is deployed");
    assert!(host.registry.get("other").is_none(), "other is not");
    let error = host
        .registry
        .load_file(&dir.handler_path("other"))
        .expect_err("rejected")
        .to_string();
    // What to do first, the linker's words after it.
    let first = "other.wasm: handler `other` makes outbound HTTP requests (it imports wasi:http), but no origin is allowed: list the origins it may call in [handlers.other] allowed_outbound_hosts";
    assert!(error.contains(first), "{error}");
    let linker = error.find("wasi:http/").expect("the linker's detail");
    assert!(error.find(first).unwrap() < linker, "{error}");
    host.shutdown().await;
}

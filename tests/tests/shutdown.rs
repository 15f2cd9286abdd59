//! Graceful shutdown: in-flight messages finish within the grace period; what is still
//! running after it is released, so nothing stays in processing.

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, count, messages, msg, wait_for};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_what_does_not_finish_in_the_grace_period() {
    let dir = TestDir::new();
    dir.deploy("spin", "spin");
    let path = dir.write_config("");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"300ms\"")
        + "[queues.stuck]\nhandler = \"spin\"\nconcurrency = 3\ntimeout = \"60s\"\nlease = \"120s\"\n";
    std::fs::write(&path, text).unwrap();
    let host = wharf_host::start(wharf_host::Config::load(&path).unwrap())
        .await
        .unwrap();
    for n in 0..5 {
        host.router
            .enqueue("stuck", msg(json!({ "n": n })))
            .await
            .unwrap();
    }
    wait_for(T, "three messages in processing", || async {
        (count(&host, "stuck", Status::Processing).await == 3).then_some(())
    })
    .await;
    let store = host.store.clone();
    let started = std::time::Instant::now();
    host.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert_eq!(
        count_in(&store, Status::Processing).await,
        0,
        "nothing left in processing"
    );
    let pending = count_in(&store, Status::Pending).await;
    assert_eq!(
        pending, 5,
        "released and untouched messages are pending again"
    );
    let all = store
        .list(&wharf_host::queue::MessageFilter {
            queue: None,
            status: None,
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        all.iter().all(|m| m.attempts == 0),
        "a released attempt is not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_messages_finish() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start("[queues.work]\nhandler = \"flaky\"\nconcurrency = 8\n")
        .await;
    for n in 0..20 {
        host.router
            .enqueue("work", msg(json!({ "n": n, "sleep_ms": 500 })))
            .await
            .unwrap();
    }
    // Each message takes half a second: the ones in processing now are still running when
    // shutdown begins.
    let in_flight: Vec<i64> = wait_for(T, "messages in processing", || async {
        let running: Vec<i64> = messages(&host, "work")
            .await
            .into_iter()
            .filter(|m| m.status == Status::Processing)
            .map(|m| m.key)
            .collect();
        (!running.is_empty()).then_some(running)
    })
    .await;
    let store = host.store.clone();
    host.shutdown().await;
    for key in &in_flight {
        let m = store.get(*key).await.unwrap().unwrap();
        assert_eq!(
            (m.status, m.attempts),
            (Status::Processed, 1),
            "message {key} was in flight when shutdown began: it finished"
        );
    }
    assert_eq!(count_in(&store, Status::Processing).await, 0);
    let processed = count_in(&store, Status::Processed).await;
    let pending = count_in(&store, Status::Pending).await;
    assert_eq!(
        processed + pending,
        20,
        "every message is processed or still pending"
    );
}

async fn count_in(
    store: &std::sync::Arc<dyn wharf_host::queue::QueueStore>,
    status: Status,
) -> u64 {
    let counts = store
        .counts("stuck")
        .await
        .unwrap()
        .into_iter()
        .chain(store.counts("work").await.unwrap());
    counts.filter(|(s, _)| *s == status).map(|(_, n)| n).sum()
}

/// `GET /readyz` on the admin server at `addr`: the status and the body's `status`, or
/// `None` when nothing answers.
async fn readyz(addr: std::net::SocketAddr) -> Option<(u16, String)> {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent.get(&format!("http://{addr}/readyz")).call().ok()?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().ok()?;
        let body: serde_json::Value = serde_json::from_str(&text).ok()?;
        Some((
            status,
            body["status"].as_str().unwrap_or_default().to_string(),
        ))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_stopping_at_once_and_the_admin_server_answers_through_the_drain() {
    let dir = TestDir::new();
    dir.deploy("spin", "spin");
    let path = dir.write_config("");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"2s\"")
        + "[queues.stuck]\nhandler = \"spin\"\nconcurrency = 1\ntimeout = \"60s\"\nlease = \"120s\"\n";
    std::fs::write(&path, text).unwrap();
    let host = wharf_host::start(wharf_host::Config::load(&path).unwrap())
        .await
        .unwrap();
    let addr = host.admin_addr;
    wait_for(T, "the host ready", || async {
        (readyz(addr).await == Some((200, "healthy".into()))).then_some(())
    })
    .await;
    host.router
        .enqueue("stuck", msg(json!({ "n": 1 })))
        .await
        .unwrap();
    wait_for(T, "the message in processing", || async {
        (count(&host, "stuck", Status::Processing).await == 1).then_some(())
    })
    .await;
    let token = host.shutdown_token();
    let stopped = tokio::spawn(host.wait());
    token.cancel();
    // Asked to stop: not ready at once, while the handler still runs out its grace.
    assert_eq!(readyz(addr).await, Some((503, "stopping".into())));
    assert!(!stopped.is_finished(), "the drain is still under way");
    stopped.await.unwrap();
    assert_eq!(readyz(addr).await, None, "the admin server stops last");
}

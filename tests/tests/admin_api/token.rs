//! The admin token: refused without it or with a wrong one, health and metrics open, and
//! without a token only loopback names answered.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_guards_the_api_but_not_health_or_metrics() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start(&format!("[admin]\ntoken = \"s3cret-token\"\n{QUEUES}"))
        .await;
    let without = get(&host, "/api/v1/queues").await;
    assert_eq!(without.status, 401);
    assert!(
        without.body["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"),
        "{}",
        without.body
    );
    let wrong = call(&host, "GET", "/api/v1/queues", None, Some("guess")).await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.body["error"], "the admin token is wrong");
    let refused_delete = call(
        &host,
        "DELETE",
        "/api/v1/messages/1",
        None,
        Some("s3cret-tokeN"),
    )
    .await;
    assert_eq!(refused_delete.status, 401);
    let right = call(&host, "GET", "/api/v1/queues", None, Some("s3cret-token")).await;
    assert_eq!(right.status, 200, "{}", right.body);
    assert!(
        !right.body.to_string().contains("s3cret"),
        "the token never appears in answers"
    );
    assert_eq!(get(&host, "/healthz").await.status, 200);
    assert_eq!(get(&host, "/metrics").await.status, 200);
    host.shutdown().await;

    // Serving the API beyond loopback without a token is refused at start.
    let open = TestDir::new();
    let path = open.write_config(QUEUES);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("127.0.0.1:0", "0.0.0.0:0");
    std::fs::write(&path, text).unwrap();
    let config = wharf_host::Config::load(&path).expect("other commands still load it");
    let error = wharf_host::start(config).await.err().expect("refused");
    assert!(
        format!("{error:#}")
            .contains("admin.token: host.admin_listen 0.0.0.0:0 is not a loopback address"),
        "{error:#}"
    );
}

/// A raw request's status line with the given `Host` header.
fn status_with_host(addr: std::net::SocketAddr, path: &str, host: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.lines().next().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_api_answers_only_to_loopback_names() {
    let dir = TestDir::new();
    let host = dir.start("[queues.work]\nhandler = \"none\"\n").await;
    let addr = host.admin_addr;
    let port = addr.port();
    let lines = tokio::task::spawn_blocking(move || {
        [
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            "rebound.example".to_string(),
        ]
        .map(|name| status_with_host(addr, "/api/v1/queues", &name))
    })
    .await
    .unwrap();
    assert!(lines[0].contains("200"), "{lines:?}");
    assert!(lines[1].contains("200"), "{lines:?}");
    assert!(
        lines[2].contains("403"),
        "a rebound name is refused: {lines:?}"
    );
    // Probes are not the API: they answer under any name.
    let probe =
        tokio::task::spawn_blocking(move || status_with_host(addr, "/healthz", "rebound.example"))
            .await
            .unwrap();
    assert!(probe.contains("200"), "{probe}");
    host.shutdown().await;
}

//! The WASI sandbox: a handler sees no environment or files unless granted in
//! `[handlers.NAME]`, and its stdout becomes log lines tagged with the handler name.

use std::time::Duration;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{TestDir, capture_logs, messages, msg, wait_status};

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_open_the_sandbox_and_stdout_is_logged() {
    let logs = capture_logs();

    let dir = TestDir::new();
    std::fs::create_dir_all(dir.path("data")).unwrap();
    std::fs::write(dir.path("data/note.txt"), "from the host").unwrap();
    dir.deploy("open", "probe");
    dir.deploy("closed", "probe");
    let host = dir
        .start(
            r#"
[handlers.open]
env = { GREETING = "hello" }
preopens = [{ host = "data", guest = "/data" }]

[queues.open]
handler = "open"

[queues.closed]
handler = "closed"

[queues.reports]
handler = "not-deployed"
"#,
        )
        .await;
    let ask = |say: &str| {
        msg(json!({"reply_to": "reports", "var": "GREETING", "file": "/data/note.txt", "say": say}))
    };
    let open = host
        .router
        .enqueue("open", ask("printed by the open probe"))
        .await
        .unwrap();
    wait_status(&host, open.key, Status::Processed, T).await;
    let closed = host
        .router
        .enqueue("closed", ask("printed by the closed probe"))
        .await
        .unwrap();
    wait_status(&host, closed.key, Status::Processed, T).await;

    let reports: Vec<serde_json::Value> = messages(&host, "reports")
        .await
        .iter()
        .map(|m| serde_json::from_str(&m.payload).unwrap())
        .collect();
    assert_eq!(reports[0]["var"], "hello");
    assert_eq!(reports[0]["file"], json!({"Ok": "from the host"}));
    assert_eq!(reports[0]["env_count"], 1);
    assert_eq!(
        reports[1]["var"],
        serde_json::Value::Null,
        "no environment without a grant"
    );
    assert_eq!(reports[1]["env_count"], 0);
    assert!(
        reports[1]["file"]["Err"].is_string(),
        "no filesystem without a grant: {}",
        reports[1]
    );

    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("printed by the closed probe"))
        .expect("stdout line logged");
    assert!(
        line.contains("handler=\"closed\"") && line.contains("stream=\"stdout\""),
        "{line}"
    );
    host.shutdown().await;
}

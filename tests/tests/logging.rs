//! `wharf run --log-format json` with a `WHARF_LOG` filter: one JSON object per event, and
//! every message outcome carries its queue, handler, delivery and attempt.

use std::time::Duration;

use serde_json::{Value, json};
use wharf_host::queue::Status;
use wharf_tests::{TestDir, msg, wait_for, wharf_binary};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_every_outcome_with_its_fields() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    dir.write_config(
        r#"
[queues.work]
handler = "flaky"
max_attempts = 2
backoff = "10ms"
"#,
    );
    let log = std::fs::File::create(dir.path("wharf.log")).unwrap();
    let mut child = std::process::Command::new(wharf_binary())
        .current_dir(dir.dir.path())
        .args(["--config", "wharf.toml", "--log-format", "json", "run"])
        .env("WHARF_LOG", "info,wharf_host::dispatch=debug")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();

    let store = dir.sqlite_store().await;
    let ok = store
        .enqueue("work", msg(json!({"n": 1})), false)
        .await
        .unwrap()
        .key;
    let bad = store
        .enqueue("work", msg(json!({"transient_until": 9})), false)
        .await
        .unwrap()
        .key;
    let events: Vec<Value> = wait_for(T, "both outcomes logged", || async {
        let text = std::fs::read_to_string(dir.path("wharf.log")).ok()?;
        let events: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let done = |word: &str| {
            events.iter().any(|e| {
                e["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(word))
            })
        };
        (done("message processed") && done("message failed")).then_some(events)
    })
    .await;
    // The outcome is logged before its settlement commits: wait for that before the kill.
    wait_for(T, "the failure settled", || async {
        let stored = store.get(bad).await.unwrap()?;
        (stored.status == Status::Failed).then_some(())
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();

    let outcome = |delivery: String, word: &str| {
        events
            .iter()
            .find(|e| {
                e["fields"]["delivery"] == json!(delivery)
                    && e["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(word))
            })
            .unwrap_or_else(|| panic!("no `{word}` event for {delivery} in {events:#?}"))
            .clone()
    };
    let processed = outcome(format!("key={ok}"), "message processed");
    assert_eq!(processed["level"], "DEBUG");
    assert_eq!(processed["fields"]["queue"], "work");
    assert_eq!(processed["fields"]["handler"], "flaky");
    assert_eq!(processed["fields"]["attempt"], 1);
    let retried = outcome(format!("key={bad}"), "attempt failed, will retry");
    assert_eq!(retried["level"], "WARN");
    assert_eq!(retried["fields"]["attempt"], 1);
    let failed = outcome(format!("key={bad}"), "message failed");
    assert_eq!(failed["level"], "ERROR");
    assert_eq!(failed["fields"]["handler"], "flaky");
    assert_eq!(failed["fields"]["attempt"], 2);
}

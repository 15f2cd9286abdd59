//! The dashboard in a real browser (headless Chromium driven by Playwright, both installed by
//! `cargo xtask test`): an operator opens it, is asked for the admin token, sees the queue's
//! counts and health, lists the failed messages with their errors, retries one, deletes one,
//! opens one with its payload and history, replays it against an uploaded candidate, looks at
//! the handlers and the deploy log, and settles the handoff that blocks a session. Every action
//! is checked against the store, and no page error, failed request or request to another
//! origin may happen. Screenshots of each view are written to `target/screenshots/dashboard/`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use wharf_host::queue::{NewMessage, Status};
use wharf_tests::{TestDir, wait_for, wait_status};

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "dashboard-token";

fn browser_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("browser")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_inspects_retries_deletes_and_replays_from_the_dashboard() {
    assert!(
        browser_dir().join("node_modules/playwright-core").exists(),
        "playwright-core is missing in tests/browser: `cargo xtask test` installs it (and Chromium)"
    );
    let dir = TestDir::new();
    // The serving version traps on every message: three orders fail.
    dir.deploy("export", "trap");
    let host = dir
        .start(&format!(
            "[admin]\ntoken = \"{TOKEN}\"\n\n[queues.work]\nhandler = \"export\"\nmax_attempts = 1\n\n\
             [queues.orders]\nhandler = \"export\"\nsessions = true\n"
        ))
        .await;
    let mut failing = Vec::new();
    for n in 0..3 {
        let message = NewMessage {
            id: Some(format!("order-{n}")),
            payload: json!({ "order": n }).to_string(),
            ..Default::default()
        };
        failing.push(
            host.store
                .enqueue("work", message, false)
                .await
                .unwrap()
                .key,
        );
    }
    for key in &failing {
        wait_status(&host, *key, Status::Failed, T).await;
    }
    // The fix is deployed (and a broken file beside it is rejected); two new orders complete.
    dir.deploy("export", "flaky");
    dir.deploy_bytes("broken", b"this is not a component");
    let trap_hash = host.registry.get("export").unwrap().hash.clone();
    wait_for(
        T,
        "the fixed version to serve and the broken file to be rejected",
        || async {
            let fixed = host
                .registry
                .get("export")
                .is_some_and(|h| h.hash != trap_hash);
            let rejected = host
                .registry
                .deploys
                .recent()
                .iter()
                .any(|d| d.handler == "broken");
            (fixed && rejected).then_some(())
        },
    )
    .await;
    for n in 0..2 {
        let message = NewMessage {
            payload: json!({ "n": n }).to_string(),
            ..Default::default()
        };
        let key = host
            .store
            .enqueue("work", message, false)
            .await
            .unwrap()
            .key;
        wait_status(&host, key, Status::Processed, T).await;
    }
    // A session blocked by a handoff, one message parked behind it.
    let mut session = Vec::new();
    for payload in [json!({ "handoff": true }), json!({ "n": 9 })] {
        let message = NewMessage {
            payload: payload.to_string(),
            session: Some("order-7".into()),
            ..Default::default()
        };
        session.push(
            host.store
                .enqueue("orders", message, false)
                .await
                .unwrap()
                .key,
        );
    }
    wait_status(&host, session[0], Status::HandedOff, T).await;
    wait_status(&host, session[1], Status::Parked, T).await;
    let before: Vec<_> = {
        let mut out = Vec::new();
        for key in &failing {
            out.push(host.store.get(*key).await.unwrap().unwrap());
        }
        out
    };

    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots/dashboard");
    let out = tokio::process::Command::new("node")
        .arg(browser_dir().join("dashboard.mjs"))
        .arg(format!("http://{}/", host.admin_addr))
        .arg(TOKEN)
        .arg(wharf_tests::guest("noop"))
        .arg(&shots)
        .output()
        .await
        .expect("node runs the browser script");
    assert!(
        out.status.success(),
        "the browser run failed (screenshots in {}): {}",
        shots.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON report");
    assert_eq!(report["problems"], json!([]), "{report}");
    assert_eq!(report["steps"].as_array().unwrap().len(), 11, "{report}");

    // The failed list showed exactly the three failures, newest first, with their errors.
    let mut newest_first = failing.clone();
    newest_first.reverse();
    assert_eq!(report["failedKeys"], json!(newest_first));
    let errors: Vec<Value> = before
        .iter()
        .rev()
        .map(|m| {
            json!(
                m.last_error
                    .as_deref()
                    .expect("a failed message has its error")
            )
        })
        .collect();
    assert_eq!(report["errors"], json!(errors));

    // Retry resubmitted the first as a new delivery; delete removed the second.
    let retried = report["retried"].as_i64().unwrap();
    let was = before.iter().find(|m| m.key == retried).unwrap();
    let now = host
        .store
        .get(retried)
        .await
        .unwrap()
        .expect("retried message is kept");
    assert_ne!(
        now.delivery_id, was.delivery_id,
        "retry must start a new delivery"
    );
    assert_eq!(
        now.status,
        Status::Processed,
        "the retried message ran on the fix"
    );
    assert_eq!(report["retriedStatus"], json!("processed"));
    let deleted = report["deleted"].as_i64().unwrap();
    assert!(
        host.store.get(deleted).await.unwrap().is_none(),
        "delete must remove it"
    );

    // The detail showed the stored payload and error.
    let shown = report["failedKeys"][2].as_i64().unwrap();
    let stored = host.store.get(shown).await.unwrap().unwrap();
    assert_eq!(
        report["detailPayload"],
        serde_json::from_str::<Value>(&stored.payload).unwrap()
    );
    assert_eq!(report["detailError"].as_str(), stored.last_error.as_deref());
    assert_eq!(report["detailHistoryHeading"], json!(true));

    // The candidate completes the message that failed; nothing changed in the store.
    assert_eq!(
        report["replaySummary"],
        json!("the candidate completes 1 of 1 message")
    );
    assert_eq!(report["replayCandidate"], json!("completed"));
    let after = host.store.get(shown).await.unwrap().unwrap();
    assert_eq!(
        after.status,
        Status::Failed,
        "replay must not change the message"
    );
    assert_eq!(after.delivery_id, stored.delivery_id);

    // The blocked session showed its blocker; Complete settled the handoff and it drained.
    assert_eq!(report["blockedBy"], json!(session[0]));
    assert_eq!(report["parked"], json!(1));
    let settled = host.store.get(session[0]).await.unwrap().unwrap();
    assert_eq!(settled.status, Status::Processed);
    assert_eq!(settled.outcome.as_deref(), Some("handoff completed"));
    wait_status(&host, session[1], Status::Processed, T).await;

    // The deploy log showed why `broken` was rejected.
    assert!(
        !report["rejectedReason"].as_str().unwrap_or("").is_empty(),
        "{report}"
    );
    host.shutdown().await;
}

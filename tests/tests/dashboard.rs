//! The dashboard in a real browser (headless Chromium driven by Playwright, both installed by
//! `cargo xtask test`): an operator opens it, is asked for the admin token, sees the queue's
//! counts and health, lists the failed messages with their errors, retries one, deletes one,
//! opens one with its payload and history, replays it against an uploaded candidate, looks at
//! the handlers, the deploy log and the shared store's versions, and settles the handoff that
//! blocks a session. Along the way it checks what a user reads: a message processed after a failed attempt shows that
//! error as an earlier attempt's (grey), not as its state, and offers no Retry; each status
//! offers only the actions that make sense; a message opened from the Failed list keeps that
//! tab highlighted; dates are ISO 8601 in UTC (the CLI's format) with their age, in a browser
//! set to another locale and time zone; and each queue has a chart of processed and failed
//! per second and depth, drawn from the host's in-memory history. Every action is checked
//! against the store, and no page error, failed request or request to another origin may
//! happen. Screenshots of each view are written to `target/screenshots/dashboard/`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest as _;
use wharf_host::queue::{NewMessage, ServedVersion, Status};
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
    dir.deploy("tally", "kv-state");
    let host = dir
        .start(&format!(
            "[admin]\ntoken = \"{TOKEN}\"\n\n[queues.work]\nhandler = \"export\"\nmax_attempts = 1\n\n\
             [queues.orders]\nhandler = \"export\"\nsessions = true\n\n\
             [queues.tally]\nhandler = \"tally\"\n\n[queues.ticks]\n\n\
             [schedules.pulse]\ncron = \"* * * * * *\"\nqueue = \"ticks\"\n\n\
             [handlers.tally]\nkeyvalue = [\"counters\"]\n\n[handlers.export]\nkeyvalue = [\"audit\"]\n"
        ))
        .await;
    // Key-value state for the state view: a counter and a set value in `counters`; `audit`
    // is granted and empty.
    let tally = NewMessage {
        payload: json!({"incr": ["hits", "hits"], "set": {"name": "Ada"}}).to_string(),
        ..Default::default()
    };
    let tally = host.store.enqueue("tally", tally, false).await.unwrap().key;
    wait_status(&host, tally, Status::Processed, T).await;
    let mut failing = Vec::new();
    for n in 0..3 {
        // Each in its producer's trace, which the message page names.
        let message = NewMessage {
            id: Some(format!("order-{n}")),
            payload: json!({ "order": n }).to_string(),
            headers: vec![("traceparent".into(), traceparent(n))],
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

    // The shared store holds a version another host serves and a third rejected: the
    // Handlers page shows both tables.
    let stored = std::fs::read(wharf_tests::guest("noop")).unwrap();
    let sha: String = sha2::Sha256::digest(&stored)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    host.store
        .handler_deploy("archive", &stored, &sha)
        .await
        .unwrap();
    for (replica, result, error) in [
        ("replica-2", "serving", None),
        ("replica-3", "rejected", Some("over the memory cap")),
    ] {
        let served = ServedVersion {
            host: replica.into(),
            name: "archive".into(),
            version: 1,
            since_ms: wharf_host::queue::now_ms(),
            result: result.into(),
            error: error.map(String::from),
        };
        host.store.handler_record(&served).await.unwrap();
    }

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
    assert_eq!(report["steps"].as_array().unwrap().len(), 14, "{report}");
    assert_eq!(
        report["storeCurrent"],
        json!(["archive", "1", &sha[..16]]),
        "{report}"
    );
    assert_eq!(
        report["storeServed"],
        json!([
            [
                "replica-3",
                "archive",
                "1",
                "rejected",
                "over the memory cap"
            ],
            ["replica-2", "archive", "1", "serving", ""]
        ]),
        "newest first: {report}"
    );

    // The schedules view: the schedule's row with the host that claimed its last tick (this
    // one, alive), no more ticks than the store has now, and its next and last tick as times.
    let hosts = host.store.hosts().await.unwrap();
    assert_eq!(hosts.len(), 1);
    let ticks = host.store.schedules().await.unwrap();
    let schedule = &report["schedule"];
    assert_eq!(schedule["cron"], json!("* * * * * * UTC"), "{report}");
    assert_eq!(
        schedule["queue"],
        json!("#/messages?queue=ticks"),
        "{report}"
    );
    assert_eq!(schedule["host"], json!(hosts[0].id), "{report}");
    let shown = schedule["enqueued"].as_i64().unwrap();
    assert!(shown >= 1 && shown <= ticks[0].enqueued, "{report}");
    assert_eq!(
        report["scheduleTimes"],
        json!(2),
        "next and last tick: {report}"
    );
    assert_eq!(
        report["hosts"],
        json!([{"id": hosts[0].id, "state": "alive"}]),
        "{report}"
    );
    assert_eq!(report["schedulesNav"], json!(["schedules"]), "{report}");

    // The state view showed both buckets (the granted, empty one too) and the store's entries.
    assert_eq!(
        report["buckets"],
        json!([
            {"bucket": "audit", "keys": 0, "grantedTo": "export"},
            {"bucket": "counters", "keys": 2, "grantedTo": "tally"},
        ]),
        "{report}"
    );
    let committed: Vec<Value> = host
        .store
        .state_entries("counters", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(key, (value, revision))| {
            json!({"key": key, "value": String::from_utf8(value).unwrap(), "revision": revision})
        })
        .collect();
    assert_eq!(committed.len(), 2);
    assert_eq!(report["entries"], json!(committed), "{report}");
    assert_eq!(report["entries"][0]["value"], json!("2"), "{report}");
    assert_eq!(report["stateButtons"], json!(0), "read-only: {report}");

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
    // Processed after a failed attempt: no red "Last error", the old error shown as an
    // earlier attempt's, and no Retry (on the detail and in the processed list).
    let earlier = was.last_error.as_deref().expect("it failed before");
    assert_eq!(
        now.last_error.as_deref(),
        Some(earlier),
        "the store keeps the error"
    );
    let detail = &report["retriedDetail"];
    assert_eq!(detail["currentError"], json!([]), "{report}");
    assert_eq!(detail["earlierError"], json!([earlier]), "{report}");
    assert_eq!(detail["earlierRed"], json!(false));
    assert_eq!(detail["actions"], json!(["delete"]), "{report}");
    let n = failing.iter().position(|k| *k == retried).unwrap();
    assert_eq!(detail["trace"], json!([trace_id(n)]), "{report}");
    assert_eq!(detail["headers"], json!(["traceparent"]), "{report}");
    let row = &report["retriedRow"];
    assert_eq!(row["redErrors"], json!(0), "{report}");
    assert_eq!(
        row["earlierError"],
        json!([format!("Earlier attempt failed: {earlier}")]),
        "{report}"
    );
    assert_eq!(row["actions"], json!(["delete"]), "{report}");
    assert_eq!(
        row["retryAll"],
        json!(0),
        "no Retry all on a processed list"
    );
    assert_eq!(report["failedRetryAll"], json!(1));
    // The other statuses offer what makes sense for them.
    assert_eq!(report["failedActions"], json!(["retry", "delete"]));
    assert_eq!(
        report["handedOffActions"],
        json!(["complete", "fail", "retry", "delete"])
    );
    assert_eq!(report["parkedActions"], json!(["delete"]));
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

    // Opened from the Failed list, the message keeps the Failed tab highlighted.
    assert_eq!(report["failedListNav"], json!(["failed"]));
    assert_eq!(report["detailNav"], json!(["failed"]), "{report}");

    // Dates read as the CLI prints them: RFC 3339 in UTC with milliseconds, the same instant.
    let enqueued = report["detailEnqueued"]["text"].as_str().unwrap_or("");
    assert!(
        enqueued.len() == 24 && enqueued.as_bytes()[10] == b'T' && enqueued.ends_with('Z'),
        "{enqueued}"
    );
    assert_eq!(report["detailEnqueued"]["ms"], json!(stored.enqueued_at_ms));
    for shown in [&report["listTimes"], &report["deployTimes"]] {
        let shown = shown.as_array().expect("times were listed");
        assert!(!shown.is_empty(), "{report}");
        assert!(
            shown
                .iter()
                .all(|t| t.as_str().is_some_and(|t| t.ends_with('Z')))
        );
    }

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

    // Each queue's chart: points since the host started, with the failures and the messages
    // processed before the browser looked, and the session's two unsettled messages as depth.
    let chart = &report["chart"];
    assert!(chart["points"].as_u64().unwrap_or(0) >= 2, "{report}");
    assert!(
        chart["processedMax"].as_f64().unwrap_or(0.0) > 0.0,
        "{report}"
    );
    assert!(chart["failedMax"].as_f64().unwrap_or(0.0) > 0.0, "{report}");
    assert_eq!(chart["ordersDepth"], json!(2), "{report}");
    for drawn in chart["drawn"].as_array().unwrap() {
        assert!(
            drawn.as_u64().unwrap_or(0) >= 2,
            "every series is drawn: {report}"
        );
    }
    let kept = wharf_host::metrics::history::history("work");
    assert!(
        kept.len() <= wharf_host::metrics::history::MAX_POINTS,
        "bounded"
    );
    let api = api_get(&host, "/api/v1/queues/work/history").await;
    assert_eq!(api.0, 200, "{:?}", api.1);
    assert_eq!(api.1["queue"], json!("work"));
    assert_eq!(api.1["span_s"], json!(3600));
    assert!(api.1["points"].as_array().is_some_and(|p| p.len() >= 2));
    let unknown = api_get(&host, "/api/v1/queues/nope/history").await;
    assert_eq!(unknown.0, 404, "{:?}", unknown.1);

    // The deploy log showed why `broken` was rejected.
    assert!(
        !report["rejectedReason"].as_str().unwrap_or("").is_empty(),
        "{report}"
    );
    host.shutdown().await;
}

/// `GET path` on the host's admin server with the token: the status and the JSON body.
async fn api_get(host: &wharf_host::RunningHost, path: &str) -> (u16, Value) {
    let url = format!("http://{}{path}", host.admin_addr);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent
            .get(&url)
            .header("Authorization", format!("Bearer {TOKEN}"))
            .call()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
    .await
    .expect("the request task")
}

/// The trace id of failing order `n`.
fn trace_id(n: usize) -> String {
    format!("{:032x}", 0x4bf9_2f35_0000_0000_u64 + n as u64 + 1)
}

/// The `traceparent` its producer gave failing order `n`.
fn traceparent(n: usize) -> String {
    format!("00-{}-00f067aa0ba902b7-01", trace_id(n))
}

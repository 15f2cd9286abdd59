//! The cases of the conformance suite, each generic over a [`Harness`].

use std::time::{Duration, Instant};

use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::config::Config;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::Envelope;
use wharf_host::queue::{NewMessage, Selector, Status, now_ms};
use wharf_tests::{
    PgSchema, TestDir, envelope_body, messages, msg, replies, spawn_wharf, wait_for,
};

use crate::{Harness, capabilities, open};

mod effects;
mod faults;
mod identity;

pub use effects::*;
pub use faults::*;
pub use identity::*;

const T: Duration = Duration::from_secs(60);

/// A host configuration: `[providers.main]` from the harness, the external queue
/// `export_order` (flaky guest, two attempts) with `queue_extra` keys, and the SQL queue
/// `replies` the guest echoes into.
fn config<H: Harness>(h: &H, queue_extra: &str) -> String {
    format!(
        r#"
[external]
reconcile_interval = "300ms"

[providers.main]
{section}
[queues.export_order]
handler = "flaky"
storage = "external"
provider = "main"
max_attempts = 2
backoff = "10ms"
max_backoff = "20ms"
{queue_extra}

[queues.replies]
handler = "not-deployed"
"#,
        section = h.section()
    )
}

async fn start<H: Harness>(h: &H, queue_extra: &str) -> (TestDir, RunningHost) {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&config(h, queue_extra)).await;
    (dir, host)
}

async fn readiness(host: &RunningHost) -> (bool, String) {
    let (_, checks) = host.health.report().await;
    let check = &checks["external_queue_readiness_main"];
    (check.healthy, check.detail.clone())
}

async fn wait_empty<H: Harness>(h: &H, queue: &str) {
    wait_for(
        T,
        &format!("the broker queue `{queue}` to be empty"),
        || async { (h.remaining(queue).await == 0).then_some(()) },
    )
    .await;
}

fn header(m: &wharf_host::queue::StoredMessage, name: &str) -> Option<String> {
    m.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

pub async fn a_direct_producer_is_processed<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "").await;
    for n in 0..5 {
        let id = format!("order-{n}");
        h.produce_direct(
            "export_order",
            &envelope_body(json!({"reply_to": "replies", "n": n}), Some(&id)),
        )
        .await;
    }
    wait_for(T, "five replies", || async {
        (replies(&host).await == vec![0, 1, 2, 3, 4]).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    // The happy path never touches the SQL queue of the external queue.
    assert!(messages(&host, "export_order").await.is_empty());
    assert_eq!(replies(&host).await, vec![0, 1, 2, 3, 4], "each once");
    host.shutdown().await;
}

pub async fn enqueued_messages_are_processed_once<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "concurrency = 8").await;
    for n in 0..40 {
        let mut message = msg(json!({"reply_to": "replies", "n": n}));
        // The longest id Wharf takes (1024 characters, 3 KiB of UTF-8) must publish on every
        // broker, whatever its own limits on message-id properties.
        if n == 7 {
            message.id = Some("€".repeat(1024));
        }
        host.router.enqueue("export_order", message).await.unwrap();
    }
    wait_for(T, "forty replies", || async {
        (replies(&host).await.len() >= 40).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    assert_eq!(replies(&host).await, (0..40).collect::<Vec<_>>());
    assert!(messages(&host, "export_order").await.is_empty());
    host.shutdown().await;
}

pub async fn failures_move_into_sql_with_their_attempts<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "").await;
    let enqueue = |id: &str, payload: serde_json::Value| NewMessage {
        id: Some(id.to_string()),
        payload: payload.to_string(),
        ..NewMessage::default()
    };
    host.router
        .enqueue(
            "export_order",
            enqueue("bad-1", json!({"permanent": "no such customer"})),
        )
        .await
        .unwrap();
    let failed = wait_for(T, "the permanent failure in SQL", || async {
        messages(&host, "export_order")
            .await
            .into_iter()
            .find(|m| m.status == Status::Failed && m.id.as_deref() == Some("bad-1"))
    })
    .await;
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap()
            .contains("no such customer")
    );
    assert_eq!(header(&failed, "wharf.provider").as_deref(), Some("main"));
    let envelope = Envelope::parse(&header(&failed, "wharf.envelope").unwrap()).unwrap();
    assert_eq!(envelope.message_id.as_deref(), Some("bad-1"));
    assert_eq!(failed.attempts, 1, "the broker delivery was attempt 1");

    // A transient failure on the broker delivery moves into SQL sleeping with attempt 1 kept:
    // the SQL attempt is the second and last.
    host.router
        .enqueue(
            "export_order",
            enqueue("flaky-1", json!({"transient_until": 9})),
        )
        .await
        .unwrap();
    let exhausted = wait_for(T, "the transient failure to use both attempts", || async {
        messages(&host, "export_order")
            .await
            .into_iter()
            .find(|m| m.status == Status::Failed && m.id.as_deref() == Some("flaky-1"))
    })
    .await;
    assert_eq!(exhausted.attempts, 2, "{exhausted:?}");
    assert!(
        exhausted
            .last_error
            .as_deref()
            .unwrap()
            .contains("no attempts left")
    );

    // Asked to run later: sleeps in SQL, then is processed there.
    host.router
        .enqueue(
            "export_order",
            enqueue(
                "later-1",
                json!({"retry_after_ms": 50, "reply_to": "replies", "n": 7}),
            ),
        )
        .await
        .unwrap();
    wait_for(T, "the retried reply", || async {
        (replies(&host).await == vec![7]).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;

    // The failed one is retried from SQL and fails the same way there.
    assert_eq!(
        host.store.retry(&Selector::Key(failed.key)).await.unwrap(),
        1
    );
    wait_for(T, "the retried failure", || async {
        host.store
            .get(failed.key)
            .await
            .unwrap()
            .filter(|m| m.status == Status::Failed && m.attempts >= 1)
    })
    .await;
    // Each move was counted: bad-1 as failed, flaky-1 and later-1 as retries.
    let metrics = wharf_host::metrics::render();
    for (status, n) in [("failed", 1), ("retry", 2)] {
        let series = format!(
            r#"wharf_moved_into_sql_total{{queue="export_order",provider="main",status="{status}"}} {n}"#
        );
        assert!(
            metrics.lines().any(|l| l == series),
            "{series} in\n{metrics}"
        );
    }
    host.shutdown().await;
}

pub async fn a_malformed_body_ends_failed_in_sql<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "max_payload = \"64B\"\n").await;
    h.produce_direct("export_order", b"this is not an envelope")
        .await;
    h.produce_direct("export_order", &[0xff, 0xfe, 0x00]).await;
    // Valid envelopes beyond a limit: a payload over the queue's 64 bytes, an id over 1024
    // characters. They end failed in SQL with the reason and nothing of them lost.
    let large = json!({ "text": "x".repeat(100) });
    h.produce_direct(
        "export_order",
        &envelope_body(large.clone(), Some("large-1")),
    )
    .await;
    let long_id = "i".repeat(1025);
    h.produce_direct("export_order", &envelope_body(json!({}), Some(&long_id)))
        .await;
    // An id with a NUL character, which no store keeps in text.
    h.produce_direct(
        "export_order",
        &envelope_body(json!({"nul": 1}), Some("a\0b")),
    )
    .await;
    let failed = wait_for(T, "all five bodies failed in SQL", || async {
        let failed: Vec<_> = messages(&host, "export_order")
            .await
            .into_iter()
            .filter(|m| m.status == Status::Failed)
            .collect();
        (failed.len() == 5).then_some(failed)
    })
    .await;
    // Nothing stored holds a NUL (PostgreSQL could not): the id is left out, the error says
    // why, and a raw body with one is kept as the escaped payload only.
    for m in &failed {
        assert!(
            !m.id.as_deref().unwrap_or("").contains('\0')
                && m.headers
                    .iter()
                    .all(|(k, v)| !k.contains('\0') && !v.contains('\0')),
            "{m:?}"
        );
    }
    let nul = failed
        .iter()
        .find(|m| m.payload == r#"{"nul":1}"#)
        .expect("the envelope with a NUL in its id");
    assert_eq!(nul.id, None, "{nul:?}");
    assert!(
        nul.last_error.as_deref().unwrap().contains("NUL character"),
        "{nul:?}"
    );
    let too_large = failed
        .iter()
        .find(|m| m.id.as_deref() == Some("large-1"))
        .expect("the oversized message keeps its id");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&too_large.payload).unwrap(),
        large
    );
    assert!(
        too_large
            .last_error
            .as_deref()
            .unwrap()
            .contains("`queues.export_order.max_payload`"),
        "{too_large:?}"
    );
    let too_long = failed
        .iter()
        .find(|m| m.id.as_deref() == Some(long_id.as_str()))
        .expect("the over-long id is kept");
    assert!(
        too_long
            .last_error
            .as_deref()
            .unwrap()
            .contains("ids are limited to 1024"),
        "{too_long:?}"
    );
    let raw = failed
        .iter()
        .find(|m| header(m, "wharf.envelope").as_deref() == Some("this is not an envelope"))
        .expect("the raw body is kept");
    assert_eq!(raw.payload, "\"this is not an envelope\"");
    assert!(
        raw.last_error
            .as_deref()
            .unwrap()
            .contains("not an external-pending envelope")
    );
    assert!(
        failed
            .iter()
            .any(|m| m.last_error.as_deref().unwrap().contains("UTF-8")),
        "{failed:?}"
    );
    wait_empty(&h, "export_order").await;
    host.shutdown().await;
}

pub async fn a_poison_message_ends_failed_after_max_attempts<H: Harness>() {
    // A message whose handler never finishes takes its host down with it (SIGKILL while it
    // runs), again and again: after `max_attempts` deliveries it ends failed in SQL. The
    // timeout is long enough that the kill always comes first, even on a loaded machine.
    let h = H::shared().await;
    let dir = TestDir::new();
    dir.deploy("spin", "spin");
    let text = format!(
        "[storage]\nurl = \"sqlite://wharf.db\"\npoll_interval = \"50ms\"\n\
         [external]\nreconcile_interval = \"200ms\"\n\
         [providers.main]\n{}\n\
         [queues.stuck]\nhandler = \"spin\"\nstorage = \"external\"\nprovider = \"main\"\n\
         max_attempts = 2\nconcurrency = 1\ntimeout = \"10s\"\nlease = \"12s\"\n",
        h.section()
    )
    .replace(
        "[storage]",
        "[host]\nadmin_listen = \"127.0.0.1:0\"\n\n[storage]",
    );
    std::fs::write(dir.path("wharf.toml"), text).unwrap();
    let provider = open(&h).await;
    provider.prepare(&["stuck".to_string()]).await.unwrap();
    h.produce_direct("stuck", &envelope_body(json!({"n": 1}), Some("poison-1")))
        .await;
    let store = dir.sqlite_store().await;
    let failed = || async {
        let all = store
            .list(&wharf_host::queue::MessageFilter {
                queue: Some("stuck".into()),
                status: Some(Status::Failed),
                limit: 10,
                ..Default::default()
            })
            .await
            .ok()?;
        all.into_iter().next()
    };
    // Runs 1 and 2 take the message (attempts 1 and 2) and crash while it runs.
    for run in 1..=2 {
        let mut child = spawn_wharf(dir.dir.path());
        // The handler itself says it began this attempt (a broker's view of "taken" can come
        // before the host fetched it, as with a Kafka group member that just joined).
        let began = format!("spinning on attempt {run}");
        wait_for(T, &format!("run {run} to begin attempt {run}"), || async {
            let log = std::fs::read_to_string(dir.path("wharf.log")).unwrap_or_default();
            log.contains(&began).then_some(())
        })
        .await;
        wait_for(T, &format!("run {run} to hold the message"), || async {
            (h.in_flight("stuck").await == 1).then_some(())
        })
        .await;
        assert!(failed().await.is_none(), "not failed on run {run}");
        child.kill();
        // The broker takes the delivery back (the connection closed, or the lease expired).
        wait_for(T, "the broker to take the delivery back", || async {
            (h.in_flight("stuck").await == 0).then_some(())
        })
        .await;
    }
    // Run 3 sees a third delivery with two attempts allowed: failed in SQL, not run.
    let _child = spawn_wharf(dir.dir.path());
    let failed = wait_for(T, "the poison message to end failed in SQL", failed).await;
    // Failed without running the handler a third time.
    let error = failed.last_error.as_deref().unwrap();
    assert!(
        error.contains("never settled") && error.contains("no attempts left"),
        "{failed:?}"
    );
    assert_eq!(failed.id.as_deref(), Some("poison-1"));
    assert_eq!(failed.attempts, 3, "{failed:?}");
    wait_empty(&h, "stuck").await;
}

/// Every message of the host's SQLite store.
async fn messages_in(dir: &TestDir) -> Vec<wharf_host::queue::StoredMessage> {
    let store = dir.sqlite_store().await;
    store
        .list(&wharf_host::queue::MessageFilter {
            queue: None,
            status: None,
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
}

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
    let failed = wait_for(T, "all four bodies failed in SQL", || async {
        let failed: Vec<_> = messages(&host, "export_order")
            .await
            .into_iter()
            .filter(|m| m.status == Status::Failed)
            .collect();
        (failed.len() == 4).then_some(failed)
    })
    .await;
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
    // runs), again and again: after `max_attempts` deliveries it ends failed in SQL.
    let h = H::shared().await;
    let dir = TestDir::new();
    dir.deploy("spin", "spin");
    let text = format!(
        "[storage]\nurl = \"sqlite://wharf.db\"\npoll_interval = \"50ms\"\n\
         [external]\nreconcile_interval = \"200ms\"\n\
         [providers.main]\n{}\n\
         [queues.stuck]\nhandler = \"spin\"\nstorage = \"external\"\nprovider = \"main\"\n\
         max_attempts = 2\nconcurrency = 1\ntimeout = \"1500ms\"\nlease = \"2s\"\n",
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
        wait_for(T, &format!("run {run} to take the message"), || async {
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

pub async fn readiness_is_acknowledged_only_after_a_durable_activation<H: Harness>() {
    let h = H::shared().await;
    let schema = PgSchema::new();
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start_postgres(&schema, "100ms", &config(&h, "").replace("300ms", "1h"))
        .await;
    wait_for(T, "the readiness consumer to start", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    let sql = |statement: &'static str| {
        let schema = schema.name.clone();
        async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&wharf_tests::database_url())
                .await
                .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "SET search_path = \"{schema}\"; {statement}"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    };
    sql("ALTER TABLE external_activations RENAME TO activations_away").await;
    h.produce_direct(
        "export_order",
        &envelope_body(json!({"reply_to": "replies", "n": 1}), None),
    )
    .await;
    wait_for(T, "the bridge to report the failing activation", || async {
        let (healthy, detail) = readiness(&host).await;
        (!healthy && detail.contains("activation")).then_some(())
    })
    .await;
    assert_eq!(
        h.unacknowledged_notifications("export_order").await,
        1,
        "the notification stays unacknowledged while its activation cannot be stored"
    );
    sql("ALTER TABLE activations_away RENAME TO external_activations").await;
    wait_for(T, "the reply", || async {
        (replies(&host).await == vec![1]).then_some(())
    })
    .await;
    wait_for(T, "the acknowledgement and health", || async {
        (h.unacknowledged_notifications("export_order").await == 0 && readiness(&host).await.0)
            .then_some(())
    })
    .await;
    host.shutdown().await;
}

/// Declare `export_order` and publish `n` messages into it directly (no host runs).
async fn waiting_in_the_broker<H: Harness>(h: &H, n: i64) {
    open(h)
        .await
        .prepare(&["export_order".to_string()])
        .await
        .unwrap();
    for n in 0..n {
        h.produce_direct(
            "export_order",
            &envelope_body(json!({"reply_to": "replies", "n": n}), None),
        )
        .await;
    }
}

pub async fn dropped_notifications_are_reconciled<H: Harness>() {
    let h = H::shared().await;
    // Published while no host runs; then every readiness notification is lost.
    waiting_in_the_broker(&h, 3).await;
    h.drop_notifications("export_order").await;
    assert_eq!(h.unacknowledged_notifications("export_order").await, 0);
    let (_dir, host) = start(&h, "").await;
    wait_for(T, "three replies", || async {
        (replies(&host).await == vec![0, 1, 2]).then_some(())
    })
    .await;
    host.shutdown().await;
}

pub async fn a_broker_restart_turns_health_red_then_green<H: Harness>() {
    let mut h = H::private().await;
    let (_dir, host) = start(&h, "concurrency = 4").await;
    wait_for(T, "the readiness consumer to start", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    let enqueue_range = |range: std::ops::Range<i64>| {
        let router = host.router.clone();
        async move {
            for n in range {
                router
                    .enqueue("export_order", msg(json!({"reply_to": "replies", "n": n})))
                    .await
                    .unwrap();
            }
        }
    };
    enqueue_range(0..50).await;
    wait_for(T, "the first replies", || async {
        (replies(&host).await.len() == 50).then_some(())
    })
    .await;
    h.stop().await;
    wait_for(T, "the readiness check to turn unhealthy", || async {
        (!readiness(&host).await.0).then_some(())
    })
    .await;
    h.start().await;
    wait_for(T, "the readiness check to turn healthy again", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    enqueue_range(50..100).await;
    wait_for(T, "every reply after the restart", || async {
        let got = replies(&host).await;
        let mut unique = got.clone();
        unique.dedup();
        (unique == (0..100).collect::<Vec<_>>()).then_some(())
    })
    .await;
    host.shutdown().await;
}

pub async fn shutdown_hands_unfinished_messages_back<H: Harness>() {
    // One receiver: a peek-lock request still open on Service Bus when the message is handed
    // back may lock it once more (documented), which would make the attempt count vary.
    let h = H::shared().await;
    let caps = capabilities(&h);
    let dir = TestDir::new();
    dir.deploy("spin", "spin");
    let queues = |handler: &str| {
        format!(
            "[providers.main]\n{}\n\
             [queues.stuck]\nhandler = \"{handler}\"\nstorage = \"external\"\nprovider = \"main\"\n\
             timeout = \"60s\"\nlease = \"120s\"\nconcurrency = 1\n\
             [queues.replies]\nhandler = \"not-deployed\"\n",
            h.section()
        )
    };
    let path = dir.write_config(&queues("spin"));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"300ms\"");
    std::fs::write(&path, text).unwrap();
    let host = wharf_host::start(Config::load(&path).unwrap())
        .await
        .unwrap();
    host.router
        .enqueue("stuck", msg(json!({"reply_to": "replies", "n": 1})))
        .await
        .unwrap();
    wait_for(T, "the message to be delivered", || async {
        (h.in_flight("stuck").await == 1).then_some(())
    })
    .await;
    let started = Instant::now();
    host.shutdown().await; // the guest never returns: the grace period runs out
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        messages_in(&dir).await.is_empty(),
        "handed back, not moved into SQL"
    );
    wait_for(T, "the message back in the broker", || async {
        (h.in_flight("stuck").await == 0 && h.remaining("stuck").await == 1).then_some(())
    })
    .await;
    // A host whose handler finishes takes it: which attempt is it?
    dir.deploy("flaky", "flaky");
    let host = dir.start(&queues("flaky")).await;
    let reply = wait_for(T, "the reply", || async {
        messages(&host, "replies").await.into_iter().next()
    })
    .await;
    let reply: serde_json::Value = serde_json::from_str(&reply.payload).unwrap();
    if caps.uncounted_release {
        assert_eq!(
            reply["attempt"], 1,
            "the interrupted delivery is not counted"
        );
    } else {
        assert_eq!(reply["attempt"], 2, "counted, as documented");
    }
    wait_empty(&h, "stuck").await;
    host.shutdown().await;
}

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

pub async fn the_inbox_skips_a_redelivered_message_id<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "inbox = { store = \"sql\" }").await;
    let message = envelope_body(json!({"reply_to": "replies", "n": 1}), Some("dup-1"));
    h.produce_direct("export_order", &message).await;
    wait_for(T, "the first reply", || async {
        (replies(&host).await == vec![1]).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    // The producer sends the same MessageId again, plus one without an id (no inbox).
    h.produce_direct("export_order", &message).await;
    h.produce_direct(
        "export_order",
        &envelope_body(json!({"reply_to": "replies", "n": 2}), None),
    )
    .await;
    wait_for(T, "the message without an id", || async {
        (replies(&host).await == vec![1, 2]).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    assert_eq!(
        replies(&host).await,
        vec![1, 2],
        "the redelivery was skipped"
    );
    assert!(
        messages(&host, "export_order").await.is_empty(),
        "a duplicate is settled in the broker, not moved"
    );
    host.shutdown().await;
}

pub async fn a_moved_message_stands_in_for_its_message_id<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "inbox = { store = \"sql\" }").await;
    // Fails on its broker delivery, moves into SQL, succeeds there on its second attempt.
    let message = envelope_body(
        json!({"transient_until": 2, "reply_to": "replies", "n": 1}),
        Some("m-1"),
    );
    h.produce_direct("export_order", &message).await;
    let moved = wait_for(T, "the moved message to succeed in SQL", || async {
        messages(&host, "export_order")
            .await
            .into_iter()
            .find(|m| m.status == Status::Processed)
    })
    .await;
    assert_eq!(moved.id.as_deref(), Some("m-1"));
    assert_eq!(replies(&host).await, vec![1]);
    // Its success recorded the broker MessageId: the broker sending it again is skipped.
    h.produce_direct("export_order", &message).await;
    wait_empty(&h, "export_order").await;
    // A moved message standing in for an already processed MessageId is skipped too.
    let stand_in = host
        .store
        .enqueue(
            "export_order",
            NewMessage {
                payload: json!({"reply_to": "replies", "n": 9}).to_string(),
                headers: vec![("wharf.provider".into(), "main".into())],
                source_delivery_id: Some("m-1".into()),
                ..NewMessage::default()
            },
            false,
        )
        .await
        .unwrap();
    host.router.wake(Some("export_order"));
    wait_for(T, "the stand-in to be skipped", || async {
        host.store
            .get(stand_in.key)
            .await
            .unwrap()
            .filter(|m| m.outcome.as_deref() == Some("skipped: duplicate"))
    })
    .await;
    assert_eq!(
        replies(&host).await,
        vec![1],
        "neither ran the handler again"
    );
    host.shutdown().await;
}

pub async fn a_future_enqueue_runs_when_due_and_once<H: Harness>() {
    let h = H::shared().await;
    let caps = capabilities(&h);
    let (_dir, host) = start(&h, "").await;
    let due = now_ms() + 1_500;
    host.router
        .enqueue(
            "export_order",
            NewMessage {
                id: Some("later-1".into()),
                payload: json!({"reply_to": "replies", "n": 1}).to_string(),
                process_at_ms: Some(due),
                ..NewMessage::default()
            },
        )
        .await
        .unwrap();
    let held = messages(&host, "export_order").await;
    if caps.delay {
        assert!(held.is_empty(), "the broker keeps it: {held:?}");
        assert_eq!(h.remaining("export_order").await, 1);
    } else {
        // Kept in SQL (sleeping) until due, then published by the host.
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].status, Status::Sleeping);
        assert_eq!(
            header(&held[0], "wharf.publish-to").as_deref(),
            Some("main")
        );
        assert_eq!(
            h.remaining("export_order").await,
            0,
            "not in the broker before its time"
        );
    }
    wait_for(T, "the reply", || async {
        (replies(&host).await == vec![1]).then_some(())
    })
    .await;
    assert!(now_ms() >= due - 1_000, "not long before its time");
    if !caps.delay {
        // The host published it into the broker (the broker's consumer ran it), not the guest
        // from SQL.
        let held = wait_for(T, "the held message to be completed", || async {
            messages(&host, "export_order")
                .await
                .into_iter()
                .find(|m| m.status == Status::Processed)
        })
        .await;
        assert_eq!(
            held.outcome.as_deref(),
            Some("published into provider `main`"),
            "{held:?}"
        );
    }
    wait_empty(&h, "export_order").await;
    // Give a second publication (there must be none) the chance to show up.
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 2})))
        .await
        .unwrap();
    wait_for(T, "the marker reply", || async {
        (replies(&host).await.contains(&2)).then_some(())
    })
    .await;
    assert_eq!(
        replies(&host).await,
        vec![1, 2],
        "published and processed once"
    );
    host.shutdown().await;
}

pub async fn queue_settings_the_provider_cannot_honour_are_config_errors<H: Harness>() {
    let h = H::shared().await;
    let caps = capabilities(&h);
    let dir = TestDir::new();
    for (key, supported) in [
        ("idempotent = true", caps.idempotency),
        ("replace_by_id = true", caps.id_replacement),
    ] {
        let path = dir.write_config(&config(&h, key));
        let loaded = Config::load(&path);
        if supported {
            assert!(loaded.is_ok(), "{key}: {:?}", loaded.err());
        } else {
            let error = loaded.expect_err(key).to_string();
            let name = key.split(' ').next().unwrap();
            assert!(
                error.contains(&format!("queues.export_order.{name}"))
                    && error.contains("provider `main`"),
                "{error}"
            );
        }
    }
}

pub async fn a_broker_down_at_start_up_does_not_stop_the_host<H: Harness>() {
    let mut h = H::private().await;
    // Work waiting in the broker from before; then the broker goes down.
    waiting_in_the_broker(&h, 3).await;
    h.stop().await;
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let text = config(&h, "") + "\n[queues.local]\nhandler = \"flaky\"\n";
    let host = dir.start(&text).await;
    wait_for(T, "the readiness check to report the broker", || async {
        let (healthy, detail) = readiness(&host).await;
        (!healthy && !detail.is_empty()).then_some(())
    })
    .await;
    // Queues that do not depend on the provider are served meanwhile.
    host.router
        .enqueue("local", msg(json!({"reply_to": "replies", "n": 100})))
        .await
        .unwrap();
    wait_for(T, "the SQL queue's reply", || async {
        (replies(&host).await == vec![100]).then_some(())
    })
    .await;
    // Enqueueing into the provider's queue fails, naming the provider.
    let error = host
        .router
        .enqueue(
            "export_order",
            msg(json!({"reply_to": "replies", "n": 200})),
        )
        .await
        .expect_err("the broker is down")
        .to_string();
    assert!(error.contains("provider `main`"), "{error}");
    assert!(!readiness(&host).await.0);
    h.start().await;
    wait_for(T, "the readiness check to turn healthy", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 3})))
        .await
        .unwrap();
    wait_for(T, "every reply, nothing lost", || async {
        (replies(&host).await == vec![0, 1, 2, 3, 100]).then_some(())
    })
    .await;
    host.shutdown().await;
}

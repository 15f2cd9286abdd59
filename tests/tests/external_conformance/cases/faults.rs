//! Conformance cases about faults and lifecycle: durable readiness, reconciliation, broker
//! restarts, shutdown hand-back, settings a provider cannot honour, a broker down at start-up.

use wharf_host::external::{ConsumerSettings, Handle, Nack, Notification, ProviderError};

use super::*;

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

pub async fn queue_settings_the_provider_cannot_honour_are_config_errors<H: Harness>() {
    let h = H::shared().await;
    let caps = capabilities(&h);
    let dir = TestDir::new();
    for (key, supported) in [
        ("idempotent = true", caps.idempotency),
        ("replace_by_id = true", caps.id_replacement),
    ] {
        let path = dir.write_config(&config(&h, key));
        let loaded = wharf_host::host::load_config(&path);
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

/// A handle the provider did not make (another provider's, or a wrong type) is an error naming
/// the provider, never skipped: on acknowledge, hand back and the readiness bridge.
pub async fn a_handle_the_provider_did_not_make_is_an_error<H: Harness>() {
    let h = H::shared().await;
    let provider = open(&h).await;
    let queue = "export_order".to_string();
    provider
        .prepare(std::slice::from_ref(&queue))
        .await
        .unwrap();
    let consumer = provider
        .consumer(
            &queue,
            ConsumerSettings {
                prefetch: 1,
                lease: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    let foreign = || vec![Handle::new("a handle of another provider")];
    let kind = provider.kind();
    let refused = |what: &str, error: Option<ProviderError>| {
        let error = error.unwrap_or_else(|| panic!("{kind}: {what} took a foreign handle"));
        let text = error.to_string();
        assert!(
            text.contains(kind) && text.contains("handle"),
            "{what}: {text}"
        );
    };
    refused("ack", consumer.ack(&foreign()).await.err());
    refused(
        "nack",
        consumer
            .nack(
                &foreign(),
                Nack {
                    requeue: true,
                    counted: false,
                },
            )
            .await
            .err(),
    );
    let bridge = provider
        .readiness(std::slice::from_ref(&queue))
        .await
        .unwrap();
    let notification = Notification {
        queue: queue.clone(),
        handle: foreign().remove(0),
    };
    refused(
        "acknowledge",
        bridge.acknowledge(&[notification]).await.err(),
    );
    consumer.close().await;
}

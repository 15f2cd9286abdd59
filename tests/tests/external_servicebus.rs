//! What is particular to the Service Bus provider, against the contract server (nothing here
//! can reach Azure; the end-to-end test against a real namespace runs when
//! `WHARF_TEST_SERVICEBUS_CONNECTION` is set): lock renewal for a handler slower than the
//! lock, a lock lost early (the settlement is refused, the redelivery is skipped by the
//! inbox), a wrong SAS key, a missing subscription and a silent network cut on the health
//! check, a message locked for a receive whose answer arrives at shutdown, and broker and
//! custom properties reaching the guest.
//! The behaviour every provider shares is in the conformance suite (`external_conformance`).

use std::time::Duration;

use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_tests::servicebus::{ContractServer, send_direct};
use wharf_tests::{TestDir, envelope_body, messages, msg, replies, wait_for};

const T: Duration = Duration::from_secs(60);
const KEY_NAME: &str = "RootManageSharedAccessKey";
const KEY: &str = "c2VydmljZWJ1cy10ZXN0cw==";
const TOPIC: &str = "nexus.export_order";

/// Send `message` to the topic straight to the server, as a producer outside Wharf does.
async fn send(server: &ContractServer, message: &[u8], headers: &[(&str, &str)]) -> u16 {
    send_direct(
        &server.endpoint(),
        "shop",
        (KEY_NAME, KEY),
        TOPIC,
        message,
        headers,
    )
    .await
}

/// A contract server with the topic of `export_order` and both subscriptions.
async fn server() -> ContractServer {
    let server = ContractServer::start(KEY_NAME, KEY).await;
    server.create_topic(TOPIC, &["processing", "readiness"]);
    server
}

fn config(endpoint: &str, key: &str, provider_extra: &str, queue_extra: &str) -> String {
    format!(
        r#"
[external]
reconcile_interval = "300ms"

[providers.bus]
type = "servicebus"
connection_string = "Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName={KEY_NAME};SharedAccessKey={key}"
endpoint_override = "{endpoint}"
{provider_extra}

[queues.export_order]
handler = "flaky"
storage = "external"
provider = "bus"
max_attempts = 3
{queue_extra}

[queues.replies]
handler = "not-deployed"
"#
    )
}

async fn start(text: &str) -> (TestDir, RunningHost) {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(text).await;
    (dir, host)
}

async fn readiness(host: &RunningHost) -> (bool, String) {
    let (_, checks) = host.health.report().await;
    let check = &checks["external_queue_readiness_bus"];
    (check.healthy, check.detail.clone())
}

/// Wait until the processing subscription holds nothing (settled for good).
async fn wait_settled(server: &ContractServer) {
    wait_for(T, "the processing subscription to be empty", || async {
        (server.counts(TOPIC, "processing").0 == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_its_lock_completes_once() {
    let server = server().await;
    server.set_lock_duration(Duration::from_secs(2));
    let (_dir, host) = start(&config(&server.endpoint(), KEY, "", "concurrency = 4")).await;
    host.router
        .enqueue(
            "export_order",
            msg(json!({"sleep_ms": 5000, "reply_to": "replies", "n": 1})),
        )
        .await
        .unwrap();
    wait_for(T, "the reply", || async {
        (!replies(&host).await.is_empty()).then_some(())
    })
    .await;
    wait_settled(&server).await;
    // Without renewal the lock would have expired twice while the handler ran, and another
    // receiver would have run the message again.
    assert_eq!(replies(&host).await, vec![1], "handled once");
    assert_eq!(server.refused_locks(), 0, "the lock was never lost");
    assert!(messages(&host, "export_order").await.is_empty());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_refuses_the_settlement_and_the_inbox_skips_the_redelivery() {
    let server = server().await;
    let (_dir, host) = start(&config(
        &server.endpoint(),
        KEY,
        "lock_renewal = false",
        "concurrency = 1\ninbox = { store = \"sql\" }",
    ))
    .await;
    let message = envelope_body(
        json!({"sleep_ms": 1500, "reply_to": "replies", "n": 7}),
        Some("lost-1"),
    );
    assert_eq!(send(&server, &message, &[]).await, 201);
    wait_for(T, "the message to be locked", || async {
        (server.counts(TOPIC, "processing").1 == 1).then_some(())
    })
    .await;
    // The broker takes the lock back while the handler runs.
    server.expire_locks();
    wait_for(T, "the reply", || async {
        (!replies(&host).await.is_empty()).then_some(())
    })
    .await;
    wait_settled(&server).await;
    assert!(
        server.refused_locks() >= 1,
        "completing with the lost lock was refused"
    );
    assert_eq!(
        replies(&host).await,
        vec![7],
        "the redelivery was skipped by the inbox"
    );
    assert!(
        messages(&host, "export_order").await.is_empty(),
        "nothing moved into SQL"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_lost_while_handlers_run_do_not_use_up_the_queue() {
    let server = server().await;
    server.set_lock_duration(Duration::from_secs(1));
    let (_dir, host) = start(&config(
        &server.endpoint(),
        KEY,
        "lock_renewal = false",
        "concurrency = 1",
    ))
    .await;
    // Every run of the first outlives its lock and fails: nothing can settle it until the
    // broker's count passes max_attempts; the message behind it must still run.
    host.router
        .enqueue(
            "export_order",
            msg(json!({"sleep_ms": 1500, "permanent": "slow and failing"})),
        )
        .await
        .unwrap();
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 2})))
        .await
        .unwrap();
    wait_for(T, "the message behind it", || async {
        (replies(&host).await == vec![2]).then_some(())
    })
    .await;
    let failed = wait_for(T, "the slow one to end failed in SQL", || async {
        messages(&host, "export_order")
            .await
            .into_iter()
            .find(|m| m.status == wharf_host::queue::Status::Failed)
    })
    .await;
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("no attempts left"),
        "{failed:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_turns_health_red_until_the_key_is_accepted() {
    let server = server().await;
    let wrong = "d3Jvbmcta2V5";
    let (_dir, host) = start(&config(&server.endpoint(), wrong, "", "")).await;
    let detail = wait_for(T, "the readiness check to turn red", || async {
        let (healthy, detail) = readiness(&host).await;
        (!healthy && detail.contains("401")).then_some(detail)
    })
    .await;
    assert!(
        detail.contains("servicebus"),
        "names the provider: {detail}"
    );
    let error = host
        .router
        .enqueue("export_order", msg(json!({"n": 1})))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("401") && error.contains("export_order"),
        "{error}"
    );
    // The namespace's key is rotated to the one the host holds.
    server.set_key(wrong);
    wait_for(T, "the readiness check to turn green", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 2})))
        .await
        .unwrap();
    wait_for(T, "the reply", || async {
        (replies(&host).await == vec![2]).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_network_cut_turns_health_red_through_the_broker_probe() {
    let server = server().await;
    let proxy = wharf_tests::proxy::TcpProxy::start(server.port()).await;
    let endpoint = format!("http://127.0.0.1:{}", proxy.port());
    let text = config(&endpoint, KEY, "", "")
        .replace("[external]\n", "[external]\nprobe_interval = \"500ms\"\n");
    let (_dir, host) = start(&text).await;
    wait_for(T, "the provider to be ready", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    // Traffic held, connections open: a receive allows 30 s beyond its wait.
    proxy.hold(true);
    let detail = wait_for(
        Duration::from_secs(10),
        "the health check to turn red",
        || async {
            let (healthy, detail) = readiness(&host).await;
            (!healthy).then_some(detail)
        },
    )
    .await;
    assert!(detail.contains("broker probe"), "{detail}");
    proxy.hold(false);
    wait_for(T, "the health check to be green again", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 7})))
        .await
        .unwrap();
    wait_for(T, "the message to be processed after the cut", || async {
        (replies(&host).await == vec![7]).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_locked_for_a_receive_answering_at_shutdown_goes_back_at_once() {
    let server = server().await;
    server.set_lock_duration(Duration::from_secs(120));
    let proxy = wharf_tests::proxy::TcpProxy::start(server.port()).await;
    let endpoint = format!("http://127.0.0.1:{}", proxy.port());
    let (_dir, host) = start(&config(&endpoint, KEY, "", "concurrency = 1")).await;
    wait_for(T, "the provider to be ready", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    // The broker locks the message for the open peek-lock request; its answer is on the
    // way when the host stops.
    proxy.delay_answers(Duration::from_millis(400));
    let message = envelope_body(json!({"reply_to": "replies", "n": 1}), Some("late-1"));
    let status = send(&server, &message, &[]).await;
    assert_eq!(status, 201);
    wait_for(T, "the broker to lock the message", || async {
        (server.counts(TOPIC, "processing").1 == 1).then_some(())
    })
    .await;
    host.shutdown().await;
    wait_for(
        Duration::from_secs(10),
        "the message unlocked, long before its lock expires",
        || async { (server.counts(TOPIC, "processing") == (1, 0, 0)).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_whose_handler_is_not_deployed_locks_nothing() {
    let server = server().await;
    let dir = TestDir::new();
    let host = dir.start(&config(&server.endpoint(), KEY, "", "")).await;
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 4})))
        .await
        .unwrap();
    wait_for(
        T,
        "the readiness bridge to take the notification",
        || async { (server.counts(TOPIC, "readiness").0 == 0).then_some(()) },
    )
    .await;
    assert_eq!(
        server.counts(TOPIC, "processing"),
        (1, 0, 0),
        "waiting, not locked by a consumer that cannot run it"
    );
    dir.deploy("flaky", "flaky");
    wait_for(T, "the reply once the handler is deployed", || async {
        (replies(&host).await == vec![4]).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_subscription_is_named_on_the_health_check() {
    let server = ContractServer::start(KEY_NAME, KEY).await;
    server.create_topic(TOPIC, &["processing"]);
    let (_dir, host) = start(&config(&server.endpoint(), KEY, "", "")).await;
    let detail = wait_for(T, "the readiness check to turn red", || async {
        let (healthy, detail) = readiness(&host).await;
        (!healthy && detail.contains("410")).then_some(detail)
    })
    .await;
    assert!(
        detail.contains("nexus.export_order/readiness") && detail.contains("does not exist"),
        "{detail}"
    );
    // Created by the namespace's owner: the host picks it up.
    server.create_topic(TOPIC, &["readiness"]);
    wait_for(T, "the readiness check to turn green", || async {
        readiness(&host).await.0.then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_and_custom_properties_reach_the_guest() {
    let server = server().await;
    let (_dir, host) = start(&config(&server.endpoint(), KEY, "", "")).await;
    let message = envelope_body(json!({"reply_to": "replies", "n": 3}), Some("props-1"));
    let status = send(
        &server,
        &message,
        &[
            ("BrokerProperties", r#"{"MessageId":"props-1"}"#),
            ("tenant", "\"acme\""),
        ],
    )
    .await;
    assert_eq!(status, 201);
    let reply = wait_for(T, "the reply", || async {
        messages(&host, "replies").await.into_iter().next()
    })
    .await;
    let seen: serde_json::Value = serde_json::from_str(&reply.payload).unwrap();
    let headers: Vec<(String, String)> = serde_json::from_value(seen["headers"].clone()).unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("message-id"), Some("props-1"), "{headers:?}");
    assert_eq!(header("tenant"), Some("acme"), "{headers:?}");
    assert!(
        header("servicebus-sequence-number").is_some(),
        "{headers:?}"
    );
    let enqueued = seen["enqueued_at_ms"].as_u64().unwrap();
    let now = wharf_host::queue::now_ms() as u64;
    assert!(
        enqueued > now - 60_000 && enqueued <= now,
        "EnqueuedTimeUtc reaches the guest: {enqueued}"
    );
    assert_eq!(seen["attempt"], 1, "DeliveryCount is the attempt");
    host.shutdown().await;
}

/// Against a real namespace: set `WHARF_TEST_SERVICEBUS_CONNECTION` to a SAS connection
/// string whose namespace has the topic `nexus.wharf_e2e` with the subscriptions
/// `processing` and `readiness` (and a MaxDeliveryCount above 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_on_azure() {
    let Ok(connection) = std::env::var("WHARF_TEST_SERVICEBUS_CONNECTION") else {
        println!(
            "skipped: WHARF_TEST_SERVICEBUS_CONNECTION is not set (a SAS connection string of a namespace with topic `nexus.wharf_e2e` and subscriptions `processing` and `readiness`)"
        );
        return;
    };
    let text = format!(
        r#"
[providers.bus]
type = "servicebus"
connection_string = "{connection}"

[queues.wharf_e2e]
handler = "flaky"
storage = "external"
provider = "bus"
max_attempts = 3

[queues.replies]
handler = "not-deployed"
"#
    );
    let (_dir, host) = start(&text).await;
    let run = format!("{}", wharf_host::queue::now_ms());
    for n in 0..3 {
        host.router
            .enqueue(
                "wharf_e2e",
                msg(json!({"reply_to": "replies", "n": n, "run": run})),
            )
            .await
            .unwrap();
    }
    wait_for(
        Duration::from_secs(120),
        "three replies from Azure",
        || async { (replies(&host).await == vec![0, 1, 2]).then_some(()) },
    )
    .await;
    host.shutdown().await;
}

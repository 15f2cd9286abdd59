//! Ordered sessions on external queues, on the real brokers: Kafka (`KAFKA_BROKERS`; the
//! session key is the record key, so a session stays in one partition) and RabbitMQ
//! (`AMQP_URL`, `single_active_consumer = true`; the key travels in the `wharf-session`
//! header). The host runs a session's messages one at a time, and a session with messages in
//! the SQL queue (a failure, a handoff, a retry waiting) has its later messages moved there
//! behind them, parked while it is blocked, and run from there in order once it is resolved.

use std::sync::Arc;

use lapin::types::{AMQPValue, FieldTable};
use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_host::external::kafka::KafkaSettings;
use wharf_host::external::rabbitmq::{RabbitSettings, SESSION_HEADER};
use wharf_host::inbox::{InboxKey, InboxStore};
use wharf_host::queue::{NewMessage, Status, StoredMessage};
use wharf_host::{Config, StartOptions};
use wharf_tests::kafka::{TEST_PROPERTIES, kafka_brokers, kafka_produce};
use wharf_tests::{
    PgSchema, TestDir, amqp_delete, amqp_publish_with, amqp_url, envelope_body, messages,
    run_detached, unique_prefix, wait_for, wait_status,
};

use super::{
    Inbox, PER_SESSION, SESSIONS, T, assert_in_order, event, order_per_session, set_payload,
    wait_replies,
};

/// The brokers that keep a session's order.
#[derive(Clone, Copy)]
enum Broker {
    Kafka,
    RabbitMq,
}

/// A queue `orders` with sessions on `broker`, on topics, groups or queues of its own (a
/// RabbitMQ queue is deleted when this is dropped).
struct Scope {
    broker: Broker,
    prefix: String,
    /// The configuration: the provider and the queues.
    text: String,
}

impl Scope {
    fn new(broker: Broker, partitions: i32, concurrency: u32) -> Self {
        let prefix = unique_prefix("sessions").replace(':', ".");
        let provider = match broker {
            Broker::Kafka => format!(
                "type = \"kafka\"\nbrokers = \"{}\"\ntopic_prefix = \"{prefix}\"\nprocessing_group = \"{prefix}processing\"\nreadiness_group = \"{prefix}readiness\"\npartitions = {partitions}\n{TEST_PROPERTIES}",
                kafka_brokers()
            ),
            Broker::RabbitMq => format!(
                "type = \"rabbitmq\"\nurl = \"{}\"\nexchange_prefix = \"{prefix}\"\nqueue_prefix = \"{prefix}\"\nsingle_active_consumer = true",
                amqp_url()
            ),
        };
        // The SQL suite's queues, with `orders` on the broker.
        let queues = super::queues(concurrency).replace(
            "handler = \"flaky\"\n",
            "handler = \"flaky\"\nstorage = \"external\"\nprovider = \"broker\"\n",
        );
        let text = format!(
            "[external]\nreconcile_interval = \"300ms\"\n\n[providers.broker]\n{provider}\n{queues}"
        );
        Scope {
            broker,
            prefix,
            text,
        }
    }

    /// Publish an envelope of `payload` with MessageId `id` into session `session`, as a
    /// direct producer does.
    async fn produce(&self, session: &str, payload: serde_json::Value, id: &str) {
        let body = envelope_body(payload, Some(id));
        match self.broker {
            Broker::Kafka => {
                let mut s = KafkaSettings::new(kafka_brokers());
                s.topic_prefix = self.prefix.clone();
                kafka_produce(&s.brokers, &s.topic("orders"), Some(session), &body).await
            }
            Broker::RabbitMq => {
                let mut headers = FieldTable::default();
                headers.insert(SESSION_HEADER.into(), AMQPValue::LongString(session.into()));
                let properties = lapin::BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(headers);
                let exchange = self.rabbit_names().exchange;
                amqp_publish_with(&amqp_url(), &exchange, "", &body, properties).await
            }
        }
    }

    fn rabbit_names(&self) -> wharf_host::external::rabbitmq::Names {
        RabbitSettings {
            exchange_prefix: self.prefix.clone(),
            queue_prefix: self.prefix.clone(),
            ..RabbitSettings::new(amqp_url())
        }
        .names("orders")
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Broker::RabbitMq = self.broker {
            let n = self.rabbit_names();
            run_detached(async move {
                amqp_delete(&amqp_url(), &[n.processing, n.readiness], &[n.exchange]).await
            });
        }
    }
}

async fn start(dir: &TestDir, inbox: &Arc<Inbox>, text: &str) -> RunningHost {
    dir.deploy("flaky", "flaky");
    let config = Config::load(&dir.write_config(text)).unwrap();
    let options = StartOptions {
        inbox_store: Some(inbox.clone()),
    };
    wharf_host::start_with(config, options).await.unwrap()
}

/// An event of session `s` with the MessageId `s-n`.
fn identified(s: &str, n: usize, extra: serde_json::Value) -> NewMessage {
    NewMessage {
        id: Some(format!("{s}-{n}")),
        ..event(s, n, extra)
    }
}

async fn publish(host: &RunningHost, m: NewMessage) {
    host.router.enqueue("orders", m).await.unwrap();
}

/// The SQL row of MessageId `id` in `orders`, once there is one.
async fn in_sql(host: &RunningHost, id: &str) -> StoredMessage {
    wait_for(T, &format!("{id} in the SQL queue"), || async {
        messages(host, "orders")
            .await
            .into_iter()
            .find(|m| m.id.as_deref() == Some(id))
    })
    .await
}

/// Every case below, once per broker.
macro_rules! on_every_broker {
    ($($case:ident),* $(,)?) => {
        mod kafka {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Broker::Kafka).await
                }
            )*
        }
        mod rabbitmq {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Broker::RabbitMq).await
                }
            )*
        }
    };
}

on_every_broker!(
    sessions_run_in_order_under_concurrency_32_also_through_retries,
    a_failure_parks_its_session_in_sql_until_a_retry_drains_it,
    a_handoff_blocks_its_session_until_completed,
    redelivered_copies_in_a_blocked_session_neither_run_nor_move,
    an_inbox_outage_keeps_the_session_in_order,
    two_hosts_sharing_the_queue_keep_each_session_in_order,
);

async fn sessions_run_in_order_under_concurrency_32_also_through_retries(broker: Broker) {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let scope = Scope::new(broker, 4, 32);
    let host = start(&dir, &inbox, &scope.text).await;
    // Every tenth session's first message fails once: it waits for its retry in the SQL
    // queue, and the rest of its session is moved there behind it.
    let mut batch = super::workload();
    for s in (0..SESSIONS).step_by(10) {
        let first = &mut batch[s * PER_SESSION];
        let mut payload: serde_json::Value = serde_json::from_str(&first.payload).unwrap();
        payload["transient_until"] = json!(2);
        first.payload = payload.to_string();
    }
    host.router.enqueue_many("orders", batch).await.unwrap();
    wait_replies(&host, SESSIONS * PER_SESSION).await;
    assert_in_order(&order_per_session(&host).await);
    host.shutdown().await;
}

async fn a_failure_parks_its_session_in_sql_until_a_retry_drains_it(broker: Broker) {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let scope = Scope::new(broker, 2, 8);
    let host = start(&dir, &inbox, &scope.text).await;
    publish(&host, identified("a", 1, json!({}))).await;
    publish(
        &host,
        identified("a", 2, json!({"permanent": "card expired"})),
    )
    .await;
    publish(&host, identified("a", 3, json!({}))).await;
    publish(&host, identified("a", 4, json!({}))).await;
    publish(&host, identified("b", 1, json!({}))).await;
    let failed = in_sql(&host, "a-2").await;
    let failed = wait_status(&host, failed.key, Status::Failed, T).await;
    let mut parked = Vec::new();
    for id in ["a-3", "a-4"] {
        let m = in_sql(&host, id).await;
        parked.push(wait_status(&host, m.key, Status::Parked, T).await);
    }
    wait_replies(&host, 2).await;
    let order = order_per_session(&host).await;
    assert_eq!(order["a"], [1], "only the message before the failure ran");
    assert_eq!(order["b"], [1], "another session went on");
    let (ok, out, err) = dir.wharf(&["sessions", "list"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("orders") && out.contains("card expired"),
        "{out}"
    );

    // Fixed and retried: it runs from the SQL queue, then the parked ones, in order.
    set_payload(
        &dir,
        failed.key,
        &json!({"s": "a", "n": 2, "reply_to": "replies"}).to_string(),
    )
    .await;
    let (ok, _, err) = dir.wharf(&["messages", "retry", &failed.key.to_string()]);
    assert!(ok, "{err}");
    wait_status(&host, parked[1].key, Status::Processed, T).await;
    // Each moved message recorded its broker MessageId when it succeeded.
    for id in ["a-2", "a-3", "a-4"] {
        let key = InboxKey::new("orders", id).unwrap();
        assert!(inbox.inner.is_processed(&key).await.unwrap(), "{id}");
    }
    // With nothing of the session left in SQL, its next message runs from the broker.
    publish(&host, identified("a", 5, json!({}))).await;
    wait_replies(&host, 6).await;
    assert_eq!(order_per_session(&host).await["a"], [1, 2, 3, 4, 5]);
    assert!(
        !messages(&host, "orders")
            .await
            .iter()
            .any(|m| m.id.as_deref() == Some("a-5")),
        "a-5 ran from the broker"
    );
    host.shutdown().await;
}

async fn a_handoff_blocks_its_session_until_completed(broker: Broker) {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let scope = Scope::new(broker, 1, 8);
    let host = start(&dir, &inbox, &scope.text).await;
    publish(&host, identified("a", 1, json!({"handoff": true}))).await;
    publish(&host, identified("a", 2, json!({}))).await;
    let handed = in_sql(&host, "a-1").await;
    let handed = wait_status(&host, handed.key, Status::HandedOff, T).await;
    let next = in_sql(&host, "a-2").await;
    wait_status(&host, next.key, Status::Parked, T).await;
    let key = InboxKey::new("orders", "a-1").unwrap();
    assert!(
        !inbox.inner.is_processed(&key).await.unwrap(),
        "a handoff records nothing"
    );
    let (ok, _, err) = dir.wharf(&["messages", "complete", &handed.key.to_string()]);
    assert!(ok, "{err}");
    wait_status(&host, next.key, Status::Processed, T).await;
    assert_eq!(order_per_session(&host).await["a"], [1, 2]);
    host.shutdown().await;
}

async fn redelivered_copies_in_a_blocked_session_neither_run_nor_move(broker: Broker) {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let scope = Scope::new(broker, 1, 8);
    let host = start(&dir, &inbox, &scope.text).await;
    publish(&host, identified("a", 1, json!({}))).await;
    wait_replies(&host, 1).await;
    publish(
        &host,
        identified("a", 2, json!({"permanent": "card expired"})),
    )
    .await;
    let failed = in_sql(&host, "a-2").await;
    let failed = wait_status(&host, failed.key, Status::Failed, T).await;
    // The broker hands out a-1 again (the consumer inbox recorded it: checked before the
    // session rules, it is skipped) and a-2 again (the SQL queue holds it: dropped), then
    // a-3, which is parked behind the failure.
    let payload = |n: usize| json!({"s": "a", "n": n, "reply_to": "replies"});
    scope.produce("a", payload(1), "a-1").await;
    scope.produce("a", payload(2), "a-2").await;
    scope.produce("a", payload(3), "a-3").await;
    let parked = in_sql(&host, "a-3").await;
    wait_status(&host, parked.key, Status::Parked, T).await;
    let rows = messages(&host, "orders").await;
    assert!(
        !rows.iter().any(|m| m.id.as_deref() == Some("a-1")),
        "the duplicate was not moved behind the failure: {rows:?}"
    );
    let kept = rows.iter().find(|m| m.key == failed.key).unwrap();
    assert_eq!(
        (kept.status.clone(), kept.version, &kept.payload),
        (Status::Failed, failed.version, &failed.payload),
        "the SQL queue's copy of a-2 is untouched"
    );
    assert_eq!(
        order_per_session(&host).await["a"],
        [1],
        "nothing ran again"
    );
    host.shutdown().await;
}

async fn two_hosts_sharing_the_queue_keep_each_session_in_order(broker: Broker) {
    let schema = PgSchema::new();
    let (a, b) = (TestDir::new(), TestDir::new());
    let scope = Scope::new(broker, 4, 16);
    // Both hosts share the SQL queue (and with it the inbox, which skips what a rebalance
    // hands to the other host again).
    let text = scope.text.replace(
        "inbox = { store = \"memory\" }",
        "inbox = { store = \"sql\" }",
    );
    for dir in [&a, &b] {
        dir.deploy("flaky", "flaky");
    }
    let first = a.start_postgres(&schema, "20ms", &text).await;
    let second = b.start_postgres(&schema, "20ms", &text).await;
    let batch: Vec<NewMessage> = super::workload()
        .into_iter()
        .enumerate()
        .map(|(i, m)| NewMessage {
            id: Some(format!("m{i}")),
            ..m
        })
        .collect();
    first.router.enqueue_many("orders", batch).await.unwrap();
    wait_replies(&first, SESSIONS * PER_SESSION).await;
    assert_in_order(&order_per_session(&first).await);
    first.shutdown().await;
    second.shutdown().await;
}

async fn an_inbox_outage_keeps_the_session_in_order(broker: Broker) {
    let (dir, inbox) = (TestDir::new(), Arc::new(Inbox::default()));
    let scope = Scope::new(broker, 1, 8);
    let host = start(&dir, &inbox, &scope.text).await;
    // The inbox fails for a-2: its dispatch aborts before the guest and it waits for another
    // attempt in the SQL queue, holding its session; a-3 is moved there behind it.
    *inbox.fail_checks_of.lock().unwrap() = Some("a-2".to_string());
    for n in 1..=3 {
        publish(&host, identified("a", n, json!({}))).await;
    }
    let aborted = in_sql(&host, "a-2").await;
    wait_for(T, "an aborted attempt of a-2", || async {
        let m = host.store.get(aborted.key).await.unwrap()?;
        m.last_error
            .as_deref()
            .is_some_and(|e| e.contains("inbox check failed"))
            .then_some(())
    })
    .await;
    let behind = in_sql(&host, "a-3").await;
    assert_eq!(
        order_per_session(&host).await["a"],
        [1],
        "a-3 waits behind a-2"
    );
    assert_ne!(
        host.store.get(behind.key).await.unwrap().unwrap().status,
        Status::Processed
    );
    *inbox.fail_checks_of.lock().unwrap() = None;
    wait_status(&host, behind.key, Status::Processed, T).await;
    assert_eq!(order_per_session(&host).await["a"], [1, 2, 3]);
    host.shutdown().await;
}

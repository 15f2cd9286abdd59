//! A handler's follow-ups from a broker message exist if and only if the attempt that made
//! them succeeded: committed with its inbox record before the acknowledgement, discarded with
//! a failure that moves the message into SQL.

use std::collections::BTreeMap;

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::Status;
use wharf_tests::{envelope_body, messages, replies_by_n, wait_for};

use super::{T, start, wait_empty};
use crate::Harness;

pub async fn follow_ups_exist_only_for_the_attempt_that_succeeded<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "inbox = { store = \"sql\" }").await;
    let produce = |id: &str, payload: serde_json::Value| {
        let body = envelope_body(payload, Some(id));
        let h = &h;
        async move { h.produce_direct("export_order", &body).await }
    };
    let first = |n: i64, extra: serde_json::Value| {
        let mut payload = json!({"reply_to": "replies", "reply_first": true, "n": n});
        let fields = extra.as_object().unwrap().clone();
        payload.as_object_mut().unwrap().extend(fields);
        payload
    };
    // Fails on its broker delivery (its follow-up discarded), succeeds from SQL.
    produce("fu-1", first(1, json!({"transient_until": 2}))).await;
    // Fails for good: no follow-up.
    produce("fu-2", first(2, json!({"permanent": "bad"}))).await;
    // Succeeds on its broker delivery: the follow-up commits with the inbox record.
    produce("fu-3", first(3, json!({}))).await;
    let settled = |id: &'static str, status: Status| {
        let host = &host;
        async move {
            wait_for(T, &format!("`{id}` {status:?} in SQL"), || async {
                messages(host, "export_order")
                    .await
                    .into_iter()
                    .find(|m| m.status == status && m.id.as_deref() == Some(id))
            })
            .await
        }
    };
    assert_eq!(settled("fu-1", Status::Processed).await.attempts, 2);
    settled("fu-2", Status::Failed).await;
    wait_for(T, "the broker success's follow-up", || async {
        replies_by_n(&host).await.contains_key(&3).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    assert_eq!(
        replies_by_n(&host).await,
        BTreeMap::from([(1, vec![2]), (3, vec![1])]),
        "one follow-up per success, none from a failed attempt"
    );
    host.shutdown().await;
}

/// Without the inbox, a second delivery of a message whose success was committed (a
/// redelivery after a crash before the acknowledgement; here the same MessageId produced
/// twice) runs again, and its commit finds the commit mark: the follow-up exists once.
pub async fn a_second_delivery_of_a_committed_success_commits_nothing<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "").await;
    let produce = |id: &str, n: i64| {
        let body = envelope_body(json!({"reply_to": "replies", "n": n}), Some(id));
        let h = &h;
        async move { h.produce_direct("export_order", &body).await }
    };
    produce("mark-1", 1).await;
    wait_for(T, "the first delivery's follow-up", || async {
        replies_by_n(&host).await.contains_key(&1).then_some(())
    })
    .await;
    produce("mark-1", 1).await;
    produce("mark-2", 2).await;
    wait_for(T, "the other message's follow-up", || async {
        replies_by_n(&host).await.contains_key(&2).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    assert_eq!(
        replies_by_n(&host).await,
        BTreeMap::from([(1, vec![1]), (2, vec![1])]),
        "the second delivery of `mark-1` committed nothing"
    );
    host.shutdown().await;
}

/// The configuration of [`super::config`] plus a SQL queue `source` (the flaky guest, four
/// attempts) whose follow-ups go to the external queue `outbound`, which nobody consumes.
fn outbox_config<H: Harness>(h: &H) -> String {
    super::config(h, "")
        + r#"
[queues.source]
handler = "flaky"
max_attempts = 4
backoff = "10ms"
max_backoff = "20ms"

[queues.outbound]
handler = "not-deployed"
storage = "external"
provider = "main"
"#
}

async fn outbox_rows(host: &wharf_host::RunningHost) -> u64 {
    let backlog = host
        .store
        .outbox_backlog()
        .await
        .expect("the outbox backlog");
    backlog.iter().map(|b| b.rows).sum()
}

/// `GET /api/v1/queues` of `host`.
async fn api_queues(host: &wharf_host::RunningHost) -> serde_json::Value {
    let url = format!("http://{}/api/v1/queues", host.admin_addr);
    tokio::task::spawn_blocking(move || {
        let mut answer = ureq::get(&url).call().expect("GET /api/v1/queues");
        let text = answer.body_mut().read_to_string().expect("a body");
        serde_json::from_str(&text).expect("JSON")
    })
    .await
    .unwrap()
}

async fn outbox_health(host: &wharf_host::RunningHost) -> (bool, String) {
    let (_, checks) = host.health.report().await;
    let check = &checks["outbox"];
    (check.healthy, check.detail.clone())
}

pub async fn follow_ups_for_a_broker_are_published_once_from_the_outbox<H: Harness>() {
    let h = H::shared().await;
    let dir = wharf_tests::TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&outbox_config(&h)).await;
    let first = |n: i64, extra: serde_json::Value| {
        let mut payload = json!({"reply_to": "outbound", "reply_first": true, "n": n});
        let fields = extra.as_object().unwrap().clone();
        payload.as_object_mut().unwrap().extend(fields);
        wharf_tests::msg(payload)
    };
    let enqueue = |message| host.router.enqueue("source", message);
    let retried = enqueue(first(1, json!({"transient_until": 3})))
        .await
        .unwrap();
    let failed = enqueue(first(2, json!({"permanent": "bad"})))
        .await
        .unwrap();
    let ok = enqueue(first(3, json!({}))).await.unwrap();
    for (key, status) in [
        (retried.key, Status::Processed),
        (failed.key, Status::Failed),
        (ok.key, Status::Processed),
    ] {
        wharf_tests::wait_status(&host, key, status, T).await;
    }
    // Settled: the outbox holds what the successes committed until the relay publishes it.
    wait_for(T, "the outbox to be published", || async {
        (outbox_rows(&host).await == 0).then_some(())
    })
    .await;
    assert_eq!(
        h.remaining("outbound").await,
        2,
        "one follow-up per success, none from the failed attempts"
    );
    assert!(outbox_health(&host).await.0);
    host.shutdown().await;
}

pub async fn outbox_rows_wait_for_a_broker_that_is_down<H: Harness>() {
    let mut h = H::private().await;
    let dir = wharf_tests::TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start(&outbox_config(&h)).await;
    h.stop().await;
    let mut keys = Vec::new();
    for n in 0..5 {
        let message = wharf_tests::msg(json!({"reply_to": "outbound", "n": n}));
        keys.push(host.router.enqueue("source", message).await.unwrap().key);
    }
    for key in keys {
        wharf_tests::wait_status(&host, key, Status::Processed, T).await;
    }
    let (healthy, detail) = wait_for(T, "the outbox check to turn red", || async {
        let health = outbox_health(&host).await;
        (!health.0).then_some(health)
    })
    .await;
    assert!(!healthy && detail.contains("`outbound`"), "{detail}");
    assert_eq!(
        outbox_rows(&host).await,
        5,
        "nothing dropped while the broker is down"
    );
    h.start().await;
    wait_for(T, "the outbox to be published", || async {
        (outbox_rows(&host).await == 0).then_some(())
    })
    .await;
    wait_for(T, "the outbox check to turn green", || async {
        outbox_health(&host).await.0.then_some(())
    })
    .await;
    assert_eq!(h.remaining("outbound").await, 5, "each once");
    let queues = api_queues(&host).await;
    let outbound = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "outbound")
        .expect("the queue in /api/v1/queues");
    assert!(outbound["outbox"].is_null(), "{outbound}");
    host.shutdown().await;
}

pub async fn two_hosts_relaying_one_outbox_publish_each_row_once<H: Harness>() {
    let h = H::shared().await;
    let schema = wharf_tests::PgSchema::new();
    let config = outbox_config(&h);
    let mut hosts = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..2 {
        let dir = wharf_tests::TestDir::new();
        dir.deploy("flaky", "flaky");
        hosts.push(dir.start_postgres(&schema, "50ms", &config).await);
        dirs.push(dir);
    }
    // Both hosts process `source` and commit follow-ups; both relays sweep the outbox.
    let total = 200;
    let messages: Vec<_> = (0..total)
        .map(|n| wharf_tests::msg(json!({"reply_to": "outbound", "n": n})))
        .collect();
    let keys = hosts[0]
        .router
        .enqueue_many("source", messages)
        .await
        .unwrap();
    for key in keys.iter().map(|k| k.key) {
        wharf_tests::wait_status(&hosts[1], key, Status::Processed, T).await;
    }
    wait_for(T, "the outbox to be published", || async {
        (outbox_rows(&hosts[0]).await == 0).then_some(())
    })
    .await;
    wait_for(T, "every follow-up in the broker", || async {
        (h.remaining("outbound").await >= total as u64).then_some(())
    })
    .await;
    assert_eq!(
        h.remaining("outbound").await,
        total as u64,
        "no row published twice"
    );
    for host in hosts {
        host.shutdown().await;
    }
}

/// Key-value changes of a broker message commit with its inbox record before the
/// acknowledgement; a failed attempt's changes are dropped with it. The same message
/// delivered twice (its MessageId produced again) adds once.
pub async fn state_changes_from_a_broker_commit_with_the_outcome<H: Harness>() {
    let h = H::shared().await;
    let dir = wharf_tests::TestDir::new();
    dir.deploy("flaky", "kv_state");
    let config = super::config(&h, "inbox = { store = \"sql\" }")
        + "\n[handlers.flaky]\nkeyvalue = [\"counters\"]\n";
    let host = dir.start(&config).await;
    for n in 0..20 {
        let body = envelope_body(json!({"incr": ["total"]}), Some(&format!("st-{n}")));
        h.produce_direct("export_order", &body).await;
    }
    let bad = json!({"incr": ["total"], "fail": "permanent"});
    h.produce_direct("export_order", &envelope_body(bad, Some("st-bad")))
        .await;
    wait_for(T, "the failed message in SQL", || async {
        messages(&host, "export_order")
            .await
            .into_iter()
            .find(|m| m.status == Status::Failed && m.id.as_deref() == Some("st-bad"))
    })
    .await;
    let again = envelope_body(json!({"incr": ["total"]}), Some("st-0"));
    h.produce_direct("export_order", &again).await;
    wait_empty(&h, "export_order").await;
    let total = wait_for(T, "the counter", || async {
        let read = host.store.state_read("counters", "total").await.unwrap();
        read.map(|(v, _)| String::from_utf8(v).unwrap())
            .filter(|v| v == "20")
    })
    .await;
    assert_eq!(total, "20", "one increment per message that succeeded");
    host.shutdown().await;
}

//! A handler's follow-ups from a broker message exist if and only if the attempt that made
//! them succeeded: committed with its inbox record before the acknowledgement, discarded with
//! a failure that moves the message into SQL.

use std::collections::BTreeMap;

use serde_json::json;
use wharf_host::queue::Status;
use wharf_tests::{envelope_body, messages, wait_for};

use super::{T, start, wait_empty};
use crate::Harness;

/// The replies of `host`, as the attempts that sent them, by the `n` they echo.
async fn replies_by_n(host: &wharf_host::RunningHost) -> BTreeMap<i64, Vec<i64>> {
    let mut by_n: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for m in messages(host, "replies").await {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        let n = v["seen"]["n"].as_i64().expect("the echoed n");
        let attempt = v["attempt"].as_i64().expect("the echoed attempt");
        by_n.entry(n).or_default().push(attempt);
    }
    by_n
}

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

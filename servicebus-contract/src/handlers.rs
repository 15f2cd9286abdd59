//! The REST operations of the contract server, each following the section of the Service
//! Bus REST reference it names.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::dates::{http_date, parse_date};
use super::sas::authorize;
use super::{BATCH_CONTENT_TYPE, Broker, Message, Refusal, Shared, count_request, gone};

/// One message to send: body, broker properties, user properties.
struct Outgoing {
    body: Bytes,
    broker: Value,
    properties: Vec<(String, String)>,
}

/// "Send Message" (POST `{topic}/messages`, 201 Created) and "Send Message Batch" (the same
/// URL with `Content-Type: application/vnd.microsoft.servicebus.json`, a JSON array of
/// `{Body, BrokerProperties, UserProperties}`). A topic forwards a copy to each subscription.
pub(super) async fn send(
    State(shared): State<Arc<Shared>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    count_request(&shared);
    shared.broker.lock().unwrap().sends += 1;
    if let Err(refused) = authorize(&shared, &headers, &format!("/{topic}/messages")) {
        return refused.into_response();
    }
    let batch = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(BATCH_CONTENT_TYPE));
    let outgoing: Vec<Outgoing> = if batch {
        let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(&body) else {
            return (StatusCode::BAD_REQUEST, "a batch is a JSON array").into_response();
        };
        items
            .into_iter()
            .map(|item| Outgoing {
                body: Bytes::from(item["Body"].as_str().unwrap_or_default().to_string()),
                broker: item["BrokerProperties"].clone(),
                properties: item["UserProperties"]
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| {
                                (k.clone(), v.as_str().map_or(v.to_string(), str::to_string))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    } else {
        let broker = headers
            .get("brokerproperties")
            .and_then(|v| serde_json::from_slice(v.as_bytes()).ok())
            .unwrap_or(Value::Null);
        // Custom properties travel as other headers.
        let properties = headers
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "authorization"
                        | "brokerproperties"
                        | "content-type"
                        | "content-length"
                        | "host"
                        | "accept"
                        | "user-agent"
                        | "accept-encoding"
                        | "connection"
                )
            })
            .filter_map(|(k, v)| {
                Some((
                    k.to_string(),
                    v.to_str().ok()?.trim_matches('"').to_string(),
                ))
            })
            .collect();
        vec![Outgoing {
            body,
            broker,
            properties,
        }]
    };
    let mut broker = shared.broker.lock().unwrap();
    let Broker {
        topics, sequence, ..
    } = &mut *broker;
    let Some(subs) = topics.get_mut(&topic) else {
        return gone(&format!("topic `{topic}`")).into_response();
    };
    let now = SystemTime::now();
    for out in outgoing {
        *sequence += 1;
        let message_id = out.broker["MessageId"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{:032x}", rand_id()));
        let visible_at = out.broker["ScheduledEnqueueTimeUtc"]
            .as_str()
            .and_then(parse_date)
            .unwrap_or(now);
        for sub in subs.values_mut() {
            sub.messages.insert(
                *sequence,
                Message {
                    sequence: *sequence,
                    message_id: message_id.clone(),
                    body: out.body.clone(),
                    properties: out.properties.clone(),
                    enqueued: now,
                    visible_at,
                    delivery_count: 0,
                    lock: None,
                },
            );
        }
    }
    drop(broker);
    shared.sent.notify_waiters();
    StatusCode::CREATED.into_response()
}

fn rand_id() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    u128::from(h.finish()) << 64 | u128::from(h.finish().rotate_left(17))
}

#[derive(serde::Deserialize)]
pub(super) struct PeekQuery {
    timeout: Option<u64>,
}

/// Lock the first visible message of a subscription, or dead-letter those whose next
/// delivery would exceed `MaxDeliveryCount`.
fn try_lock(broker: &mut Broker, topic: &str, sub: &str) -> Result<Option<Message>, Refusal> {
    let lock_duration = broker.lock_duration;
    let max = broker.max_delivery_count;
    let Some(subscription) = broker.topics.get_mut(topic).and_then(|t| t.get_mut(sub)) else {
        return Err(gone(&format!("subscription `{topic}/{sub}`")));
    };
    let now = SystemTime::now();
    loop {
        let candidate = subscription.messages.values().find(|m| {
            m.visible_at <= now && m.lock.as_ref().is_none_or(|(_, until)| *until <= now)
        });
        let Some(seq) = candidate.map(|m| m.sequence) else {
            return Ok(None);
        };
        let message = subscription.messages.get_mut(&seq).expect("found");
        if message.delivery_count >= max {
            let dead = subscription.messages.remove(&seq).expect("found");
            subscription.dead_letters.push_back(dead);
            continue;
        }
        message.delivery_count += 1;
        message.lock = Some((format!("{:032x}", rand_id()), now + lock_duration));
        return Ok(Some(message.clone()));
    }
}

fn locked_response(message: &Message, location: String) -> Response {
    let (token, until) = message.lock.clone().expect("locked");
    let broker = json!({
        "DeliveryCount": message.delivery_count,
        "EnqueuedSequenceNumber": message.sequence,
        "EnqueuedTimeUtc": http_date(message.enqueued),
        "LockToken": token,
        "LockedUntilUtc": http_date(until),
        "MessageId": message.message_id,
        "SequenceNumber": message.sequence,
        "State": "Active",
        "TimeToLive": 922_337_203_685.477_6_f64,
    });
    let mut headers = HeaderMap::new();
    headers.insert(
        "BrokerProperties",
        HeaderValue::from_str(&broker.to_string()).expect("ASCII JSON"),
    );
    headers.insert("Location", HeaderValue::from_str(&location).expect("a URL"));
    for (k, v) in &message.properties {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&format!("\"{v}\"")),
        ) {
            headers.insert(name, value);
        }
    }
    (StatusCode::CREATED, headers, message.body.clone()).into_response()
}

/// Wait up to `?timeout=N` seconds (default 60) for the first available message of
/// `topic/sub`, locking it; `delete` removes it at once (a destructive read). Woken by a
/// send; scheduled messages and expiring locks are looked at every 50 ms.
async fn take_head(
    shared: &Shared,
    (topic, sub): (&str, &str),
    timeout: Option<u64>,
    delete: bool,
) -> Result<Option<Message>, Refusal> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout.unwrap_or(60));
    loop {
        let sent = shared.sent.notified();
        {
            let mut broker = shared.broker.lock().unwrap();
            if let Some(message) = try_lock(&mut broker, topic, sub)? {
                if delete && let Some(s) = broker.topics.get_mut(topic).and_then(|t| t.get_mut(sub))
                {
                    s.messages.remove(&message.sequence);
                }
                return Ok(Some(message));
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        let wake = tokio::time::Instant::now() + Duration::from_millis(50);
        tokio::select! {
            _ = sent => {}
            _ = tokio::time::sleep_until(wake.min(deadline)) => {}
        }
    }
}

/// "Peek-Lock Message (Non-Destructive Read)": POST `{topic}/subscriptions/{sub}/messages/head
/// ?timeout=N` waits up to N seconds; 201 with the body, `BrokerProperties`, custom
/// properties as headers and `Location` (the lock's URL); 204 No Content when none came.
pub(super) async fn peek_lock(
    State(shared): State<Arc<Shared>>,
    Path((topic, sub)): Path<(String, String)>,
    Query(query): Query<PeekQuery>,
    headers: HeaderMap,
) -> Response {
    count_request(&shared);
    let path = format!("/{topic}/subscriptions/{sub}/messages/head");
    if let Err(refused) = authorize(&shared, &headers, &path) {
        return refused.into_response();
    }
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_string();
    match take_head(&shared, (&topic, &sub), query.timeout, false).await {
        Err(refusal) => refusal.into_response(),
        Ok(None) => StatusCode::NO_CONTENT.into_response(),
        Ok(Some(message)) => {
            let (token, _) = message.lock.clone().expect("locked");
            let location = format!(
                "http://{host}/{topic}/subscriptions/{sub}/messages/{}/{token}",
                message.sequence
            );
            locked_response(&message, location)
        }
    }
}

/// "Receive and Delete Message (Destructive Read)": DELETE
/// `{topic}/subscriptions/{sub}/messages/head?timeout=N`; 200 with the message, which is
/// gone from the subscription, or 204 No Content when none came within the timeout.
pub(super) async fn receive_and_delete(
    State(shared): State<Arc<Shared>>,
    Path((topic, sub)): Path<(String, String)>,
    Query(query): Query<PeekQuery>,
    headers: HeaderMap,
) -> Response {
    count_request(&shared);
    let path = format!("/{topic}/subscriptions/{sub}/messages/head");
    if let Err(refused) = authorize(&shared, &headers, &path) {
        return refused.into_response();
    }
    match take_head(&shared, (&topic, &sub), query.timeout, true).await {
        Err(refusal) => refusal.into_response(),
        Ok(None) => StatusCode::NO_CONTENT.into_response(),
        Ok(Some(message)) => {
            let mut answer = locked_response(&message, String::new());
            *answer.status_mut() = StatusCode::OK;
            answer
        }
    }
}

/// The dead-letter subqueue: `{topic}/subscriptions/{sub}/$DeadLetterQueue/messages/head`
/// (receive-and-delete of the oldest dead-lettered message here; 204 when empty).
pub(super) async fn peek_lock_dead_letter(
    State(shared): State<Arc<Shared>>,
    Path((topic, sub, dlq)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    count_request(&shared);
    let path = format!("/{topic}/subscriptions/{sub}/{dlq}/messages/head");
    if let Err(refused) = authorize(&shared, &headers, &path) {
        return refused.into_response();
    }
    if dlq != "$DeadLetterQueue" {
        return gone(&format!("entity `{topic}/subscriptions/{sub}/{dlq}`")).into_response();
    }
    let mut broker = shared.broker.lock().unwrap();
    let Some(subscription) = broker.topics.get_mut(&topic).and_then(|t| t.get_mut(&sub)) else {
        return gone(&format!("subscription `{topic}/{sub}`")).into_response();
    };
    match subscription.dead_letters.pop_front() {
        Some(mut message) => {
            message.lock = Some(("dead-letter".to_string(), SystemTime::now()));
            locked_response(&message, String::new())
        }
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

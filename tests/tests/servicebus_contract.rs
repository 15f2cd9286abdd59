//! The Service Bus contract server (`wharf_tests::servicebus`) against the documented
//! behaviours of the REST API it implements, with plain HTTP requests signed as the
//! "Generate SAS token" procedure says: send and batch send fan out to every subscription,
//! peek-lock counts deliveries and returns the broker properties and the lock's location,
//! complete / unlock / renew act on the lock and answer 404 once it is gone, an expired
//! lock makes the message available again, `MaxDeliveryCount` dead-letters, a scheduled
//! message waits for its time, missing entities are 410 and bad tokens 401.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use wharf_tests::servicebus::{BATCH_CONTENT_TYPE, ContractServer, sas_token};
use wharf_tests::wait_for;

const KEY_NAME: &str = "RootManageSharedAccessKey";
const KEY: &str = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";

/// One answer: status, headers, body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn broker(&self) -> Value {
        serde_json::from_str(self.header("BrokerProperties").expect("BrokerProperties")).unwrap()
    }
}

fn expiry(in_secs: i64) -> u64 {
    (SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + in_secs) as u64
}

/// A request signed for its own URL (as clients do) with `key`.
async fn call(method: &str, url: &str, key: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let token = sas_token(url, KEY_NAME, key, expiry(3600));
    request(method, url, &token, headers, body).await
}

async fn request(
    method: &str,
    url: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let (method, url, token, body) = (
        method.to_string(),
        url.to_string(),
        token.to_string(),
        body.to_string(),
    );
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let answer = match method.as_str() {
            "POST" | "PUT" => {
                let mut r = if method == "POST" {
                    agent.post(&url)
                } else {
                    agent.put(&url)
                };
                r = r.header("Authorization", &token);
                for (k, v) in &headers {
                    r = r.header(k, v);
                }
                r.send(body.as_bytes())
            }
            _ => {
                let mut r = agent.delete(&url).header("Authorization", &token);
                for (k, v) in &headers {
                    r = r.header(k, v);
                }
                r.call()
            }
        };
        let mut answer = answer.expect("the server answers");
        Answer {
            status: answer.status().as_u16(),
            headers: answer
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
                .collect(),
            body: answer.body_mut().read_to_string().unwrap_or_default(),
        }
    })
    .await
    .unwrap()
}

async fn server() -> ContractServer {
    let s = ContractServer::start(KEY_NAME, KEY).await;
    s.create_topic("orders", &["processing", "readiness"]);
    s
}

async fn send(s: &ContractServer, body: &str, broker: Value) -> Answer {
    let url = format!("{}/orders/messages", s.endpoint());
    call(
        "POST",
        &url,
        KEY,
        &[
            ("BrokerProperties", &broker.to_string()),
            ("Priority", "\"high\""),
        ],
        body,
    )
    .await
}

async fn peek(s: &ContractServer, sub: &str, timeout: u64) -> Answer {
    let url = format!(
        "{}/orders/subscriptions/{sub}/messages/head?timeout={timeout}",
        s.endpoint()
    );
    call("POST", &url, KEY, &[], "").await
}

#[tokio::test]
async fn send_fans_out_and_peek_lock_returns_the_message_with_its_properties() {
    let s = server().await;
    assert_eq!(
        send(&s, "hello", json!({"MessageId": "m-1"})).await.status,
        201
    );
    for sub in ["processing", "readiness"] {
        let got = peek(&s, sub, 1).await;
        assert_eq!(got.status, 201, "Send Message forwards a copy to {sub}");
        assert_eq!(got.body, "hello");
        let broker = got.broker();
        assert_eq!(broker["MessageId"], "m-1");
        assert_eq!(broker["DeliveryCount"], 1);
        for field in [
            "EnqueuedTimeUtc",
            "LockToken",
            "LockedUntilUtc",
            "SequenceNumber",
            "State",
            "TimeToLive",
        ] {
            assert!(
                broker.get(field).is_some(),
                "BrokerProperties carries {field}"
            );
        }
        assert_eq!(
            got.header("Priority"),
            Some("\"high\""),
            "custom properties come back as headers"
        );
        let location = got.header("Location").expect("the lock's URL");
        assert!(
            location.ends_with(broker["LockToken"].as_str().unwrap()),
            "{location}"
        );
    }
    assert_eq!(
        peek(&s, "processing", 1).await.status,
        204,
        "locked: nothing else to take"
    );
}

#[tokio::test]
async fn complete_removes_unlock_returns_and_a_used_lock_is_404() {
    let s = server().await;
    send(&s, "a", json!({"MessageId": "a"})).await;
    let got = peek(&s, "processing", 1).await;
    let location = got.header("Location").unwrap().to_string();
    assert_eq!(
        call("PUT", &location, KEY, &[], "").await.status,
        200,
        "unlock"
    );
    let again = peek(&s, "processing", 1).await;
    assert_eq!(again.status, 201, "available again at once after an unlock");
    assert_eq!(
        again.broker()["DeliveryCount"],
        2,
        "the unlocked delivery was counted"
    );
    assert_eq!(
        call("DELETE", &location, KEY, &[], "").await.status,
        404,
        "the old lock is gone"
    );
    let location = again.header("Location").unwrap().to_string();
    assert_eq!(
        call("DELETE", &location, KEY, &[], "").await.status,
        200,
        "complete"
    );
    assert_eq!(call("DELETE", &location, KEY, &[], "").await.status, 404);
    assert_eq!(
        peek(&s, "processing", 1).await.status,
        204,
        "completed: gone"
    );
    assert_eq!(s.counts("orders", "processing"), (0, 0, 0));
}

#[tokio::test]
async fn an_expired_lock_redelivers_and_renew_keeps_it() {
    let s = server().await;
    s.set_lock_duration(Duration::from_millis(600));
    send(&s, "slow", json!({"MessageId": "slow"})).await;
    let got = peek(&s, "processing", 1).await;
    let location = got.header("Location").unwrap().to_string();
    // Renewed meanwhile, the lock outlives its first duration (600 ms).
    let locked_at = std::time::Instant::now();
    wait_for(
        Duration::from_secs(10),
        "the first lock duration to pass",
        || async {
            let renewed = call("POST", &location, KEY, &[], "").await.status;
            assert_eq!(renewed, 200, "renew");
            (locked_at.elapsed() > Duration::from_millis(900)).then_some(())
        },
    )
    .await;
    assert_eq!(s.counts("orders", "processing").1, 1, "still locked");
    assert_eq!(
        peek(&s, "processing", 0).await.status,
        204,
        "still locked after 900 ms"
    );
    // Not renewed: it expires and comes back with the next delivery count.
    let again = peek(&s, "processing", 3).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.broker()["DeliveryCount"], 2);
    assert_eq!(
        call("DELETE", &location, KEY, &[], "").await.status,
        404,
        "the expired lock settles nothing"
    );
    s.expire_locks();
    let third = peek(&s, "processing", 1).await;
    assert_eq!(
        third.broker()["DeliveryCount"],
        3,
        "a lock lost early redelivers too"
    );
}

#[tokio::test]
async fn max_delivery_count_dead_letters() {
    let s = server().await;
    s.set_max_delivery_count(2);
    send(&s, "poison", json!({"MessageId": "p"})).await;
    for n in 1..=2 {
        let got = peek(&s, "processing", 1).await;
        assert_eq!(got.broker()["DeliveryCount"], n);
        let location = got.header("Location").unwrap().to_string();
        call("PUT", &location, KEY, &[], "").await;
    }
    assert_eq!(
        peek(&s, "processing", 1).await.status,
        204,
        "not delivered a third time"
    );
    assert_eq!(s.counts("orders", "processing"), (0, 0, 1));
    let url = format!(
        "{}/orders/subscriptions/processing/$DeadLetterQueue/messages/head",
        s.endpoint()
    );
    let dead = call("POST", &url, KEY, &[], "").await;
    assert_eq!((dead.status, dead.body.as_str()), (201, "poison"));
}

#[tokio::test]
async fn a_scheduled_message_waits_for_its_time() {
    let s = server().await;
    // A whole second (the date format's precision), at least two seconds ahead.
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(now + 3);
    let when = httpdate_of(at);
    send(
        &s,
        "later",
        json!({"MessageId": "l", "ScheduledEnqueueTimeUtc": when}),
    )
    .await;
    assert_eq!(
        peek(&s, "processing", 1).await.status,
        204,
        "invisible before its time"
    );
    let got = peek(&s, "processing", 5).await;
    assert_eq!(got.status, 201);
    assert!(SystemTime::now() >= at, "delivered at {when} or later");
}

/// `ScheduledEnqueueTimeUtc` as a client writes it (RFC 1123).
fn httpdate_of(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    // The server parses what it writes; reuse its format through a peek of a sent message
    // would be circular, so write the date the documented way here.
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil(days as i64);
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    format!(
        "{weekday}, {d:02} {} {y} {:02}:{:02}:{:02} GMT",
        months[(m - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[tokio::test]
async fn a_batch_send_adds_every_message() {
    let s = server().await;
    let batch = json!([
        {"Body": "one", "BrokerProperties": {"MessageId": "1"}, "UserProperties": {"kind": "x"}},
        {"Body": "two", "BrokerProperties": {"MessageId": "2"}},
    ]);
    let url = format!("{}/orders/messages", s.endpoint());
    let sent = call(
        "POST",
        &url,
        KEY,
        &[("Content-Type", BATCH_CONTENT_TYPE)],
        &batch.to_string(),
    )
    .await;
    assert_eq!(sent.status, 201);
    let first = peek(&s, "processing", 1).await;
    assert_eq!(
        (first.body.as_str(), first.broker()["MessageId"].clone()),
        ("one", json!("1"))
    );
    assert_eq!(first.header("kind"), Some("\"x\""));
    let second = peek(&s, "processing", 1).await;
    assert_eq!(second.body, "two");
    assert_eq!(s.counts("orders", "readiness").0, 2, "fanned out too");
}

#[tokio::test]
async fn missing_entities_are_410_and_bad_tokens_401() {
    let s = server().await;
    let missing = format!("{}/nothing/messages", s.endpoint());
    assert_eq!(call("POST", &missing, KEY, &[], "x").await.status, 410);
    let url = format!(
        "{}/orders/subscriptions/none/messages/head?timeout=1",
        s.endpoint()
    );
    assert_eq!(call("POST", &url, KEY, &[], "").await.status, 410);

    let url = format!("{}/orders/messages", s.endpoint());
    assert_eq!(
        call("POST", &url, "d3Jvbmc=", &[], "x").await.status,
        401,
        "wrong key"
    );
    let expired = sas_token(&url, KEY_NAME, KEY, expiry(-10));
    assert_eq!(
        request("POST", &url, &expired, &[], "x").await.status,
        401,
        "expired token"
    );
    let other = sas_token(
        &format!("{}/other/messages", s.endpoint()),
        KEY_NAME,
        KEY,
        expiry(60),
    );
    assert_eq!(
        request("POST", &url, &other, &[], "x").await.status,
        401,
        "token for another entity"
    );
    assert_eq!(
        request("POST", &url, "", &[], "x").await.status,
        401,
        "no token"
    );
    assert_eq!(
        s.counts("orders", "processing").0,
        0,
        "nothing refused was stored"
    );
}

#[tokio::test]
async fn the_azure_crate_sends_peek_locks_and_completes_through_the_endpoint_override() {
    use azure_messaging_servicebus::prelude::*;
    use azure_messaging_servicebus::service_bus::{SendMessageOptions, SettableBrokerProperties};
    let s = server().await;
    let http = wharf_host::external::servicebus::http_client(Some(&s.endpoint())).unwrap();
    let client = TopicClient::new(http, "shop", "orders", KEY_NAME, KEY).unwrap();
    client
        .topic_sender()
        .send_message(
            "from the crate",
            Some(SendMessageOptions {
                broker_properties: Some(SettableBrokerProperties {
                    message_id: Some("crate-1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        )
        .await
        .expect("sent");
    let receiver = client.subscription_receiver("processing");
    let locked = receiver
        .peek_lock_message2(Some(Duration::from_secs(1)))
        .await
        .expect("peek-locked");
    assert_eq!(locked.status().to_string(), "201");
    assert_eq!(locked.body(), "from the crate");
    let broker = locked
        .broker_properties()
        .expect("every field the crate requires");
    assert_eq!(
        (broker.message_id.as_str(), broker.delivery_count),
        ("crate-1", 1)
    );
    locked.delete_message().await.expect("completed");
    assert_eq!(s.counts("orders", "processing"), (0, 0, 0));
    let empty = receiver
        .peek_lock_message2(Some(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(
        empty.status().to_string(),
        "204",
        "empty: 204 and Ok, as documented"
    );
}

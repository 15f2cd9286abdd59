//! Rate limits (`rate_limit`, `burst`): two hosts on one PostgreSQL share a queue's budget,
//! a SQLite queue keeps its rate, and an external queue's limit holds on its host; messages
//! over the limit wait, never leased early or counted as an attempt. The handler (`flaky`)
//! echoes each message into `replies` with the time it ran, the moment a protected service
//! would see its call.

use std::time::Duration;

use serde_json::json;
use wharf_host::RunningHost;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{NewMessage, Status, StoredMessage};
use wharf_tests::{PgSchema, TestDir, count, database_url, messages, wait_for};

/// The most `times` (Unix ms) that fall in any one-second window `[t, t + 1000)`.
fn busiest_second(times: &mut [i64]) -> usize {
    times.sort_unstable();
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= 1000 {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// `n` messages for the `flaky` fixture: each echoes into `replies` when its handler ran.
fn backlog(n: usize) -> Vec<NewMessage> {
    (0..n)
        .map(|i| NewMessage {
            payload: json!({ "n": i, "reply_to": "replies", "stamp": true }).to_string(),
            ..Default::default()
        })
        .collect()
}

/// When each message's handler ran (Unix ms), from the echoes in `replies`.
async fn ran_at(host: &RunningHost) -> Vec<i64> {
    messages(host, "replies")
        .await
        .iter()
        .map(|m| {
            let echo: serde_json::Value = serde_json::from_str(&m.payload).expect("an echo");
            echo["ran_at_ms"].as_i64().expect("a stamped echo")
        })
        .collect()
}

const SHARED_LIMIT: &str = r#"[queues.calls]
handler = "flaky"
rate_limit = "200/s"
burst = 10

[queues.replies]
"#;

async fn processed(host: &RunningHost, queue: &str) -> Vec<StoredMessage> {
    messages(host, queue)
        .await
        .into_iter()
        .filter(|m| m.status == Status::Processed)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hosts_share_one_budget_of_200_a_second() {
    let schema = PgSchema::new();
    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 4)
        .await
        .expect("opening the schema");
    store
        .enqueue_many("calls", backlog(5_000), false)
        .await
        .expect("enqueueing the backlog");
    let dirs = [TestDir::new(), TestDir::new()];
    for dir in &dirs {
        dir.deploy("flaky", "flaky");
    }
    let a = dirs[0].start_host(&schema, "host-a", SHARED_LIMIT).await;
    let b = dirs[1].start_host(&schema, "host-b", SHARED_LIMIT).await;
    wait_for(Duration::from_secs(60), "5,000 messages processed", || {
        let store = store.clone();
        async move {
            let counts = store.counts("calls").await.expect("counting");
            let done = counts.iter().find(|(s, _)| *s == Status::Processed);
            (done.map(|(_, n)| *n) == Some(5_000)).then_some(())
        }
    })
    .await;
    let done = processed(&a, "calls").await;
    let mut ran = ran_at(&a).await;
    a.shutdown().await;
    b.shutdown().await;
    assert!(
        done.iter().all(|m| m.attempts == 1),
        "waiting for budget is not an attempt"
    );
    // The total from the outcomes' commit times: 5,000 at 200 a second (from an empty
    // budget: one at once, then one every 5 ms) is 24.995 s.
    let mut committed: Vec<i64> = done.iter().filter_map(|m| m.processed_at_ms).collect();
    assert_eq!(committed.len(), 5_000);
    committed.sort_unstable();
    let took = committed[committed.len() - 1] - committed[0];
    assert!(
        (23_750..=26_250).contains(&took),
        "5,000 messages at 200/s took {took} ms, not 25 s ± 5 %"
    );
    // The windows from the moments the handlers ran, which is what the limit protects (a
    // commit's time also holds the store's pauses: a 80 ms pause of a PostgreSQL commit
    // stamps 16 messages' outcomes at once).
    assert_eq!(ran.len(), 5_000, "one echo per message");
    let most = busiest_second(&mut ran);
    assert!(
        most <= 210,
        "{most} messages processed in one second (limit 200, burst 10)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_queue_keeps_its_rate_and_counts_no_attempt_for_waiting() {
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start("[queues.calls]\nhandler = \"flaky\"\nrate_limit = \"20/s\"\n\n[queues.replies]\n")
        .await;
    host.store
        .enqueue_many("calls", backlog(40), false)
        .await
        .unwrap();
    wait_for(Duration::from_secs(20), "40 messages processed", || async {
        (count(&host, "calls", Status::Processed).await == 40).then_some(())
    })
    .await;
    let done = processed(&host, "calls").await;
    let ran = ran_at(&host).await;
    host.shutdown().await;
    assert_twenty_a_second(ran);
    assert!(done.iter().all(|m| m.attempts == 1));
}

/// 40 handler runs at `20/s` with the default burst (1), from an empty budget: one at once,
/// then one every 50 ms — 1.95 s, never more than 20 in a second.
fn assert_twenty_a_second(mut ran: Vec<i64>) {
    assert_eq!(ran.len(), 40, "one echo per message");
    ran.sort_unstable();
    let took = ran[39] - ran[0];
    assert!(
        (1_850..=2_300).contains(&took),
        "took {took} ms, not ~1.95 s"
    );
    assert!(busiest_second(&mut ran) <= 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_queue_keeps_its_rate_on_its_host() {
    let prefix = wharf_tests::unique_prefix("rate");
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir
        .start(&format!(
            r#"
[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"

[queues.remote]
handler = "flaky"
storage = "external"
provider = "main"
rate_limit = "20/s"

[queues.replies]
"#,
            url = wharf_tests::redis_url()
        ))
        .await;
    for n in 0..40 {
        let message = NewMessage {
            payload: json!({ "reply_to": "replies", "n": n, "stamp": true }).to_string(),
            ..Default::default()
        };
        host.router.enqueue("remote", message).await.unwrap();
    }
    wait_for(Duration::from_secs(20), "40 replies", || async {
        (messages(&host, "replies").await.len() == 40).then_some(())
    })
    .await;
    let ran = ran_at(&host).await;
    host.shutdown().await;
    assert_twenty_a_second(ran);
}

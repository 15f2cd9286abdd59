//! Handler state through crashes: messages each increment one shared counter and one of
//! seven per-customer keys while `wharf run` processes are SIGKILLed mid-load — two hosts on
//! one PostgreSQL (ten kills, the hosts in turn) and one host on SQLite — with the SQL inbox
//! on. Every change commits with its message's settlement, so the counter ends equal
//! to the message count and every per-customer total is exact: nothing lost, nothing twice.
//! `WHARF_STATE_CRASH_MESSAGES` sets the count (2,000 by default; `cargo xtask chaos` runs
//! 100,000). Messages from Kafka and RabbitMQ are the fault matrix's `kills` rows (`chaos`).

use std::time::{Duration, Instant};

use serde_json::json;
use wharf_host::queue::{NewMessage, QueueStore, Status};
use wharf_tests::{PgSchema, TestDir, WharfProcess, database_url, spawn_wharf};

const QUEUES: &str = r#"
[handlers.kv]
keyvalue = ["counters"]

[queues.work]
handler = "kv"
concurrency = 8
lease = "2s"
timeout = "1s"
max_attempts = 1000
backoff = "20ms"
max_backoff = "100ms"
inbox = { store = "sql" }
"#;

const CUSTOMERS: u64 = 7;

/// SIGKILLs per case.
const KILLS: usize = 10;

fn messages() -> u64 {
    std::env::var("WHARF_STATE_CRASH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// The committed value of `counters`/`key` as a number (absent: 0).
async fn counter(store: &dyn QueueStore, key: &str) -> u64 {
    let read = store.state_read("counters", key).await.unwrap();
    read.map_or(0, |(v, _)| String::from_utf8(v).unwrap().parse().unwrap())
}

async fn processed(store: &dyn QueueStore) -> u64 {
    let counts = store.counts("work").await.unwrap();
    counts
        .iter()
        .find(|(s, _)| *s == Status::Processed)
        .map_or(0, |(_, n)| *n)
}

async fn enqueue(store: &dyn QueueStore, total: u64) {
    let batch: Vec<NewMessage> = (0..total)
        .map(|n| NewMessage {
            id: Some(format!("m-{n}")),
            payload: json!({"incr": ["total", format!("customer-{}", n % CUSTOMERS)]}).to_string(),
            ..NewMessage::default()
        })
        .collect();
    store.enqueue_many("work", batch, false).await.unwrap();
}

/// Kill one of `hosts` (in turn) each time another `1 / (2 × kills)` of the work is done,
/// `kills` times, until every message is processed.
async fn kill_until_done(
    dirs: &[&TestDir],
    store: &dyn QueueStore,
    total: u64,
    kills: usize,
) -> usize {
    let mut hosts: Vec<WharfProcess> = dirs.iter().map(|d| spawn_wharf(d.dir.path())).collect();
    // Long forms (`cargo xtask chaos`: 100,000 messages) get 2 ms more per message.
    let deadline = Instant::now() + Duration::from_secs(300) + Duration::from_millis(2 * total);
    let (mut killed, mut at_last_kill) = (0, 0);
    loop {
        let done = processed(store).await;
        if done == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not done after {killed} kills: {done} of {total} processed"
        );
        if killed < kills && done >= at_last_kill + total / (2 * kills as u64) {
            let which = killed % hosts.len();
            hosts[which].kill();
            hosts[which] = spawn_wharf(dirs[which].dir.path());
            killed += 1;
            at_last_kill = done;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for host in &mut hosts {
        tokio::task::block_in_place(|| host.terminate());
    }
    killed
}

async fn assert_exact(store: &dyn QueueStore, total: u64) {
    assert_eq!(counter(store, "total").await, total, "the shared counter");
    for c in 0..CUSTOMERS {
        let expected = (0..total).filter(|n| n % CUSTOMERS == c).count() as u64;
        let key = format!("customer-{c}");
        assert_eq!(counter(store, &key).await, expected, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_postgres_killed_ten_times_count_every_message_once() {
    wharf_tests::init_logging();
    let schema = PgSchema::new();
    let storage = format!(
        "url = \"{}\"\nschema = \"{}\"\npoll_interval = \"50ms\"",
        database_url(),
        schema.name
    );
    let dirs = [TestDir::new(), TestDir::new()];
    for dir in &dirs {
        dir.deploy("kv", "kv_state");
        dir.write_config_with_storage(&storage, QUEUES);
    }
    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 2)
        .await
        .unwrap();
    let total = messages();
    enqueue(&*store, total).await;
    let killed = kill_until_done(&[&dirs[0], &dirs[1]], &*store, total, KILLS).await;
    assert_eq!(killed, KILLS, "every kill while the load ran");
    assert_exact(&*store, total).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_on_sqlite_killed_ten_times_counts_every_message_once() {
    wharf_tests::init_logging();
    let dir = TestDir::new();
    dir.deploy("kv", "kv_state");
    dir.write_config(QUEUES);
    let store = dir.sqlite_store().await;
    let total = messages();
    enqueue(&*store, total).await;
    let killed = kill_until_done(&[&dir], &*store, total, KILLS).await;
    assert_eq!(killed, KILLS, "every kill while the load ran");
    assert_exact(&*store, total).await;
}

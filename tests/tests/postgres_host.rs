//! The host on PostgreSQL: processing end to end, wake-ups by notification instead of
//! polling, two hosts sharing one queue, carrying on after the connections are killed, and
//! handlers going on while outcomes wait for their write.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wharf_host::enqueue::Enqueuer;
use wharf_host::queue::{
    Disposition, NewMessage, QueueStore, Settlement, SqlStore, Status, VACUUM_AFTER_LEASES,
};
use wharf_tests::{
    PgSchema, TestDir, count, database_url, messages, msg, scrape, wait_for, wait_status,
};

const T: Duration = Duration::from_secs(30);

const QUEUES: &str = r#"
[queues.work]
handler = "flaky"
concurrency = 8
backoff = "10ms"
max_backoff = "20ms"

[queues.replies]
handler = "not-deployed"
"#;

/// How many times each `n` was reported in the replies queue.
async fn replies(host: &wharf_host::RunningHost) -> BTreeMap<i64, usize> {
    let mut seen = BTreeMap::new();
    for m in messages(host, "replies").await {
        let v: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        *seen.entry(v["seen"]["n"].as_i64().unwrap()).or_default() += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_processed_on_postgres() {
    let schema = PgSchema::new();
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    let host = dir.start_postgres(&schema, "100ms", QUEUES).await;
    let ok = host
        .router
        .enqueue("work", msg(json!({"reply_to": "replies", "n": 1})))
        .await
        .unwrap();
    let retried = host
        .router
        .enqueue("work", msg(json!({"transient_until": 2})))
        .await
        .unwrap();
    let failed = host
        .router
        .enqueue("work", msg(json!({"permanent": "no"})))
        .await
        .unwrap();
    wait_status(&host, ok.key, Status::Processed, T).await;
    assert_eq!(
        wait_status(&host, retried.key, Status::Processed, T)
            .await
            .attempts,
        2
    );
    let f = wait_status(&host, failed.key, Status::Failed, T).await;
    assert_eq!(f.last_error.as_deref(), Some("permanent error: no"));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_enqueue_wakes_the_host_by_notification() {
    let schema = PgSchema::new();
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    // Polling every minute: only a notification can make processing prompt.
    let host = dir.start_postgres(&schema, "60s", QUEUES).await;
    // Enqueue only once the host listens: one that arrived earlier would be picked up by the
    // wake-up that follows connecting the listener, not by its notification.
    let observer = sqlx::PgPool::connect(&database_url()).await.unwrap();
    wait_for(T, "the host to listen for notifications", || async {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'",
        )
        .bind(format!("wharf:{}", schema.name))
        .fetch_one(&observer)
        .await
        .unwrap();
        (listening > 0).then_some(())
    })
    .await;
    let producer = SqlStore::open_postgres(&database_url(), Some(&schema.name), 2)
        .await
        .unwrap();
    for n in 0..3 {
        let started = Instant::now();
        let m = producer
            .enqueue("work", msg(json!({"n": n})), false)
            .await
            .unwrap();
        wait_status(&host, m.key, Status::Processed, Duration::from_secs(10)).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "woken by NOTIFY, not the 60 s poll: {:?}",
            started.elapsed()
        );
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_share_a_queue_and_process_each_message_once() {
    let schema = PgSchema::new();
    let (a, b) = (TestDir::new(), TestDir::new());
    a.deploy("flaky", "flaky");
    b.deploy("flaky", "flaky");
    let host_a = Arc::new(a.start_postgres(&schema, "50ms", QUEUES).await);
    let host_b = b.start_postgres(&schema, "50ms", QUEUES).await;
    const N: i64 = 1000;
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..4 {
        let host = host_a.clone();
        producers.spawn(async move {
            for n in (p..N).step_by(4) {
                host.router
                    .enqueue("work", msg(json!({"reply_to": "replies", "n": n})))
                    .await
                    .unwrap();
            }
        });
    }
    producers.join_all().await;
    wait_for(T, "every message processed", || async {
        (count(&host_a, "work", Status::Processed).await == N as u64).then_some(())
    })
    .await;
    let seen = replies(&host_a).await;
    assert_eq!(seen.len() as i64, N, "every message handled");
    assert!(seen.values().all(|c| *c == 1), "no message handled twice");
    host_b.shutdown().await;
    Arc::try_unwrap(host_a).ok().unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced_and_nothing_is_lost() {
    let schema = PgSchema::new();
    let dir = TestDir::new();
    dir.deploy("flaky", "flaky");
    // A lease whose commit was lost with its connection comes back after 3 s.
    let queues = QUEUES.replace(
        "concurrency = 8",
        "concurrency = 8\nlease = \"3s\"\ntimeout = \"2s\"",
    );
    let host = dir.start_postgres(&schema, "50ms", &queues).await;
    use sqlx::Connection;
    let mut killer = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    const N: i64 = 400;
    for n in 0..N {
        // A producer retries an enqueue that hit a killed connection.
        let mut tries = 0;
        while let Err(e) = host
            .router
            .enqueue("work", msg(json!({"reply_to": "replies", "n": n})))
            .await
        {
            tries += 1;
            assert!(tries < 5, "enqueue keeps failing: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if n % 100 == 50 {
            // Kill every connection this host has open (its application name names the schema).
            sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1")
                .bind(format!("wharf:{}", schema.name))
                .execute(&mut killer)
                .await
                .unwrap();
        }
    }
    wait_for(
        Duration::from_secs(60),
        "every message processed after reconnects",
        || async {
            let done = host.store.counts("work").await.ok()?;
            (done
                .iter()
                .find(|(s, _)| *s == Status::Processed)
                .map(|(_, n)| *n)
                == Some(N as u64))
            .then_some(())
        },
    )
    .await;
    let seen = replies(&host).await;
    assert_eq!(seen.len() as i64, N, "every message handled");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_starting_at_once_on_a_new_schema_all_open_it() {
    // `CREATE … IF NOT EXISTS` alone lets one of two simultaneous creators fail.
    for _ in 0..3 {
        let schema = wharf_tests::PgSchema::new();
        let url = wharf_tests::database_url();
        let opens = (0..4).map(|_| wharf_host::queue::open(&url, Some(&schema.name), 1));
        for opened in futures_util::future::join_all(opens).await {
            opened.expect("every host opens the new schema");
        }
    }
}

/// A lease leaves a dead entry at the front of the ready index, which every later lease steps
/// over until the table is vacuumed: the store vacuums its own table once enough messages
/// were leased, without waiting for autovacuum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_vacuums_its_table_once_enough_messages_were_leased() {
    let schema = PgSchema::new();
    let store = SqlStore::open_postgres(&database_url(), Some(&schema.name), 4)
        .await
        .unwrap();
    let total = VACUUM_AFTER_LEASES as usize + 500;
    let backlog: Vec<NewMessage> = (0..total)
        .map(|n| NewMessage {
            payload: format!("{{\"n\":{n}}}"),
            ..NewMessage::default()
        })
        .collect();
    store.enqueue_many("work", backlog, false).await.unwrap();
    let vacuums = || async {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&database_url())
            .await
            .unwrap();
        let count: i64 = sqlx::query_scalar(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'messages'",
        )
        .bind(&schema.name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        count
    };
    assert_eq!(vacuums().await, 0, "no vacuum before any lease");

    let mut leased = 0;
    while leased < total {
        let batch = store.lease("work", 500, 60_000).await.unwrap();
        assert!(!batch.is_empty(), "the backlog ran out after {leased}");
        leased += batch.len();
        let done: Vec<Settlement> = batch
            .iter()
            .map(|m| Settlement::new(m.lease, Disposition::Complete))
            .collect();
        store.settle(&done).await.unwrap();
    }
    wait_for(
        T,
        "the store's own vacuum of its messages table",
        || async { (vacuums().await >= 1).then_some(()) },
    )
    .await;
}

/// Handlers go on while outcomes wait for their write: with `concurrency = 1`, up to eight
/// outcomes may wait, so while the first write is held up (the inbox table it records into is
/// locked) nine handlers finish — the one whose outcome is written, seven waiting behind it and
/// one holding the processing slot — and nothing is lost when the write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_go_on_while_outcomes_wait_for_their_write() {
    use sqlx::{Connection, Executor};
    let schema = PgSchema::new();
    let dir = TestDir::new();
    dir.deploy("noop", "noop");
    let host = dir
        .start_postgres(
            &schema,
            "50ms",
            "[queues.work]\nhandler = \"noop\"\nconcurrency = 1\ninbox = { store = \"sql\" }\n",
        )
        .await;
    let mut holder = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    held.execute(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE \"{}\".wharf_inbox IN EXCLUSIVE MODE",
        schema.name
    )))
    .await
    .unwrap();
    let messages: Vec<NewMessage> = (0..12).map(|n| msg(json!({ "n": n }))).collect();
    host.store
        .enqueue_many("work", messages, false)
        .await
        .unwrap();

    let processed = r#"wharf_messages_total{queue="work",outcome="processed"}"#;
    wait_for(
        T,
        "nine handlers finished while the first write waits",
        || async { (scrape(&host).await.get(processed).copied() == Some(9.0)).then_some(()) },
    )
    .await;
    assert_eq!(count(&host, "work", Status::Processed).await, 0);
    held.rollback().await.unwrap();
    wait_for(
        T,
        "every message processed once the write went through",
        || async { (count(&host, "work", Status::Processed).await == 12).then_some(()) },
    )
    .await;
    assert_eq!(scrape(&host).await.get(processed).copied(), Some(12.0));
    host.shutdown().await;
}

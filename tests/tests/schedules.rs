//! Periodic messages (`[schedules.NAME]`) on PostgreSQL: several hosts enqueue each tick
//! exactly once, and a host that starts after every host was down catches the missed ticks
//! up per `catch_up`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use wharf_host::queue::{MessageFilter, QueueStore, StoredMessage};
use wharf_host::{RunningHost, clock::now_ms};
use wharf_tests::{PgSchema, TestDir, wait_for};

const SCHEDULED_AT: &str = "wharf-scheduled-at";

/// A host `id` on `schema` with a schedule every second into the queue `ticks` (no handler:
/// its messages stay pending).
async fn start_host(dir: &TestDir, schema: &PgSchema, id: &str, catch_up: &str) -> RunningHost {
    let rest = format!(
        r#"[queues.ticks]

[schedules.every-second]
cron = "* * * * * *"
queue = "ticks"
payload = {{ report = "daily" }}
headers = {{ team = "ops" }}
catch_up = "{catch_up}"
"#
    );
    dir.start_host(schema, id, &rest).await
}

async fn all_ticks(store: &Arc<dyn QueueStore>) -> Vec<StoredMessage> {
    let filter = MessageFilter {
        queue: Some("ticks".into()),
        limit: 100_000,
        ..Default::default()
    };
    store.list(&filter).await.expect("listing ticks")
}

fn header<'m>(m: &'m StoredMessage, name: &str) -> Option<&'m str> {
    m.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A message's tick (Unix ms), from its `wharf-scheduled-at` header.
fn tick_of(m: &StoredMessage) -> i64 {
    let at = header(m, SCHEDULED_AT).expect("a scheduled message says its tick");
    humantime::parse_rfc3339(at)
        .expect("RFC 3339")
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn wait_ticks(store: &Arc<dyn QueueStore>, n: usize, what: &str) -> Vec<StoredMessage> {
    wait_for(Duration::from_secs(40), what, || async {
        let ticks = all_ticks(store).await;
        (ticks.len() >= n).then_some(ticks)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hosts_enqueue_each_tick_exactly_once() {
    let schema = PgSchema::new();
    let dirs = [TestDir::new(), TestDir::new(), TestDir::new()];
    let mut hosts = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        hosts.push(start_host(dir, &schema, &format!("host-{i}"), "latest").await);
    }
    let store = hosts[0].store.clone();
    wait_ticks(&store, 11, "11 ticks from three hosts").await;
    for host in hosts {
        host.shutdown().await;
    }
    let messages = all_ticks(&store).await;
    let ticks: Vec<i64> = messages.iter().map(tick_of).collect();
    let distinct: BTreeSet<i64> = ticks.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ticks.len(),
        "a tick enqueued twice: {ticks:?}"
    );
    let ids: BTreeSet<&str> = messages.iter().filter_map(|m| m.id.as_deref()).collect();
    assert_eq!(ids.len(), messages.len(), "every tick has its own id");
    let (first, last) = (*distinct.first().unwrap(), *distinct.last().unwrap());
    assert_eq!(
        (last - first) / 1000 + 1,
        distinct.len() as i64,
        "one message per second from the first tick to the last, none missing: {distinct:?}"
    );
    assert!(
        distinct.iter().all(|t| t % 1000 == 0),
        "ticks on whole seconds"
    );
    for m in &messages {
        assert_eq!(m.payload, r#"{"report":"daily"}"#);
        assert_eq!(header(m, "team"), Some("ops"));
        assert_eq!(header(m, "wharf-schedule"), Some("every-second"));
        assert_eq!(header(m, "wharf-catch-up"), None, "no host was down");
    }
    let rows = store.schedules().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].enqueued as usize, messages.len());
    assert_eq!(rows[0].last_tick_ms, last);
    let host = rows[0].last_host.as_deref().unwrap();
    assert!(
        host.starts_with("host-"),
        "the last tick names its host: {host}"
    );
    let hosts = store.hosts().await.unwrap();
    assert_eq!(hosts.len(), 3);
    assert!(
        hosts.iter().all(|h| h.stopped_at_ms.is_some()),
        "each host recorded its stop: {hosts:?}"
    );
}

/// Run a host until it enqueued 2 ticks, stop it, let 5 ticks pass with no host, start it
/// again and wait for a tick after the restart. Returns the messages, the ticks missed while
/// down (the whole seconds in (last tick before the stop, restart]) and the missed count the
/// schedule recorded.
async fn down_for_five_seconds(catch_up: &str) -> (Vec<StoredMessage>, Vec<i64>, i64) {
    let schema = PgSchema::new();
    let dir = TestDir::new();
    let host = start_host(&dir, &schema, "solo", catch_up).await;
    let store = host.store.clone();
    wait_ticks(&store, 2, "2 ticks before the stop").await;
    host.shutdown().await;
    let last_before = store.schedules().await.unwrap()[0].last_tick_ms;
    // Five ticks come due with no host running.
    wait_for(Duration::from_secs(10), "5 ticks to pass", || async {
        (now_ms() > last_before + 5_300).then_some(())
    })
    .await;
    let restarted_at = now_ms();
    let host = start_host(&dir, &schema, "solo", catch_up).await;
    let after = wait_for(
        Duration::from_secs(20),
        "a tick after the restart",
        || async {
            let ticks = all_ticks(&store).await;
            ticks
                .iter()
                .any(|m| tick_of(m) > restarted_at + 1000 && header(m, "wharf-catch-up").is_none())
                .then_some(())
        },
    );
    after.await;
    host.shutdown().await;
    let messages = all_ticks(&store).await;
    let first_normal = messages
        .iter()
        .filter(|m| tick_of(m) > last_before && header(m, "wharf-catch-up").is_none())
        .map(tick_of)
        .min()
        .unwrap();
    let missed: Vec<i64> = ((last_before + 1000)..first_normal).step_by(1000).collect();
    assert!(missed.len() >= 5, "at least 5 ticks while down: {missed:?}");
    let recorded_missed = store.schedules().await.unwrap()[0].missed;
    (messages, missed, recorded_missed)
}

fn caught_up(messages: &[StoredMessage]) -> Vec<i64> {
    let mut ticks: Vec<i64> = messages
        .iter()
        .filter(|m| header(m, "wharf-catch-up") == Some("true"))
        .map(tick_of)
        .collect();
    ticks.sort();
    ticks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_latest_enqueues_the_last_missed_tick_once() {
    let (messages, missed, recorded) = down_for_five_seconds("latest").await;
    assert_eq!(caught_up(&messages), [*missed.last().unwrap()]);
    assert_eq!(recorded as usize, missed.len() - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_all_enqueues_every_missed_tick() {
    let (messages, missed, recorded) = down_for_five_seconds("all").await;
    assert_eq!(caught_up(&messages), missed);
    assert_eq!(recorded, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_none_skips_the_missed_ticks() {
    let (messages, missed, recorded) = down_for_five_seconds("none").await;
    assert_eq!(caught_up(&messages), Vec::<i64>::new());
    assert_eq!(recorded as usize, missed.len());
    for m in &messages {
        assert!(!missed.contains(&tick_of(m)), "a missed tick was enqueued");
    }
}

/// A schedule into a queue whose pending messages live in Redis: each tick's message is
/// written into the outbox with the claim and published from there, once per tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_for_a_broker_queue_go_through_the_outbox_once_each() {
    use redis::AsyncCommands;
    let prefix = wharf_tests::unique_prefix("sched");
    let dir = TestDir::new();
    let host = dir
        .start(&format!(
            r#"
[providers.main]
type = "redis"
url = "{url}"
key_prefix = "{prefix}"

[queues.remote]
storage = "external"
provider = "main"

[schedules.pulse]
cron = "* * * * * *"
queue = "remote"
"#,
            url = wharf_tests::redis_url()
        ))
        .await;
    let keys = wharf_host::external::redis::Keys::new(&prefix, "remote");
    let mut redis = redis::Client::open(wharf_tests::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(30),
        "3 ticks published to Redis",
        || {
            let (mut redis, ready) = (redis.clone(), keys.ready.clone());
            async move {
                let held: u64 = redis.zcard(&ready).await.unwrap();
                (held >= 3).then_some(())
            }
        },
    )
    .await;
    let store = host.store.clone();
    host.shutdown().await;
    let enqueued = store.schedules().await.unwrap()[0].enqueued as u64;
    // What the outbox still held at the stop is published by the next host; the rest is in
    // Redis, each tick once.
    let backlog: u64 = store
        .outbox_backlog()
        .await
        .unwrap()
        .iter()
        .map(|b| b.rows)
        .sum();
    let held: u64 = redis.zcard(&keys.ready).await.unwrap();
    assert_eq!(held + backlog, enqueued, "each claimed tick published once");
    let envelopes: Vec<String> = redis.zrange(&keys.ready, 0, -1).await.unwrap();
    let ids: BTreeSet<String> = envelopes
        .iter()
        .map(|e| {
            let e: serde_json::Value = serde_json::from_str(e).unwrap();
            e["MessageId"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids.len(), envelopes.len(), "one envelope per tick: {ids:?}");
    assert!(
        ids.iter().all(|id| id.starts_with("pulse@")),
        "the ticks' ids: {ids:?}"
    );
    assert!(
        all_ticks(&store).await.is_empty(),
        "nothing in the SQL queue"
    );
}

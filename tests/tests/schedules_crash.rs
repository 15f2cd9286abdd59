//! Schedules through crashes: two `wharf run` processes on one PostgreSQL share a schedule
//! that ticks every second while they are SIGKILLed — one at a time, and both at once — and
//! started again at once. A tick's claim and its message commit together, so every second
//! from the first tick to the last is enqueued exactly once: none twice, none missing.

use std::collections::BTreeSet;
use std::time::Duration;

use wharf_host::queue::{MessageFilter, QueueStore};
use wharf_tests::{PgSchema, TestDir, WharfProcess, database_url, spawn_wharf, wait_for};

const SCHEDULE: &str = r#"[queues.ticks]

[schedules.every-second]
cron = "* * * * * *"
queue = "ticks"
"#;

/// The ticks enqueued so far (Unix ms, from the ids `every-second@RFC3339`), with repeats.
async fn ticks(store: &dyn QueueStore) -> Vec<i64> {
    let filter = MessageFilter {
        queue: Some("ticks".into()),
        limit: 100_000,
        ..Default::default()
    };
    let messages = store.list(&filter).await.expect("listing ticks");
    messages
        .iter()
        .map(|m| {
            let id = m.id.as_deref().expect("a tick has an id");
            let at = id.strip_prefix("every-second@").expect("the schedule's id");
            humantime::parse_rfc3339(at)
                .expect("RFC 3339")
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        })
        .collect()
}

/// Wait until more than `seen` ticks are enqueued; returns how many.
async fn more_ticks_than(store: &dyn QueueStore, seen: usize) -> usize {
    wait_for(Duration::from_secs(30), "a new tick", || async {
        let n = ticks(store).await.len();
        (n > seen).then_some(n)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_hosts_enqueue_every_tick_exactly_once() {
    let schema = PgSchema::new();
    let dirs = [TestDir::new(), TestDir::new()];
    dirs[0].write_host_config(&schema, "host-a", SCHEDULE);
    dirs[1].write_host_config(&schema, "host-b", SCHEDULE);
    let mut hosts: Vec<WharfProcess> = dirs.iter().map(|d| spawn_wharf(d.dir.path())).collect();
    let store = wharf_host::queue::open(&database_url(), Some(&schema.name), 2)
        .await
        .expect("opening the schema");
    let mut seen = more_ticks_than(&*store, 0).await;
    // Eight kills: host a, host b, both; host a, host b, both; … — each host started again at
    // once, and the next kill only after a tick came from the hosts now running.
    for kill in 0..8 {
        let which: &[usize] = match kill % 3 {
            0 => &[0],
            1 => &[1],
            _ => &[0, 1],
        };
        for &i in which {
            hosts[i].kill();
        }
        for &i in which {
            hosts[i] = spawn_wharf(dirs[i].dir.path());
        }
        seen = more_ticks_than(&*store, seen).await;
    }
    more_ticks_than(&*store, seen).await;
    for host in &mut hosts {
        host.terminate();
    }
    let all = ticks(&*store).await;
    let distinct: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "a tick enqueued twice: {all:?}");
    let (first, last) = (*distinct.first().unwrap(), *distinct.last().unwrap());
    assert_eq!(
        ((last - first) / 1000 + 1) as usize,
        distinct.len(),
        "a second between the first tick and the last is missing: {distinct:?}"
    );
    let rows = store.schedules().await.unwrap();
    assert_eq!(
        rows[0].enqueued as usize,
        all.len(),
        "the row counts each message once"
    );
}

//! The SQL queue's message counts by status as the sampler last counted them. Counting a
//! queue with a million messages takes a noticeable fraction of a second (and slowed the
//! drain by ~10 % on PostgreSQL when a dashboard asked for it every few seconds), so the
//! message API and the dashboard answer from this snapshot, refreshed every
//! `host.metrics_interval`, whatever the number of readers. A change made through the API asks
//! for a fresh count sooner (at most once per [`MIN_GAP`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::queue::{Status, now_ms};

/// The shortest time between two counts asked for by changes made through the API.
pub const MIN_GAP: Duration = Duration::from_secs(5);

/// One queue's counts and when they were taken.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Messages by status.
    pub counts: Vec<(Status, u64)>,
    /// When they were counted (ms since the epoch).
    pub at_ms: i64,
    /// Then: when the oldest ready message of the SQL queue became ready (`None`: none was).
    pub oldest_ready_ms: Option<i64>,
    /// Then, for a Kafka queue: its processing group's lag (messages).
    pub lag: Option<u64>,
}

static LATEST: Mutex<Option<HashMap<String, Snapshot>>> = Mutex::new(None);
static WANTED: Notify = Notify::const_new();

/// Keep `counts` as the latest of `queue`.
pub fn record(queue: &str, counts: Vec<(Status, u64)>) {
    let mut latest = LATEST.lock().expect("counts");
    let all = latest.get_or_insert_with(HashMap::new);
    let before = all.get(queue);
    let snapshot = Snapshot {
        counts,
        at_ms: now_ms(),
        oldest_ready_ms: before.and_then(|s| s.oldest_ready_ms),
        lag: before.and_then(|s| s.lag),
    };
    all.insert(queue.to_string(), snapshot);
}

/// Keep what waits in `queue` (sampled beside its counts): the oldest ready message's
/// ready time and, for a Kafka queue, the lag.
pub fn record_waiting(queue: &str, oldest_ready_ms: Option<i64>, lag: Option<u64>) {
    let mut latest = LATEST.lock().expect("counts");
    if let Some(snapshot) = latest.get_or_insert_with(HashMap::new).get_mut(queue) {
        snapshot.oldest_ready_ms = oldest_ready_ms;
        snapshot.lag = lag;
    }
}

/// The latest counts of `queue`.
pub fn latest(queue: &str) -> Option<Snapshot> {
    LATEST
        .lock()
        .expect("counts")
        .as_ref()
        .and_then(|all| all.get(queue).cloned())
}

/// Ask the sampler for a fresh count soon (after a change made through the API, say).
pub fn want_fresh() {
    WANTED.notify_one();
}

/// Resolves when a reader asked for fresh counts.
pub(super) async fn wanted() {
    WANTED.notified().await;
}

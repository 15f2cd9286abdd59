//! The SQL queue's message counts by status as the sampler last counted them. Counting a
//! queue with a million messages takes a noticeable fraction of a second, so the message API
//! and the dashboard answer from this snapshot at once and ask the sampler for a fresh count
//! instead of counting per request: however many dashboards and scrapers are open, the
//! database counts each queue at most once per [`MIN_GAP`] (and every `host.metrics_interval`
//! when nobody asks).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::queue::{Status, now_ms};

/// The shortest time between two counts of the same queue asked for by readers.
pub const MIN_GAP: Duration = Duration::from_secs(2);

/// One queue's counts and when they were taken.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Messages by status.
    pub counts: Vec<(Status, u64)>,
    /// When they were counted (ms since the epoch).
    pub at_ms: i64,
}

static LATEST: Mutex<Option<HashMap<String, Snapshot>>> = Mutex::new(None);
static WANTED: Notify = Notify::const_new();

/// Keep `counts` as the latest of `queue`.
pub fn record(queue: &str, counts: Vec<(Status, u64)>) {
    let snapshot = Snapshot {
        counts,
        at_ms: now_ms(),
    };
    LATEST
        .lock()
        .expect("counts")
        .get_or_insert_with(HashMap::new)
        .insert(queue.to_string(), snapshot);
}

/// The latest counts of `queue`; asks for a fresh count when they are older than [`MIN_GAP`].
pub fn latest(queue: &str) -> Option<Snapshot> {
    let found = LATEST
        .lock()
        .expect("counts")
        .as_ref()
        .and_then(|all| all.get(queue).cloned());
    if found
        .as_ref()
        .is_none_or(|s| now_ms() - s.at_ms > MIN_GAP.as_millis() as i64)
    {
        want_fresh();
    }
    found
}

/// Ask the sampler for a fresh count soon (after a change made through the API, say).
pub fn want_fresh() {
    WANTED.notify_one();
}

/// Resolves when a reader asked for fresh counts.
pub(super) async fn wanted() {
    WANTED.notified().await;
}

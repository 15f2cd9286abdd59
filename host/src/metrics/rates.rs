//! Recent rates per queue (processed and failed messages per second over the last minute),
//! for the message API and `wharf status`. Every outcome bumps a running total; the gauge
//! sampler snapshots the totals, and a rate is the difference between the newest snapshot
//! (or now) and the oldest one within the window. The same totals feed the per-queue history
//! the dashboard charts ([`super::history`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How far back a rate looks.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Running totals of one queue since the host started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Messages processed.
    pub processed: u64,
    /// Messages failed for good.
    pub failed: u64,
}

#[derive(Default)]
struct Tracker {
    totals: HashMap<String, Totals>,
    snapshots: VecDeque<(Instant, HashMap<String, Totals>)>,
}

fn tracker() -> &'static Mutex<Tracker> {
    static TRACKER: OnceLock<Mutex<Tracker>> = OnceLock::new();
    TRACKER.get_or_init(Mutex::default)
}

/// Messages per second over the recent window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Processed per second.
    pub processed_per_s: f64,
    /// Failed per second.
    pub failed_per_s: f64,
}

/// Count one processed (`failed == false`) or failed message of `queue`.
pub(super) fn bump(queue: &str, failed: bool) {
    let mut t = tracker().lock().expect("rate tracker");
    let totals = match t.totals.get_mut(queue) {
        Some(totals) => totals,
        None => t.totals.entry(queue.to_string()).or_default(),
    };
    if failed {
        totals.failed += 1;
    } else {
        totals.processed += 1;
    }
}

/// Record the current totals (called by the sampler) and forget snapshots past the window.
pub(super) fn snapshot() {
    let now = Instant::now();
    let mut t = tracker().lock().expect("rate tracker");
    let totals = t.totals.clone();
    t.snapshots.push_back((now, totals));
    while t
        .snapshots
        .front()
        .is_some_and(|(at, _)| now.duration_since(*at) > WINDOW)
    {
        t.snapshots.pop_front();
    }
}

/// The running totals of `queue` (zero before its first outcome).
pub fn totals(queue: &str) -> Totals {
    let t = tracker().lock().expect("rate tracker");
    t.totals.get(queue).copied().unwrap_or_default()
}

/// The recent rates of `queue` (zero until a snapshot at least a second old exists).
pub fn rates(queue: &str) -> Rates {
    let t = tracker().lock().expect("rate tracker");
    let Some((since, old)) = t.snapshots.front() else {
        return Rates::default();
    };
    let seconds = since.elapsed().as_secs_f64();
    if seconds < 1.0 {
        return Rates::default();
    }
    let before = old.get(queue).copied().unwrap_or_default();
    let now = t.totals.get(queue).copied().unwrap_or_default();
    Rates {
        processed_per_s: (now.processed - before.processed) as f64 / seconds,
        failed_per_s: (now.failed - before.failed) as f64 / seconds,
    }
}

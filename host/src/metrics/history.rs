//! Recent history per queue for the dashboard's charts: a bounded ring of points (when,
//! processed/s, failed/s, depth) appended by the gauge sampler's passes since the host started.
//! A point is kept for at most [`SPAN`]; points are at least [`MIN_SPACING`] apart (a pass
//! sooner than that after the last point is skipped, its messages counted in the next
//! point), so a queue never holds more than [`MAX_POINTS`] of them, whatever
//! `host.metrics_interval` is. Kept in memory only: a restart starts a new history.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rates::Totals;
use crate::queue::Status;

/// How far back the history of a queue reaches.
pub const SPAN: Duration = Duration::from_secs(3600);

/// The shortest time between two points of a queue.
pub const MIN_SPACING: Duration = Duration::from_secs(1);

/// The most points one queue keeps (one hour at one point per second).
pub const MAX_POINTS: usize = 3600;

/// One sampling pass of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// When the pass sampled the queue (ms since the epoch).
    pub at_ms: i64,
    /// Messages processed per second since the previous point (0 for the first point).
    pub processed_per_s: f64,
    /// Messages failed for good per second since the previous point.
    pub failed_per_s: f64,
    /// Messages not settled yet when the pass counted them; `None` when counting failed.
    pub depth: Option<u64>,
}

/// One queue's points and the totals of its newest point.
#[derive(Debug, Default)]
struct Ring {
    last: Option<(i64, Totals)>,
    points: VecDeque<Point>,
}

impl Ring {
    /// Append a point for a pass at `at_ms` that saw `totals` and `depth`, unless it comes
    /// sooner than [`MIN_SPACING`] after the newest one; forget points older than [`SPAN`].
    fn push(&mut self, at_ms: i64, totals: Totals, depth: Option<u64>) {
        let (processed_per_s, failed_per_s) = match self.last {
            None => (0.0, 0.0),
            Some((then, _)) if at_ms - then < MIN_SPACING.as_millis() as i64 => return,
            Some((then, before)) => {
                let seconds = (at_ms - then) as f64 / 1000.0;
                (
                    totals.processed.saturating_sub(before.processed) as f64 / seconds,
                    totals.failed.saturating_sub(before.failed) as f64 / seconds,
                )
            }
        };
        self.last = Some((at_ms, totals));
        self.points.push_back(Point {
            at_ms,
            processed_per_s,
            failed_per_s,
            depth,
        });
        let oldest = at_ms - SPAN.as_millis() as i64;
        while self.points.len() > MAX_POINTS
            || self.points.front().is_some_and(|p| p.at_ms < oldest)
        {
            self.points.pop_front();
        }
    }
}

static HISTORY: Mutex<Option<HashMap<String, Ring>>> = Mutex::new(None);

/// Record what a sampling pass saw of `queue` at `at_ms`: its running totals and its depth.
pub(super) fn record(queue: &str, at_ms: i64, totals: Totals, depth: Option<u64>) {
    let mut all = HISTORY.lock().expect("queue history");
    let all = all.get_or_insert_with(HashMap::new);
    match all.get_mut(queue) {
        Some(ring) => ring.push(at_ms, totals, depth),
        None => all
            .entry(queue.to_string())
            .or_default()
            .push(at_ms, totals, depth),
    }
}

/// The points of `queue`, oldest first (empty before its first sampling pass).
pub fn history(queue: &str) -> Vec<Point> {
    HISTORY
        .lock()
        .expect("queue history")
        .as_ref()
        .and_then(|all| all.get(queue))
        .map(|ring| ring.points.iter().copied().collect())
        .unwrap_or_default()
}

/// The depth of a SQL queue from its counts: every message not settled yet (pending,
/// sleeping, processing, awaiting release, parked behind its session or handed off);
/// processed, failed and custom statuses are not work the host still has to do.
pub(super) fn depth(counts: &[(Status, u64)]) -> u64 {
    counts
        .iter()
        .filter(|(status, _)| {
            matches!(
                status,
                Status::Pending
                    | Status::Sleeping
                    | Status::Processing
                    | Status::AwaitingRelease
                    | Status::Parked
                    | Status::HandedOff
            )
        })
        .map(|(_, n)| n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(processed: u64, failed: u64) -> Totals {
        Totals { processed, failed }
    }

    #[test]
    fn rates_are_per_second_between_points() {
        let mut ring = Ring::default();
        ring.push(10_000, totals(5, 1), Some(3));
        ring.push(12_000, totals(25, 3), Some(1));
        let points: Vec<_> = ring.points.iter().copied().collect();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].processed_per_s, 0.0);
        assert_eq!(points[1].processed_per_s, 10.0);
        assert_eq!(points[1].failed_per_s, 1.0);
        assert_eq!(points[1].depth, Some(1));
    }

    #[test]
    fn a_pass_too_soon_is_folded_into_the_next_point() {
        let mut ring = Ring::default();
        ring.push(0, totals(0, 0), Some(0));
        ring.push(400, totals(4, 0), Some(9));
        ring.push(2_000, totals(8, 0), Some(2));
        assert_eq!(ring.points.len(), 2);
        assert_eq!(ring.points[1].processed_per_s, 4.0);
    }

    #[test]
    fn the_ring_keeps_one_hour_and_never_grows_past_its_cap() {
        let mut ring = Ring::default();
        let step = MIN_SPACING.as_millis() as i64;
        for n in 0..(MAX_POINTS as i64 * 3) {
            ring.push(n * step, totals(n as u64, 0), Some(1));
            assert!(ring.points.len() <= MAX_POINTS);
        }
        let newest = ring.points.back().unwrap().at_ms;
        let oldest = ring.points.front().unwrap().at_ms;
        assert!(newest - oldest <= SPAN.as_millis() as i64);
        let mut sparse = Ring::default();
        for n in 0..200 {
            sparse.push(n * 60_000, totals(0, 0), None);
        }
        assert_eq!(sparse.points.len(), 61, "an hour of points a minute apart");
    }

    #[test]
    fn depth_counts_only_unsettled_messages() {
        let counts = [
            (Status::Pending, 2),
            (Status::Processed, 100),
            (Status::Failed, 7),
            (Status::Sleeping, 3),
            (Status::Custom("skipped".into()), 4),
            (Status::Parked, 1),
        ];
        assert_eq!(depth(&counts), 6);
    }
}

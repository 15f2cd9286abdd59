//! Metric handles resolved once per queue or handler and kept: the per-message paths count
//! and time through them, without building label strings or looking the metric up in the
//! registry on every message.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use metrics::{Counter, Histogram};

use super::MessageOutcome;

type Cache<T> = OnceLock<RwLock<HashMap<String, Arc<T>>>>;

/// The per-message metrics of one queue.
pub(super) struct QueueHandles {
    /// `wharf_messages_total{queue, outcome}`, indexed by [`MessageOutcome::ALL`].
    outcomes: Vec<Counter>,
    /// `wharf_handler_call_seconds{queue}`.
    pub call: Histogram,
    /// `wharf_settle_latency_seconds{queue}`.
    pub settle: Histogram,
}

impl QueueHandles {
    /// The counter of `outcome`.
    pub fn outcome(&self, outcome: MessageOutcome) -> &Counter {
        &self.outcomes[outcome as usize]
    }
}

/// The handles of `queue`, registered on first use.
pub(super) fn queue(queue: &str) -> Arc<QueueHandles> {
    static QUEUES: Cache<QueueHandles> = OnceLock::new();
    cached(&QUEUES, queue, || QueueHandles {
        outcomes: MessageOutcome::ALL
            .iter()
            .map(|outcome| {
                metrics::counter!(
                    "wharf_messages_total",
                    "queue" => queue.to_string(),
                    "outcome" => outcome.label()
                )
            })
            .collect(),
        call: metrics::histogram!("wharf_handler_call_seconds", "queue" => queue.to_string()),
        settle: metrics::histogram!("wharf_settle_latency_seconds", "queue" => queue.to_string()),
    })
}

/// `wharf_instantiate_seconds{handler}`, registered on first use.
pub(super) fn instantiate(handler: &str) -> Arc<Histogram> {
    static HANDLERS: Cache<Histogram> = OnceLock::new();
    cached(
        &HANDLERS,
        handler,
        || metrics::histogram!("wharf_instantiate_seconds", "handler" => handler.to_string()),
    )
}

/// The inbox counters of one endpoint.
pub(super) struct InboxHandles {
    /// `wharf_inbox_checks_total{endpoint}`.
    pub checks: Counter,
    /// `wharf_inbox_records_total{endpoint}`.
    pub records: Counter,
}

/// The inbox counters of `endpoint`, registered on first use.
pub(super) fn inbox(endpoint: &str) -> Arc<InboxHandles> {
    static ENDPOINTS: Cache<InboxHandles> = OnceLock::new();
    cached(&ENDPOINTS, endpoint, || InboxHandles {
        checks: metrics::counter!("wharf_inbox_checks_total", "endpoint" => endpoint.to_string()),
        records: metrics::counter!("wharf_inbox_records_total", "endpoint" => endpoint.to_string()),
    })
}

/// The entry of `key` in `cache`, made by `make` the first time. The recorder is installed
/// before anything is registered, so no handle is ever bound to the no-op recorder.
fn cached<T>(cache: &'static Cache<T>, key: &str, make: impl FnOnce() -> T) -> Arc<T> {
    let cache = cache.get_or_init(Default::default);
    if let Some(found) = cache.read().expect("metric handles").get(key) {
        return found.clone();
    }
    super::install();
    cache
        .write()
        .expect("metric handles")
        .entry(key.to_string())
        .or_insert_with(|| Arc::new(make()))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::MessageOutcome;

    #[test]
    fn every_outcome_indexes_its_own_counter() {
        for (index, outcome) in MessageOutcome::ALL.iter().enumerate() {
            assert_eq!(*outcome as usize, index, "{outcome:?}");
        }
    }
}

//! Prometheus metrics, served by the admin server on `/metrics`. Labels are bounded (queue,
//! endpoint, provider names from the configuration), never message ids.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the process-wide recorder (once; later calls reuse it).
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (an embedding application): then ours
        // only renders what it sees, which is nothing; the application's recorder wins.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// The current metrics in the Prometheus text format.
pub fn render() -> String {
    install().render()
}

/// Count a redelivery skipped by the consumer inbox.
pub fn duplicate_detected(endpoint: &str, queue: &str, provider: &'static str) {
    metrics::counter!(
        "wharf_inbox_duplicates_total",
        "endpoint" => endpoint.to_string(),
        "queue" => queue.to_string(),
        "provider" => provider
    )
    .increment(1);
}

//! Per-endpoint cleanup of expired inbox records: every `interval`, delete this endpoint's
//! records older than its retention, in bounded batches. A failed pass is logged and tried
//! again at the next interval; shutdown stops it promptly.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::InboxStore;
use crate::clock::now_ms;

/// Records deleted per statement (at most).
pub const PURGE_BATCH: u32 = 1000;

/// Run the cleanup of `endpoint` until `shutdown`.
pub async fn run_cleanup(
    store: Arc<dyn InboxStore>,
    endpoint: String,
    retention: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let cutoff = now_ms() - retention.as_millis() as i64;
        let mut total = 0;
        loop {
            let pass = tokio::select! {
                _ = shutdown.cancelled() => return,
                pass = store.purge_expired(&endpoint, cutoff, PURGE_BATCH) => pass,
            };
            match pass {
                Ok(n) => {
                    total += n;
                    if n < u64::from(PURGE_BATCH) {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!(endpoint = %endpoint, "inbox cleanup failed, trying again in {}: {e}", humantime::format_duration(interval));
                    break;
                }
            }
        }
        if total > 0 {
            tracing::info!(endpoint = %endpoint, deleted = total, "expired inbox records removed");
        }
    }
}

//! The hosts sharing a store: each records its id, when it started, a heartbeat every
//! [`BEAT`], and when it stopped cleanly. A host is alive while it has not stopped and its
//! last heartbeat is younger than [`ALIVE_WITHIN`]; a host that crashed counts as alive
//! until then.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::queue::{HostRow, QueueError, QueueStore};

/// How often a host records that it is alive.
pub const BEAT: Duration = Duration::from_secs(5);

/// How long after its last heartbeat a host that did not stop cleanly counts as alive.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(15);

/// Whether `host` is alive at `now_ms`.
pub fn alive(host: &HostRow, now_ms: i64) -> bool {
    host.stopped_at_ms.is_none() && now_ms - host.seen_at_ms < ALIVE_WITHIN.as_millis() as i64
}

/// A host as the CLI and the API show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostView {
    /// Its id.
    pub id: String,
    /// Whether it is alive now.
    pub alive: bool,
    /// When it last started (Unix ms).
    pub started_at_ms: i64,
    /// Its last heartbeat.
    pub seen_at_ms: i64,
    /// When it stopped cleanly (and has not started again).
    pub stopped_at_ms: Option<i64>,
}

/// `hosts` as shown at `now_ms`.
pub fn views(hosts: Vec<HostRow>, now_ms: i64) -> Vec<HostView> {
    hosts
        .into_iter()
        .map(|h| HostView {
            alive: alive(&h, now_ms),
            id: h.id,
            started_at_ms: h.started_at_ms,
            seen_at_ms: h.seen_at_ms,
            stopped_at_ms: h.stopped_at_ms,
        })
        .collect()
}

/// Record that host `id` started at `started_at_ms`, and whether another host was alive
/// then.
pub async fn register(
    store: &Arc<dyn QueueStore>,
    id: &str,
    started_at_ms: i64,
) -> Result<bool, QueueError> {
    let others_alive = store
        .hosts()
        .await?
        .iter()
        .any(|h| h.id != id && alive(h, started_at_ms));
    store.host_beat(id, started_at_ms, false).await?;
    Ok(others_alive)
}

/// Record a heartbeat every [`BEAT`] until `shutdown`, then that the host stopped.
pub fn beat(
    store: Arc<dyn QueueStore>,
    id: String,
    started_at_ms: i64,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(BEAT) => {}
                () = shutdown.cancelled() => break,
            }
            if let Err(e) = store.host_beat(&id, started_at_ms, false).await {
                tracing::warn!(host = %id, "recording this host's heartbeat failed: {e}");
            }
        }
        if let Err(e) = store.host_beat(&id, started_at_ms, true).await {
            tracing::warn!(host = %id, "recording that this host stopped failed: {e}");
        }
    })
}

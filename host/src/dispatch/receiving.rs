//! How a pipeline's loop receives: it gathers free handler-call slots into a batch
//! ([`gather_slots`]) and rides out a source that fails to receive ([`Outage`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// First pause after a failed receive; it doubles up to [`MAX_PAUSE`] while failing.
const MIN_PAUSE: Duration = Duration::from_millis(250);
/// Longest pause between receives while the source fails.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Longest a busy queue waits for more free slots before receiving.
const GATHER: Duration = Duration::from_millis(2);

/// The first free slot and, for a moment, more as they free up (up to `batch`), so a busy
/// queue receives in batches rather than one message per round trip. A drained source
/// (`last_short`) or a quarter of a batch does not wait.
pub(super) async fn gather_slots(
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    batch: usize,
    last_short: bool,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    let gather_until = tokio::time::Instant::now() + GATHER;
    while permits.len() < batch {
        match slots.clone().try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) if permits.len() >= batch / 4 || last_short => break,
            Err(_) => {
                match tokio::time::timeout_at(gather_until, slots.clone().acquire_owned()).await {
                    Ok(permit) => permits.push(permit.expect("semaphore never closed")),
                    Err(_) => break,
                }
            }
        }
    }
    permits
}

/// A source that fails to receive: logged once when it starts and once when it is over,
/// retried after a pause that doubles up to [`MAX_PAUSE`].
pub(super) struct Outage {
    since: Option<Instant>,
    pause: Duration,
}

impl Default for Outage {
    fn default() -> Self {
        Outage {
            since: None,
            pause: MIN_PAUSE,
        }
    }
}

impl Outage {
    pub(super) fn failed(&mut self, queue: &str, provider: &str, error: &dyn std::fmt::Display) {
        if self.since.is_none() {
            tracing::error!(queue = %queue, provider, "receiving messages failed, retrying: {error}");
            self.since = Some(Instant::now());
            self.pause = MIN_PAUSE;
        }
    }

    pub(super) fn over(&mut self, queue: &str, provider: &str) {
        if let Some(since) = self.since.take() {
            tracing::info!(queue = %queue, provider, "receiving works again after {:?}", since.elapsed());
        }
    }

    /// Wait before the next try; false when shut down meanwhile.
    pub(super) async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(self.pause) => {}
        }
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        true
    }
}

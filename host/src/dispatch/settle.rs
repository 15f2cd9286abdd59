//! Group settlement: processors hand their outcomes to one task that applies them in
//! batches (one store round trip per batch), then tells each processor the result.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::queue::{QueueError, QueueStore, SettleResult, Settlement};

/// Most settlements applied in one round trip.
const MAX_BATCH: usize = 256;

type Reply = oneshot::Sender<Result<SettleResult, String>>;

/// Handle to the settlement task.
#[derive(Clone)]
pub struct Settler {
    tx: mpsc::Sender<(Settlement, Reply)>,
}

impl Settler {
    /// Start the settlement task for `store`. It ends when every `Settler` is dropped.
    pub fn start(store: Arc<dyn QueueStore>) -> (Settler, tokio::task::JoinHandle<()>) {
        Settler::start_with(move |batch| {
            let store = store.clone();
            async move { store.settle(&batch).await }
        })
    }

    /// Start the settlement task, applying each batch with `apply`.
    fn start_with<F, Fut>(apply: F) -> (Settler, tokio::task::JoinHandle<()>)
    where
        F: Fn(Arc<Vec<Settlement>>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<SettleResult>, QueueError>> + Send,
    {
        let (tx, mut rx) = mpsc::channel::<(Settlement, Reply)>(4 * MAX_BATCH);
        let task = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            let mut failing_since: Option<std::time::Instant> = None;
            while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let (settlements, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
                let settlements = Arc::new(settlements);
                // Leases usually outlive a short outage: retry before giving up on a batch.
                let mut outcome = guarded(apply(settlements.clone())).await;
                for delay_ms in [100, 400, 1600] {
                    if outcome.is_ok() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                    outcome = guarded(apply(settlements.clone())).await;
                }
                match outcome {
                    Ok(results) => {
                        if let Some(since) = failing_since.take() {
                            tracing::info!(
                                "settling messages works again after {:?}",
                                since.elapsed()
                            );
                        }
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(Ok(result));
                        }
                    }
                    Err(text) => {
                        // Logged once per outage, not once per message.
                        if failing_since.is_none() {
                            failing_since = Some(std::time::Instant::now());
                            tracing::error!(
                                "cannot settle messages; their leases will expire and they will run again: {text}"
                            );
                        }
                        for reply in replies {
                            let _ = reply.send(Err(text.clone()));
                        }
                    }
                }
            }
        });
        (Settler { tx }, task)
    }

    /// Apply one settlement (batched with others) and wait for the result.
    pub async fn settle(&self, settlement: Settlement) -> Result<SettleResult, String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((settlement, reply))
            .await
            .map_err(|_| "the settlement task has stopped".to_string())?;
        rx.await
            .map_err(|_| "the settlement task has stopped".to_string())?
    }
}

/// A batch's outcome, a panic while applying it turned into an error for that batch: the
/// task goes on settling the batches after it.
async fn guarded(
    apply: impl Future<Output = Result<Vec<SettleResult>, QueueError>>,
) -> Result<Vec<SettleResult>, String> {
    match AssertUnwindSafe(apply).catch_unwind().await {
        Ok(outcome) => outcome.map_err(|e| e.to_string()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            Err(format!("settling panicked: {what}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::queue::{Disposition, Lease};

    fn settlement(key: i64) -> Settlement {
        Settlement::new(Lease { key, token: 1 }, Disposition::Complete)
    }

    #[tokio::test]
    async fn a_panic_while_settling_fails_that_batch_and_the_next_ones_settle() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let (settler, _task) = Settler::start_with(move |batch| {
            let call = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                // Every try of the first batch panics.
                if batch.iter().any(|s| s.lease.key == 1) {
                    panic!("broken batch {call}");
                }
                Ok(vec![SettleResult::Applied; batch.len()])
            }
        });
        let failed = settler.settle(settlement(1)).await.unwrap_err();
        assert!(
            failed.contains("settling panicked: broken batch"),
            "{failed}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 4, "tried and retried");
        assert_eq!(
            settler.settle(settlement(2)).await,
            Ok(SettleResult::Applied)
        );
    }
}

//! Group settlement: processors hand their outcomes to one task that applies them in
//! batches (one store round trip per batch), then tells each processor the result.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::queue::{QueueStore, SettleResult, Settlement};

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
        let (tx, mut rx) = mpsc::channel::<(Settlement, Reply)>(4 * MAX_BATCH);
        let task = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            let mut failing_since: Option<std::time::Instant> = None;
            while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let (settlements, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
                // Leases usually outlive a short outage: retry before giving up on a batch.
                let mut outcome = store.settle(&settlements).await;
                for delay_ms in [100, 400, 1600] {
                    if outcome.is_ok() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                    outcome = store.settle(&settlements).await;
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
                    Err(e) => {
                        // Logged once per outage, not once per message.
                        if failing_since.is_none() {
                            failing_since = Some(std::time::Instant::now());
                            tracing::error!(
                                "cannot settle messages; their leases will expire and they will run again: {e}"
                            );
                        }
                        let text = e.to_string();
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

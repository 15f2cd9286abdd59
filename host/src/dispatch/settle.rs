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
            while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let (settlements, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
                match store.settle(&settlements).await {
                    Ok(results) => {
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(Ok(result));
                        }
                    }
                    Err(e) => {
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

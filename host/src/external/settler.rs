//! Batched settlement of broker messages: processors hand over (lease token, MessageId)
//! pairs; one task per queue settles everything queued in one provider call, retrying a
//! failed call a few times before the leases are left to expire.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::ExternalPendingStorage;

/// One settlement request and where its answer (lease still held) goes.
pub(crate) type SettleRequest = ((String, Option<String>), oneshot::Sender<bool>);

/// One task per queue settling broker messages in batches.
pub(crate) fn start_settler(
    storage: Arc<dyn ExternalPendingStorage>,
    queue: String,
) -> mpsc::Sender<SettleRequest> {
    const MAX_BATCH: usize = 512;
    let (tx, mut rx) = mpsc::channel::<SettleRequest>(4 * MAX_BATCH);
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
            let (items, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
            let mut outcome = storage.settle(&queue, &items).await;
            for delay_ms in [100, 400, 1600] {
                if outcome.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                outcome = storage.settle(&queue, &items).await;
            }
            match outcome {
                Ok(held) => {
                    for (reply, held) in replies.into_iter().zip(held) {
                        let _ = reply.send(held);
                    }
                }
                Err(e) => {
                    tracing::error!(%queue, "cannot settle broker messages; their leases will expire and they will run again: {e}");
                    for reply in replies {
                        let _ = reply.send(false);
                    }
                }
            }
        }
    });
    tx
}

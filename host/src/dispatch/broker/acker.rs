//! Batched acknowledgement of broker messages: processors hand over delivery handles; one
//! task per queue acknowledges everything queued in one consumer call, retrying a failed call
//! a few times before the deliveries are left to the broker (which delivers them again).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::external::{Consumer, Handle, ProviderHealth};

/// One task per queue acknowledging broker messages in batches, retrying a failed call a
/// few times; answers whether each delivery was still held.
pub(super) fn start_acker(
    consumer: Arc<dyn Consumer>,
    queue: String,
    health: Arc<ProviderHealth>,
) -> mpsc::Sender<(Handle, oneshot::Sender<bool>)> {
    let part = format!("acknowledgements of queue `{queue}`");
    const MAX_BATCH: usize = 512;
    let (tx, mut rx) = mpsc::channel::<(Handle, oneshot::Sender<bool>)>(4 * MAX_BATCH);
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut failing = false;
        while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
            let (handles, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
            let mut outcome = consumer.ack(&handles).await;
            for delay_ms in [100, 400, 1600] {
                if outcome.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                outcome = consumer.ack(&handles).await;
            }
            match outcome {
                Ok(held) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!(%queue, "acknowledging broker messages works again");
                        health.part_succeeded(&part);
                    }
                    for (reply, held) in replies.into_iter().zip(held) {
                        let _ = reply.send(held);
                    }
                }
                Err(e) => {
                    if !failing {
                        failing = true;
                        tracing::error!(%queue, "cannot acknowledge broker messages; the broker delivers them again: {e}");
                    }
                    health.part_failed_quietly(&part, e.to_string());
                    for reply in replies {
                        let _ = reply.send(false);
                    }
                }
            }
        }
    });
    tx
}

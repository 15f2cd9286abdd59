//! Group recording of inbox entries: processors whose guest succeeded hand their keys to one
//! task per inbox binding, which records everything queued in one `record_many` call and tells
//! each processor the result before it settles.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::inbox::{InboxKey, InboxStore};

/// Most processors served by one round trip.
const MAX_BATCH: usize = 256;

type Request = (Vec<InboxKey>, oneshot::Sender<Result<(), String>>);

/// Handle to a recording task.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Request>,
}

impl Recorder {
    /// Start recording into `store` with `retention_ms`. Ends when every handle is dropped.
    pub fn start(store: Arc<dyn InboxStore>, retention_ms: i64) -> Recorder {
        let (tx, mut rx) = mpsc::channel::<Request>(4 * MAX_BATCH);
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let (keys, replies): (Vec<Vec<InboxKey>>, Vec<_>) = batch.drain(..).unzip();
                let all: Vec<InboxKey> = keys.into_iter().flatten().collect();
                let result = store
                    .record_many(&all, retention_ms)
                    .await
                    .map_err(|e| e.to_string());
                for reply in replies {
                    let _ = reply.send(result.clone());
                }
            }
        });
        Recorder { tx }
    }

    /// Record `keys` (in order, batched with other processors') and wait for the result.
    pub async fn record(&self, keys: Vec<InboxKey>) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((keys, reply))
            .await
            .map_err(|_| "the inbox recorder has stopped".to_string())?;
        rx.await
            .map_err(|_| "the inbox recorder has stopped".to_string())?
    }
}

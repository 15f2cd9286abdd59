//! Batched reads of handlers' committed key-value state. A handler call reads a key's
//! committed value when it gets a key first or increments it (the increment returns the
//! value); with many calls running at once, each read a round trip of its own cost more than
//! the rest of the message. Here every read waiting while one is under way goes out together
//! as one statement (deduplicated), so a busy store answers many calls per round trip and a
//! quiet one answers a lone read at once.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::{mpsc, oneshot};

use super::QueueError;
use super::state::{Committed, Id, ROWS_OF_KEYS, bind_keys};
use crate::sql::Pool;

/// Most reads answered by one statement.
const MAX_BATCH: usize = 512;

type Reply = oneshot::Sender<Result<Option<Committed>, String>>;

/// Handle to the task that reads for every caller of one store.
#[derive(Debug, Clone)]
pub(crate) struct StateReads {
    tx: mpsc::Sender<(Id, Reply)>,
}

impl StateReads {
    /// Start reading from `pool`. The task ends when every handle is dropped.
    pub(crate) fn start(pool: Pool) -> StateReads {
        let (tx, mut rx) = mpsc::channel::<(Id, Reply)>(4 * MAX_BATCH);
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let ids: BTreeSet<&Id> = batch.iter().map(|(id, _)| id).collect();
                tracing::trace!(
                    reads = batch.len(),
                    keys = ids.len(),
                    "reading committed state"
                );
                let found = read_many(&pool, ids).await.map_err(|e| e.to_string());
                for (id, reply) in batch.drain(..) {
                    let answer = match &found {
                        Ok(found) => Ok(found.get(&id).cloned()),
                        Err(e) => Err(e.clone()),
                    };
                    let _ = reply.send(answer);
                }
            }
        });
        StateReads { tx }
    }

    /// The committed value and revision of `bucket`/`key`, read with whatever else is asked
    /// meanwhile.
    pub(crate) async fn read(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<Committed>, QueueError> {
        let stopped = || QueueError::Read("the key-value reader has stopped".into());
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(((bucket.to_string(), key.to_string()), reply))
            .await
            .map_err(|_| stopped())?;
        answer
            .await
            .map_err(|_| stopped())?
            .map_err(QueueError::Read)
    }
}

/// The committed values of `ids` (the absent ones left out), in one statement.
async fn read_many(pool: &Pool, ids: BTreeSet<&Id>) -> Result<BTreeMap<Id, Committed>, QueueError> {
    let query = bind_keys(pool.query(&ROWS_OF_KEYS), pool.dialect(), ids);
    let mut found = BTreeMap::new();
    for row in query.fetch_all().await? {
        found.insert(
            (row.get("bucket")?, row.get("key")?),
            (row.get("value")?, row.get("revision")?),
        );
    }
    Ok(found)
}

//! Group commit for single enqueues into a SQL queue: handlers running at once that each
//! enqueue a follow-up would otherwise cost one transaction apiece. Every single enqueue joins
//! the queue's group; one writer task writes everything that gathered while the previous write
//! ran as one batch ([`QueueStore::enqueue_many`]). An idle queue writes at once: nothing waits
//! for a timer, and a caller that gives up (a handler's timeout) cannot stop a write halfway.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

use super::EnqueueError;
use crate::queue::enqueue::transaction_len;
use crate::queue::{EnqueueStatus, Enqueued, NewMessage, QueueError, QueueStore};

type Reply = oneshot::Sender<Result<Enqueued, EnqueueError>>;

/// The enqueues of one queue waiting for the writer.
pub(super) struct Group {
    queue: String,
    store: Arc<dyn QueueStore>,
    idempotent: bool,
    wake: Arc<Notify>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    waiting: Vec<(NewMessage, Reply)>,
    writing: bool,
}

impl Group {
    pub(super) fn new(
        queue: &str,
        store: Arc<dyn QueueStore>,
        idempotent: bool,
        wake: Arc<Notify>,
    ) -> Self {
        Group {
            queue: queue.to_string(),
            store,
            idempotent,
            wake,
            state: Mutex::default(),
        }
    }

    /// Enqueue `message` with whatever else is waiting.
    pub(super) async fn enqueue(
        self: &Arc<Self>,
        message: NewMessage,
    ) -> Result<Enqueued, EnqueueError> {
        let (reply, answer) = oneshot::channel();
        let start_writer = {
            let mut state = self.state.lock().expect("enqueue group");
            state.waiting.push((message, reply));
            !std::mem::replace(&mut state.writing, true)
        };
        if start_writer {
            tokio::spawn(self.clone().write_all());
        }
        answer.await.map_err(|_| {
            EnqueueError::Store(QueueError::Conflict(format!(
                "the enqueue into `{}` was interrupted; it may or may not be stored",
                self.queue
            )))
        })?
    }

    /// Write groups until none is waiting.
    async fn write_all(self: Arc<Self>) {
        let _guard = StopOnPanic(self.clone());
        loop {
            let group: Vec<(NewMessage, Reply)> = {
                let mut state = self.state.lock().expect("enqueue group");
                if state.waiting.is_empty() {
                    state.writing = false;
                    return;
                }
                // One transaction's worth: a write that fails then stored none of them, so
                // each can be tried again alone.
                let take = transaction_len(
                    &state.waiting,
                    |(m, _)| m.payload.len(),
                    |(m, _)| m.id.is_some(),
                );
                state.waiting.drain(..take).collect()
            };
            self.write(group).await;
        }
    }

    async fn write(&self, group: Vec<(NewMessage, Reply)>) {
        let (messages, replies): (Vec<NewMessage>, Vec<Reply>) = group.into_iter().unzip();
        let store = &self.store;
        match store
            .enqueue_many(&self.queue, messages.clone(), self.idempotent)
            .await
        {
            Ok(results) => {
                if results.iter().any(|d| d.status != EnqueueStatus::Discarded) {
                    self.wake.notify_one();
                }
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(Ok(result));
                }
            }
            // Nothing of the group was stored (one transaction). One message's failure must
            // not become the others': each alone, with its own answer.
            Err(_) => {
                for (message, reply) in messages.into_iter().zip(replies) {
                    let result = store.enqueue(&self.queue, message, self.idempotent).await;
                    if matches!(&result, Ok(d) if d.status != EnqueueStatus::Discarded) {
                        self.wake.notify_one();
                    }
                    let _ = reply.send(result.map_err(EnqueueError::from));
                }
            }
        }
    }
}

/// Lets a later enqueue start a new writer when this one panicked (its waiters' replies are
/// dropped, so they get an error instead of waiting forever).
struct StopOnPanic(Arc<Group>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Ok(mut state) = self.0.state.lock()
        {
            state.waiting.clear();
            state.writing = false;
        }
    }
}

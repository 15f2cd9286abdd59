//! Group commit of broker messages' effects: deliveries of one queue that succeed at the same
//! time would each cost a transaction (their follow-ups, key-value changes, inbox records and
//! commit marks, committed before the acknowledgement). Each joins the queue's group; one
//! writer task commits everything that gathered while the previous commit ran as one
//! transaction ([`QueueStore::commit_effects`]). An idle queue commits at once.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::queue::{CommitResult, EffectsCommit, QueueError, QueueStore};

type Reply = oneshot::Sender<CommitResult>;

/// Most commits in one transaction.
const MAX_GROUP: usize = 256;

/// The effects of one queue's deliveries waiting for the writer.
pub struct CommitGroup {
    store: Arc<dyn QueueStore>,
    state: Mutex<(Vec<(EffectsCommit, Reply)>, bool)>,
}

impl CommitGroup {
    pub(crate) fn new(store: Arc<dyn QueueStore>) -> Arc<Self> {
        Arc::new(CommitGroup {
            store,
            state: Mutex::default(),
        })
    }

    /// Commit `effects` with whatever else is waiting.
    pub(crate) async fn commit(self: &Arc<Self>, effects: EffectsCommit) -> CommitResult {
        let (reply, answer) = oneshot::channel();
        let start_writer = {
            let mut state = self.state.lock().expect("commit group");
            state.0.push((effects, reply));
            !std::mem::replace(&mut state.1, true)
        };
        if start_writer {
            tokio::spawn(self.clone().write_all());
        }
        answer.await.map_err(|_| {
            QueueError::Conflict("the commit was interrupted; it may or may not be stored".into())
        })?
    }

    async fn write_all(self: Arc<Self>) {
        let _guard = StopOnPanic(self.clone());
        loop {
            let group: Vec<(EffectsCommit, Reply)> = {
                let mut state = self.state.lock().expect("commit group");
                if state.0.is_empty() {
                    state.1 = false;
                    return;
                }
                let take = state.0.len().min(MAX_GROUP);
                state.0.drain(..take).collect()
            };
            self.write(group).await;
        }
    }

    async fn write(&self, group: Vec<(EffectsCommit, Reply)>) {
        let (commits, replies): (Vec<EffectsCommit>, Vec<Reply>) = group.into_iter().unzip();
        match self.store.commit_effects(&commits).await {
            Ok(results) => {
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
            // Nothing of the group was committed: one delivery's failure must not become the
            // others', so each alone, with its own answer.
            Err(e) if commits.len() == 1 => {
                let _ = replies.into_iter().next().expect("one").send(Err(e));
            }
            Err(_) => {
                for (commit, reply) in commits.into_iter().zip(replies) {
                    let result = match self
                        .store
                        .commit_effects(std::slice::from_ref(&commit))
                        .await
                    {
                        Ok(mut one) => one.pop().unwrap_or(Ok(false)),
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                }
            }
        }
    }
}

/// Lets a later commit start a new writer when this one panicked (its waiters' replies are
/// dropped, so they get an error instead of waiting forever).
struct StopOnPanic(Arc<CommitGroup>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Ok(mut state) = self.0.state.lock()
        {
            state.0.clear();
            state.1 = false;
        }
    }
}

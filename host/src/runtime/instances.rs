//! Waiting for a pooled instance. The engine's pooling allocator holds a fixed number of
//! instances (`host.max_instances`); a call that finds the pool full is not the handler's
//! fault, so it never counts as an attempt. It waits until another call gives its instance
//! back (a store dropped), up to the time its message's lease leaves for starting, and
//! otherwise hands the message back uncounted ([`super::InvokeError::NoInstance`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use wasmtime::Store;

/// Longest a waiting call sleeps between tries, in case a return went unnoticed (a call
/// cancelled before its store was wrapped).
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// The instances given back to one engine's pool, for the calls waiting for one.
#[derive(Debug, Default)]
pub(crate) struct InstanceReturns {
    returned: Notify,
    /// Calls waiting now: a returned instance wakes them only when there are any, so the
    /// common path costs one atomic load.
    waiting: AtomicUsize,
}

impl InstanceReturns {
    /// Whether `error` is the pooling allocator's "every slot in use" (of instances,
    /// memories, tables or stacks).
    pub(crate) fn is_pool_full(error: &wasmtime::Error) -> bool {
        error
            .chain()
            .any(|cause| cause.is::<wasmtime::PoolConcurrencyLimitError>())
    }

    /// Wait until an instance may have come back, `deadline` passes, or [`RETRY_EVERY`].
    /// Returns `false` once `deadline` has passed.
    pub(crate) async fn wait(&self, deadline: tokio::time::Instant) -> bool {
        self.wait_at_most(deadline, RETRY_EVERY).await
    }

    async fn wait_at_most(&self, deadline: tokio::time::Instant, retry: Duration) -> bool {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        let returned = self.returned.notified();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let until = deadline.min(tokio::time::Instant::now() + retry);
        let _ = tokio::time::timeout_at(until, returned).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        true
    }

    fn give_back(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.returned.notify_waiters();
        }
    }
}

/// A store that tells the waiting calls when it has been dropped (its instance is back in
/// the pool).
pub(crate) struct PooledStore<T: 'static> {
    store: Option<Store<T>>,
    returns: Arc<InstanceReturns>,
}

impl<T: 'static> PooledStore<T> {
    /// Wrap `store`, created on the engine whose returns are `returns`.
    pub(crate) fn new(store: Store<T>, returns: Arc<InstanceReturns>) -> Self {
        PooledStore {
            store: Some(store),
            returns,
        }
    }

    /// The store.
    pub(crate) fn get(&mut self) -> &mut Store<T> {
        self.store.as_mut().expect("present until dropped")
    }
}

impl<T: 'static> Drop for PooledStore<T> {
    fn drop(&mut self) {
        drop(self.store.take());
        self.returns.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_returned_instance_wakes_a_waiting_call_at_once() {
        let returns = Arc::new(InstanceReturns::default());
        let hour = Duration::from_secs(3600);
        let waiter = {
            let returns = returns.clone();
            // Neither the deadline nor the retry comes within the test's life: only the
            // return can end this wait.
            tokio::spawn(async move {
                let far = tokio::time::Instant::now() + hour;
                returns.wait_at_most(far, hour).await
            })
        };
        while returns.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let engine = wasmtime::Engine::default();
        drop(PooledStore::new(Store::new(&engine, ()), returns.clone()));
        let woke = tokio::time::timeout(Duration::from_secs(30), waiter).await;
        assert!(woke.expect("the return woke the waiting call").unwrap());
        assert_eq!(returns.waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_passed_deadline_ends_the_wait() {
        let returns = InstanceReturns::default();
        assert!(!returns.wait(tokio::time::Instant::now()).await);
    }
}

//! Taking a rate-limited queue's budget before its messages are leased: a pipeline asks
//! for budget for as many messages as it would lease, waits while there is none, leases at
//! most what it got and gives back what it did not use. A message over the limit so waits
//! in its queue, untouched: never leased, failed or counted as an attempt.
//!
//! Where the budget lives ([`Budget`]): a SQL queue's in its store, shared by every host;
//! an external queue's in this host's memory, shared by its two sources (the broker and the
//! SQL queue of its retries) — so an external queue's limit holds per host.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::queue::QueueStore;
use crate::rate_limit::{Limit, LocalBudget, Taken};

/// The longest a pipeline sleeps before it looks at its budget again (budget another host
/// gave back shows within this).
const RECHECK: Duration = Duration::from_secs(1);

/// How long a pipeline waits before it asks again after its store failed to answer.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Where a queue's budget lives.
pub enum Budget {
    /// In the SQL store: one budget for every host.
    Shared {
        /// The store.
        store: Arc<dyn QueueStore>,
        /// The queue's limit.
        limit: Limit,
    },
    /// In this host's memory.
    Local(LocalBudget),
}

/// One queue's rate limit.
pub struct RateLimit {
    queue: Arc<str>,
    budget: Budget,
    shutdown: CancellationToken,
    /// Raised when budget comes back, so a pipeline of the queue waiting for it looks again
    /// at once (the queue's other source, or its read ahead, took it and found nothing).
    returned: Notify,
}

impl RateLimit {
    /// The limit of `queue`, taken from `budget` until `shutdown`.
    pub fn new(queue: Arc<str>, budget: Budget, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(RateLimit {
            queue,
            budget,
            shutdown,
            returned: Notify::new(),
        })
    }

    /// Budget for between 1 and `wanted` messages, once there is some: 0 only at shutdown.
    pub async fn take(&self, wanted: u32) -> u32 {
        let mut waited = false;
        loop {
            // Listening before looking: budget given back meanwhile is not missed.
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            let wait = match self.try_take(wanted).await {
                Ok(taken) if taken.granted > 0 => return taken.granted,
                Ok(taken) => Duration::from_micros(taken.wait_us.max(1) as u64).min(RECHECK),
                Err(e) => {
                    tracing::warn!(queue = %self.queue, "taking rate-limit budget failed, trying again in {RETRY_AFTER_FAILURE:?}: {e}");
                    RETRY_AFTER_FAILURE
                }
            };
            if !waited {
                waited = true;
                crate::metrics::rate_limited(&self.queue);
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return 0,
                _ = tokio::time::sleep(wait) => {}
                _ = returned => {}
            }
        }
    }

    async fn try_take(&self, wanted: u32) -> Result<Taken, String> {
        match &self.budget {
            Budget::Shared { store, limit } => store
                .rate_take(&self.queue, *limit, wanted)
                .await
                .map_err(|e| e.to_string()),
            Budget::Local(local) => Ok(local.take(crate::clock::now_us(), wanted)),
        }
    }

    /// Return budget for `unused` messages (taken, but fewer were ready). A failure only
    /// loses that budget: the rate recovers as time passes.
    pub async fn give_back(&self, unused: u32) {
        if unused == 0 {
            return;
        }
        match &self.budget {
            Budget::Shared { store, limit } => {
                if let Err(e) = store.rate_give_back(&self.queue, *limit, unused).await {
                    tracing::debug!(queue = %self.queue, "giving back unused rate-limit budget failed: {e}");
                }
            }
            Budget::Local(local) => local.give_back(unused),
        }
        self.returned.notify_waiters();
    }
}

//! Reading ahead: while a busy queue's batch runs, the next batch is received (and checked
//! against the consumer inbox) in the background, so the handlers do not wait for the
//! store's round trip between batches. At most one read is under way, and a new one starts
//! once at most half a batch (or one round of slots, if more) still waits for a slot, so the
//! read is back before the slots run dry. A read ahead takes up to the queue's whole `batch`,
//! even beyond its concurrency: with fast handlers, fewer and larger round trips (and on
//! SQLite, fewer commits) drain a backlog faster. So a queue holds at most its concurrency
//! running, [`refill_level`] waiting and one `batch` being read.
//!
//! A message received ahead waits for a free slot while its lease runs. It waits at most
//! [`ReadAhead::hold_limit`] (half of what the lease leaves beyond the handler's timeout);
//! one that waited longer is handed back untouched instead of run, so it never runs on a
//! lease about to expire. The slots are the queue's, shared with its other source (an
//! external queue's SQL retries), whose calls may hold them past this source's leases: so
//! the limit is kept while waiting for a slot ([`ReadAhead::slot`]), not only once one is
//! free. Only a queue whose handler calls lately took under [`FAST_CALL`]
//! reads ahead: with slower handlers the round trip is hidden behind them anyway, and a
//! message received ahead would only wait (shown as `processing`, kept from other hosts).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::deliver::{self, Precheck};
use super::{Shared, Source, Work};

/// A received message, checked against the inbox, waiting for a slot.
pub(crate) struct Ready<H> {
    pub work: Work<H>,
    pub check: Precheck,
    /// When it was received (its lease began just before).
    pub received: Instant,
}

/// What a read returns: the messages, and how many were asked for.
type Read<H> = (Result<Vec<Ready<H>>, String>, u32);

/// Receive up to `max` messages from the pipeline's source and check them against its inbox.
pub(crate) async fn receive<S: Source>(shared: &Shared<S>, max: u32) -> Read<S::Handle> {
    let p = &shared.pipeline;
    // A rate-limited queue leases no more than its budget allows (waiting for some; none
    // only at shutdown).
    let max = match &p.rate_limit {
        Some(limit) => match limit.take(max).await {
            0 => return (Ok(Vec::new()), max),
            granted => granted,
        },
        None => max,
    };
    // Before the round trip: the leases begin during it, and the time a message may wait
    // for a slot or an instance is counted from here.
    let received = Instant::now();
    let works = match shared.source.receive(max, p.inbox.as_ref()).await {
        Ok(works) => works,
        Err(e) => {
            if let Some(limit) = &p.rate_limit {
                limit.give_back(max).await;
            }
            return (Err(e), max);
        }
    };
    if let Some(limit) = &p.rate_limit {
        limit
            .give_back(max.saturating_sub(works.len() as u32))
            .await;
    }
    let checks = deliver::precheck(shared, &works).await;
    let ready = works
        .into_iter()
        .zip(checks)
        .map(|(work, check)| Ready {
            work,
            check,
            received,
        })
        .collect();
    (Ok(ready), max)
}

/// One queue's messages received ahead of free slots.
pub(crate) struct ReadAhead<H> {
    /// Received and checked, waiting for a slot, oldest first.
    held: VecDeque<Ready<H>>,
    /// The read under way in the background.
    reading: Option<JoinHandle<Read<H>>>,
    /// A read that ended while the pipeline waited for a slot, not looked at yet.
    finished: Option<Read<H>>,
    /// Longest a message may wait for a slot; `None` when the source does not read ahead.
    hold_limit: Option<Duration>,
    /// The next read starts once no more than this many messages wait for a slot.
    refill_at: usize,
}

/// How many messages may still wait for a slot when the next read starts: half a `batch`,
/// or one round of `concurrency` slots if that is more. The read (a store round trip, on
/// SQLite queued behind the settlements) then comes back while those still run, instead of
/// after the slots ran dry.
pub(crate) fn refill_level(batch: usize, concurrency: usize) -> usize {
    (batch / 2).max(concurrency)
}

impl<H: Clone + Send + Sync + 'static> ReadAhead<H> {
    /// Reading ahead for a queue whose source `reads_ahead`, with `lease` and handler
    /// `timeout`; the next read starts once no more than `refill_at` messages wait for a slot
    /// ([`refill_level`]).
    pub(crate) fn new(
        reads_ahead: bool,
        lease: Duration,
        timeout: Duration,
        refill_at: usize,
    ) -> Self {
        let hold_limit = lease.saturating_sub(timeout) / 2;
        ReadAhead {
            held: VecDeque::new(),
            reading: None,
            finished: None,
            // A lease that leaves almost nothing beyond the timeout leaves no time to wait.
            hold_limit: (reads_ahead && hold_limit >= MIN_HOLD).then_some(hold_limit),
            refill_at,
        }
    }

    /// Whether messages are waiting for a slot.
    pub(crate) fn has_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// What the read started ahead returned (waited for if still under way), if one was
    /// started.
    pub(crate) async fn finish_reading(&mut self) -> Option<Read<H>> {
        if let Some(read) = self.finished.take() {
            return Some(read);
        }
        let reading = self.reading.take()?;
        Some(reading.await.unwrap_or_else(stopped))
    }

    /// A free slot of `slots`, or `None` on shutdown. Meanwhile the read under way is
    /// finished, and every message that waited its hold limit is handed back to `source`
    /// uncounted: the slot may be held by another of the queue's sources, whose calls do not
    /// end with this source's leases.
    pub(crate) async fn slot<S: Source<Handle = H>>(
        &mut self,
        slots: &Arc<Semaphore>,
        source: &S,
        shutdown: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        // One place in the line for the whole wait: slots go to waiters first come, first
        // served.
        let acquire = slots.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            let expiry = self.next_expiry();
            tokio::select! {
                permit = &mut acquire => {
                    return Some(permit.expect("semaphore never closed"));
                }
                _ = shutdown.cancelled() => return None,
                read = async { self.reading.as_mut().expect("checked").await },
                    if self.reading.is_some() =>
                {
                    self.reading = None;
                    self.finished = Some(read.unwrap_or_else(stopped));
                }
                _ = tokio::time::sleep_until(expiry.unwrap_or_else(Instant::now).into()),
                    if expiry.is_some() =>
                {
                    let stale = self.take_stale();
                    if !stale.is_empty() {
                        tracing::debug!(count = stale.len(), "handing back messages that waited too long for a free slot");
                        source.release(stale).await;
                    }
                }
            }
        }
    }

    /// When the oldest message received and not run reaches its hold limit.
    fn next_expiry(&self) -> Option<Instant> {
        let limit = self.hold_limit?;
        let finished = match &self.finished {
            Some((Ok(ready), _)) => ready.iter().map(|r| r.received).min(),
            _ => None,
        };
        let held = self.held.iter().map(|r| r.received).min();
        Some(held.into_iter().chain(finished).min()? + limit)
    }

    /// Every message received and not run that waited longer than its hold limit.
    fn take_stale(&mut self) -> Vec<H> {
        let Some(limit) = self.hold_limit else {
            return Vec::new();
        };
        let stale = |ready: &Ready<H>| ready.received.elapsed() > limit;
        let mut out = Vec::new();
        let mut keep = |queue: Vec<Ready<H>>| -> Vec<Ready<H>> {
            let (old, fresh): (Vec<_>, Vec<_>) = queue.into_iter().partition(stale);
            out.extend(old.into_iter().map(|ready| ready.work.handle));
            fresh
        };
        let held = keep(self.held.drain(..).collect());
        self.held.extend(held);
        if let Some((Ok(ready), _)) = &mut self.finished {
            *ready = keep(std::mem::take(ready));
        }
        out
    }

    /// Keep `ready` until slots free up.
    pub(crate) fn hold(&mut self, ready: Vec<Ready<H>>) {
        self.held.extend(ready);
    }

    /// Up to `slots` messages to run now, oldest first, and the ones that waited too long
    /// for a slot (to hand back).
    pub(crate) fn take(&mut self, slots: usize) -> (Vec<Ready<H>>, Vec<H>) {
        let mut run = Vec::with_capacity(slots.min(self.held.len()));
        let mut stale = Vec::new();
        while run.len() < slots {
            let Some(ready) = self.held.pop_front() else {
                break;
            };
            let waited = ready.received.elapsed();
            match self.hold_limit {
                Some(limit) if waited > limit => stale.push(ready.work.handle),
                _ => run.push(ready),
            }
        }
        (run, stale)
    }

    /// Whether to read the next batch now: this queue reads ahead, has a backlog (`more`),
    /// its handlers are `fast`, no read is under way and no more messages wait for a slot
    /// than `refill_at`.
    fn should_read(&self, more: bool, fast: bool) -> bool {
        self.hold_limit.is_some()
            && more
            && fast
            && self.reading.is_none()
            && self.finished.is_none()
            && self.held.len() <= self.refill_at
    }

    /// Start reading the next `batch` in the background when [`Self::should_read`].
    pub(crate) fn read_next<S: Source<Handle = H>>(
        &mut self,
        shared: &Arc<Shared<S>>,
        batch: u32,
        more: bool,
    ) {
        if !self.should_read(more, shared.call_time.fast()) {
            return;
        }
        let shared = shared.clone();
        self.reading = Some(tokio::spawn(async move { receive(&shared, batch).await }));
    }

    /// Everything received and not run: the held messages and what the read under way
    /// returns (waited for), to hand back.
    async fn drain(&mut self) -> Vec<H> {
        if let Some((Ok(ready), _)) = self.finish_reading().await {
            self.held.extend(ready);
        }
        self.held.drain(..).map(|ready| ready.work.handle).collect()
    }

    /// Hand everything received and not run back to `source` (nothing will run it now: the
    /// handler is gone, or the queue shuts down).
    pub(crate) async fn hand_back<S: Source<Handle = H>>(&mut self, source: &S) {
        let unstarted = self.drain().await;
        if !unstarted.is_empty() {
            source.release(unstarted).await;
        }
    }
}

/// What a read whose task ended without an answer returns.
fn stopped<H>(e: tokio::task::JoinError) -> Read<H> {
    (Err(format!("receiving stopped: {e}")), 0)
}

/// Slowest average handler call of a queue that reads ahead: about a store round trip.
const FAST_CALL: Duration = Duration::from_millis(5);

/// A moving average of a queue's handler call times, in microseconds (`u64::MAX` before the
/// first call: a queue reads ahead only once its handlers proved fast).
#[derive(Debug)]
pub(crate) struct CallTime(AtomicU64);

impl Default for CallTime {
    fn default() -> Self {
        CallTime(AtomicU64::new(u64::MAX))
    }
}

impl CallTime {
    /// Count one call that took `took` (each call weighs an eighth).
    pub(crate) fn observe(&self, took: Duration) {
        let sample = took.as_micros().min(u128::from(u64::MAX / 2)) as u64;
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(match old {
                    u64::MAX => sample,
                    old => old - old / 8 + sample / 8,
                })
            });
    }

    /// Whether calls lately took under [`FAST_CALL`] on average.
    pub(crate) fn fast(&self) -> bool {
        self.0.load(Ordering::Relaxed) < FAST_CALL.as_micros() as u64
    }
}

/// Shortest wait for a slot worth reading ahead for.
const MIN_HOLD: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Message;

    /// A message received `ago`, its handle `n`.
    fn ready(n: u32, ago: Duration) -> Ready<u32> {
        Ready {
            work: Work {
                handle: n,
                message: Message {
                    queue: "q".into(),
                    id: None,
                    delivery_id: n.to_string(),
                    payload: "{}".into(),
                    priority: 0,
                    attempt: 1,
                    max_attempts: 5,
                    enqueued_at_ms: 0,
                    headers: Vec::new(),
                },
                decided: None,
                inbox: None,
                label: n.to_string(),
            },
            check: Precheck::Bypass,
            received: Instant::now() - ago,
        }
    }

    fn handles(run: &[Ready<u32>]) -> Vec<u32> {
        run.iter().map(|r| r.work.handle).collect()
    }

    const LEASE: Duration = Duration::from_secs(30);
    const TIMEOUT: Duration = Duration::from_secs(10);

    #[test]
    fn held_messages_run_oldest_first_as_slots_free_and_the_stale_are_handed_back() {
        let mut ahead = ReadAhead::new(true, LEASE, TIMEOUT, 0);
        // Half of what the 30 s lease leaves beyond the 10 s timeout: 10 s.
        let over = Duration::from_secs(11);
        ahead.hold(vec![
            ready(1, over),
            ready(2, Duration::ZERO),
            ready(3, Duration::ZERO),
        ]);
        let (run, stale) = ahead.take(1);
        assert_eq!((handles(&run), stale), (vec![2], vec![1]));
        assert!(ahead.has_held());
        let (run, stale) = ahead.take(5);
        assert_eq!((handles(&run), stale), (vec![3], vec![]));
        assert!(!ahead.has_held());
    }

    /// A source that only records what is handed back to it.
    #[derive(Default)]
    struct Returns(std::sync::Mutex<Vec<u32>>);

    #[async_trait::async_trait]
    impl Source for Returns {
        type Handle = u32;
        fn provider(&self) -> &'static str {
            "test"
        }
        async fn receive(
            &self,
            _: u32,
            _: Option<&super::super::InboxBinding>,
        ) -> Result<Vec<Work<u32>>, String> {
            Ok(Vec::new())
        }
        async fn wait_for_work(&self, _: &CancellationToken) {}
        async fn settle(&self, _: u32, _: super::super::Verdict) -> super::super::Settled {
            super::super::Settled::Applied
        }
        async fn release(&self, handles: Vec<u32>) {
            self.0.lock().unwrap().extend(handles);
        }
    }

    #[tokio::test]
    async fn messages_waiting_for_a_slot_another_source_holds_go_back_at_their_limit() {
        let mut ahead = ReadAhead::new(true, LEASE, TIMEOUT, 0);
        // The limit is 10 s: one message reaches it in 50 ms, the other in 10 s.
        ahead.hold(vec![
            ready(1, Duration::from_millis(9_950)),
            ready(2, Duration::ZERO),
        ]);
        let source = Returns::default();
        let taken = Arc::new(Semaphore::new(0));
        let shutdown = CancellationToken::new();
        let waited = tokio::time::timeout(
            Duration::from_secs(1),
            ahead.slot(&taken, &source, &shutdown),
        )
        .await;
        assert!(waited.is_err(), "no slot came free");
        assert_eq!(
            *source.0.lock().unwrap(),
            vec![1],
            "handed back while waiting"
        );
        let (run, stale) = ahead.take(5);
        assert_eq!((handles(&run), stale), (vec![2], vec![]));
        // A slot that comes free is taken at once.
        taken.add_permits(1);
        assert!(ahead.slot(&taken, &source, &shutdown).await.is_some());
    }

    #[test]
    fn a_source_that_does_not_read_ahead_never_hands_back_for_waiting() {
        let mut ahead = ReadAhead::new(false, LEASE, TIMEOUT, 0);
        ahead.hold(vec![ready(1, Duration::from_secs(60))]);
        let (run, stale) = ahead.take(1);
        assert_eq!((handles(&run), stale), (vec![1], vec![]));
        // Nor does a lease that leaves less than a second beyond the timeout.
        let tight = ReadAhead::<u32>::new(true, Duration::from_millis(10_500), TIMEOUT, 0);
        assert!(tight.hold_limit.is_none());
    }

    #[test]
    fn the_next_read_starts_with_half_a_batch_or_a_round_of_slots_still_waiting() {
        assert_eq!(refill_level(256, 64), 128);
        assert_eq!(refill_level(40, 1), 20);
        assert_eq!(refill_level(32, 64), 64);
        assert_eq!(refill_level(1, 1), 1);
    }

    #[test]
    fn only_a_queue_with_fast_handlers_and_a_backlog_reads_ahead() {
        let calls = CallTime::default();
        assert!(!calls.fast(), "no call yet: not known to be fast");
        calls.observe(Duration::from_micros(40));
        assert!(calls.fast());
        for _ in 0..20 {
            calls.observe(Duration::from_millis(50));
        }
        assert!(!calls.fast(), "handlers that became slow stop it");

        let mut ahead = ReadAhead::<u32>::new(true, LEASE, TIMEOUT, 0);
        assert!(ahead.should_read(true, true));
        assert!(!ahead.should_read(false, true), "no backlog");
        assert!(!ahead.should_read(true, false), "slow handlers");
        ahead.hold(vec![ready(1, Duration::ZERO)]);
        assert!(!ahead.should_read(true, true), "a message still waits");
        let mut early = ReadAhead::<u32>::new(true, LEASE, TIMEOUT, 2);
        early.hold(vec![ready(1, Duration::ZERO), ready(2, Duration::ZERO)]);
        assert!(early.should_read(true, true), "two may still wait");
        early.hold(vec![ready(3, Duration::ZERO)]);
        assert!(!early.should_read(true, true), "three wait");
        let off = ReadAhead::<u32>::new(false, LEASE, TIMEOUT, 0);
        assert!(
            !off.should_read(true, true),
            "the source does not read ahead"
        );
    }
}

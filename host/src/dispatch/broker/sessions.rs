//! Ordered sessions on an external queue (`sessions = true` on a provider with keyed order,
//! [`crate::external::Capabilities::keyed_order`]). The broker hands the messages of one
//! session to one consumer, in order; this gate runs them one at a time there: a later message
//! of a session waits here until the one before it is settled. A message whose session still
//! has messages in the SQL queue (a failure or handoff blocking it, a retry waiting, parked or
//! pending messages, one running from SQL) is moved there behind them instead of running, so
//! the SQL queue's session rules ([`crate::queue::sessions`]) order and block it; once a session
//! has nothing left in SQL, its messages run from the broker again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::Item;
use crate::dispatch::{InboxBinding, Work};
use crate::inbox::InboxKey;
use crate::queue::now_ms;

/// The sessions of one external queue with a message handed out, and what waits behind it.
#[derive(Default)]
pub(super) struct SessionGate {
    state: Mutex<GateState>,
    /// Raised when a waiting message became ready to hand out.
    pub(super) ready: Notify,
}

#[derive(Default)]
struct GateState {
    /// Each session with a message handed out, and the messages waiting behind it, in order.
    busy: HashMap<String, VecDeque<Work<Arc<Item>>>>,
    /// Messages whose predecessor was settled, to hand out first, in order.
    ready: VecDeque<Work<Arc<Item>>>,
    /// How many messages wait (behind a predecessor, or ready).
    held: usize,
}

impl SessionGate {
    /// Let through the received `works` whose session has nothing handed out (marking it
    /// busy), and those without a session; hold the others behind their predecessor.
    pub(super) fn admit(&self, works: Vec<Work<Arc<Item>>>) -> Vec<Work<Arc<Item>>> {
        let mut state = self.state.lock().expect("session gate");
        let mut out = Vec::with_capacity(works.len());
        for work in works {
            let Some(session) = work.handle.session.clone() else {
                out.push(work);
                continue;
            };
            match state.busy.get_mut(&session) {
                Some(waiting) => {
                    waiting.push_back(work);
                    state.held += 1;
                }
                None => {
                    state.busy.insert(session, VecDeque::new());
                    out.push(work);
                }
            }
        }
        out
    }

    /// Up to `max` messages whose predecessor was settled (their session stays busy).
    pub(super) fn take_ready(&self, max: usize) -> Vec<Work<Arc<Item>>> {
        let mut state = self.state.lock().expect("session gate");
        let n = max.min(state.ready.len());
        state.held -= n;
        state.ready.drain(..n).collect()
    }

    /// Put messages taken with [`SessionGate::take_ready`] back in front, in order (they could
    /// not be vetted yet).
    pub(super) fn put_back(&self, works: Vec<Work<Arc<Item>>>) {
        let mut state = self.state.lock().expect("session gate");
        state.held += works.len();
        for work in works.into_iter().rev() {
            state.ready.push_front(work);
        }
    }

    /// How many messages wait here.
    pub(super) fn held(&self) -> usize {
        self.state.lock().expect("session gate").held
    }

    /// The handed-out message of `session` is settled, moved or acknowledged: the next one
    /// waiting behind it becomes ready, or the session is free.
    pub(super) fn settled(&self, session: &str) {
        let mut state = self.state.lock().expect("session gate");
        let next = state.busy.get_mut(session).and_then(VecDeque::pop_front);
        match next {
            Some(work) => {
                state.ready.push_back(work);
                drop(state);
                self.ready.notify_one();
            }
            None => {
                state.busy.remove(session);
            }
        }
    }

    /// The handed-out message of `session` goes back to the broker: so does everything
    /// waiting behind it (returned in order), and the session is free.
    pub(super) fn give_up(&self, session: &str) -> Vec<Arc<Item>> {
        let mut state = self.state.lock().expect("session gate");
        let waiting = state.busy.remove(session).unwrap_or_default();
        state.held -= waiting.len();
        waiting.into_iter().map(|w| w.handle).collect()
    }

    /// Shutdown: every message waiting here, ready ones first, to hand back.
    pub(super) fn take_all(&self) -> Vec<Arc<Item>> {
        let mut state = self.state.lock().expect("session gate");
        let mut out: Vec<Arc<Item>> = state.ready.drain(..).map(|w| w.handle).collect();
        for waiting in state.busy.values_mut() {
            out.extend(waiting.drain(..).map(|w| w.handle));
        }
        state.held = 0;
        out
    }
}

impl super::ExternalSource {
    /// Vet the session messages about to be handed out: one whose session has messages in
    /// the SQL queue is moved there behind them (a duplicate the consumer inbox already
    /// recorded is handed out instead, to be skipped: the inbox check comes before the session
    /// rules). When the SQL queue cannot answer, everything goes back into the gate and the
    /// receive fails, to be tried again.
    pub(super) async fn vet(
        &self,
        works: Vec<Work<Arc<Item>>>,
        inbox: Option<&InboxBinding>,
    ) -> Result<Vec<Work<Arc<Item>>>, String> {
        let vetted = |w: &Work<Arc<Item>>| w.decided.is_none() && w.handle.session.is_some();
        let mut keys: Vec<String> = works
            .iter()
            .filter(|w| vetted(w))
            .filter_map(|w| w.handle.session.clone())
            .collect();
        if keys.is_empty() {
            return Ok(works);
        }
        keys.sort();
        keys.dedup();
        let ids: Vec<String> = works
            .iter()
            .filter(|w| vetted(w))
            .filter_map(|w| w.message.id.clone())
            .collect();
        let looked_up = async {
            let held = self.sql.session_ids_held(&self.name, &ids).await?;
            let in_use = self.sql.sessions_in_use(&self.name, &keys).await?;
            Ok::<_, crate::queue::QueueError>((held, in_use))
        };
        let (held, in_use) = match looked_up.await {
            Ok(found) => found,
            Err(e) => {
                self.gate.put_back(works);
                return Err(format!(
                    "reading which sessions of queue `{}` wait in the SQL queue: {e}",
                    self.name
                ));
            }
        };
        // A broker copy of a message the SQL queue already holds was moved there before a
        // crash or a lost acknowledgement: the SQL queue owns it, so it never runs again here.
        let (again, works): (Vec<_>, Vec<_>) = works
            .into_iter()
            .partition(|w| vetted(w) && w.message.id.as_ref().is_some_and(|id| held.contains(id)));
        let drops = again.iter().map(|w| async move {
            tracing::info!(queue = %self.name, provider = %self.provider, delivery = %w.label, "delivered again after it moved into the SQL queue: acknowledged without running");
            self.ack(&w.handle).await;
            if let Some(session) = &w.handle.session {
                self.gate.settled(session);
            }
        });
        futures_util::future::join_all(drops).await;
        let (mut behind, mut out): (Vec<_>, Vec<_>) = works.into_iter().partition(|w| {
            vetted(w)
                && w.handle
                    .session
                    .as_ref()
                    .is_some_and(|s| in_use.contains(s))
        });
        if let Some(binding) = inbox {
            let duplicates = recorded(binding, &behind).await;
            let (seen, rest): (Vec<_>, Vec<_>) = behind
                .into_iter()
                .zip(duplicates)
                .partition(|(_, duplicate)| *duplicate);
            for (mut work, _) in seen {
                if let Some(ids) = work.inbox.as_mut() {
                    ids.seen = Some(true);
                }
                out.push(work);
            }
            behind = rest.into_iter().map(|(work, _)| work).collect();
        }
        let moves = behind.iter().map(|w| async move {
            let session = w.handle.session.as_deref().unwrap_or_default();
            tracing::debug!(queue = %self.name, provider = %self.provider, session, delivery = %w.label, "session has messages in the SQL queue: moving the message behind them");
            let moved = self
                .move_and_ack(
                    &w.handle,
                    None,
                    now_ms(),
                    None,
                    w.message.attempt.saturating_sub(1),
                    "session",
                )
                .await;
            if moved {
                self.gate.settled(session);
            }
        });
        futures_util::future::join_all(moves).await;
        Ok(out)
    }
}

/// Per work, whether the consumer inbox already recorded its MessageId (a failed check or a
/// message without an id counts as not recorded: it is moved, and checked again in SQL).
async fn recorded(binding: &InboxBinding, works: &[Work<Arc<Item>>]) -> Vec<bool> {
    let keys: Vec<Option<InboxKey>> = works
        .iter()
        .map(|w| {
            let ids = w.inbox.as_ref()?;
            InboxKey::new(&binding.endpoint, &ids.check).ok()
        })
        .collect();
    let asked: Vec<InboxKey> = keys.iter().flatten().cloned().collect();
    if asked.is_empty() {
        return vec![false; works.len()];
    }
    let answers = binding.store.check_many(&asked).await.unwrap_or_else(|e| {
        tracing::warn!(endpoint = %binding.endpoint, "inbox check before moving session messages failed; they are checked again in the SQL queue: {e}");
        vec![false; asked.len()]
    });
    let mut answers = answers.into_iter();
    keys.iter()
        .map(|k| k.is_some() && answers.next().unwrap_or(false))
        .collect()
}

//! The locks a Service Bus consumer holds: renewal while handlers run, forgetting the ones
//! the broker took back, and handing back what was received for a queue that stopped
//! receiving.

use std::sync::Arc;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::KIND;
use super::consumer::{LockId, RENEW_TICK, State};
use super::rest::LockAction;
use crate::external::Delivery;

/// Every [`RENEW_TICK`]: forget locks that are gone (lost, or expired — their message is
/// the broker's again, and their room is free), hand buffered deliveries back when nothing
/// asked for messages for [`super::consumer::PAUSE_AFTER`], and renew held locks at half their duration
/// (when renewal is on). Ends after `stop` once no lock is left.
pub(super) async fn keep_locks(state: Arc<State>) {
    let mut warned = false;
    loop {
        tokio::time::sleep(RENEW_TICK).await;
        if state.stopping.is_cancelled() && state.locks.lock().expect("locks").is_empty() {
            return;
        }
        if state.idle() && !state.stopping.is_cancelled() {
            unlock_buffered(&state).await;
        }
        let now = Instant::now();
        let due: Vec<(u64, String)> = {
            let mut locks = state.locks.lock().expect("locks");
            locks.retain(|_, l| !l.lost && l.expires + RENEW_TICK >= now);
            if !state.renew {
                continue;
            }
            locks
                .iter()
                .filter(|(_, l)| !l.lost && !l.settling && l.expires < now + l.lock_for / 2)
                .map(|(id, l)| (*id, l.url.clone()))
                .collect()
        };
        let renewed = join_all(
            due.iter()
                .map(|(_, url)| state.rest.on_lock(url, LockAction::Renew)),
        )
        .await;
        let mut locks = state.locks.lock().expect("locks");
        for ((id, _), outcome) in due.into_iter().zip(renewed) {
            let Some(lock) = locks.get_mut(&id) else {
                continue;
            };
            match outcome {
                Ok(true) => lock.expires = now + lock.lock_for,
                Ok(false) => lock.lost = true,
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(topic = %state.topic, "renewing message locks failed, retrying: {e}");
                }
                Err(_) => {}
            }
        }
    }
}

/// Unlock the deliveries received but not handed out (the queue stopped asking).
async fn unlock_buffered(state: &State) {
    let buffered: Vec<Delivery> = state.buffer.lock().expect("buffer").drain(..).collect();
    if buffered.is_empty() {
        return;
    }
    let urls: Vec<String> = {
        let mut locks = state.locks.lock().expect("locks");
        buffered
            .iter()
            .filter_map(|d| d.handle.get::<LockId>(KIND).ok())
            .filter_map(|id| locks.remove(&id.0))
            .map(|l| l.url.clone())
            .collect()
    };
    tracing::debug!(topic = %state.topic, "nothing receives from this queue: unlocking {} buffered message(s)", urls.len());
    join_all(
        urls.iter()
            .map(|url| state.rest.on_lock(url, LockAction::Unlock)),
    )
    .await;
}

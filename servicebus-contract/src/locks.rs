//! The operations on a message lock (the `Location` a peek-lock answers with), each
//! following the section of the Service Bus REST reference it names: complete, unlock and
//! renew; a lock that is unknown or expired is 404.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::sas::authorize;
use super::{Refusal, Shared, Subscription, count_request, gone};

/// An operation on the lock URL: authorize it, find the locked message by its sequence
/// number (or MessageId) and lock token, and `act` on it; 200, or the refusal.
fn with_lock(
    shared: &Shared,
    headers: &HeaderMap,
    (topic, sub, id, token): &(String, String, String, String),
    act: impl FnOnce(&mut Subscription, i64, Duration),
) -> Response {
    count_request(shared);
    let path = format!("/{topic}/subscriptions/{sub}/messages/{id}/{token}");
    match authorize(shared, headers, &path)
        .and_then(|()| find_lock(shared, (topic, sub, id, token), act))
    {
        Ok(()) => StatusCode::OK.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

fn find_lock(
    shared: &Shared,
    (topic, sub, id, token): (&String, &String, &String, &String),
    act: impl FnOnce(&mut Subscription, i64, Duration),
) -> Result<(), Refusal> {
    let mut broker = shared.broker.lock().unwrap();
    let lock_duration = broker.lock_duration;
    let Some(subscription) = broker.topics.get_mut(topic).and_then(|t| t.get_mut(sub)) else {
        return Err(gone(&format!("subscription `{topic}/{sub}`")));
    };
    let now = SystemTime::now();
    let found = subscription
        .messages
        .values()
        .find(|m| {
            (m.sequence.to_string() == *id || m.message_id == *id)
                && m.lock
                    .as_ref()
                    .is_some_and(|(t, until)| t == token && *until > now)
        })
        .map(|m| m.sequence);
    match found {
        Some(seq) => {
            act(subscription, seq, lock_duration);
            Ok(())
        }
        // The lock is unknown or expired: the message is no longer locked by this receiver.
        None => {
            broker.refused_locks += 1;
            Err(Refusal(
                StatusCode::NOT_FOUND,
                "lock not found or expired".to_string(),
            ))
        }
    }
}

type LockPath = Path<(String, String, String, String)>;

/// "Delete Message" (DELETE on the lock URL): completes the message; 200, or 404 when the
/// lock is unknown or expired.
pub(super) async fn complete(
    State(shared): State<Arc<Shared>>,
    Path(p): LockPath,
    headers: HeaderMap,
) -> Response {
    with_lock(&shared, &headers, &p, |sub, seq, _| {
        sub.messages.remove(&seq);
    })
}

/// "Unlock Message" (PUT on the lock URL): the message is available again at once (its
/// delivery was counted when it was locked); 200, or 404.
pub(super) async fn unlock(
    State(shared): State<Arc<Shared>>,
    Path(p): LockPath,
    headers: HeaderMap,
) -> Response {
    let answer = with_lock(&shared, &headers, &p, |sub, seq, _| {
        sub.messages.get_mut(&seq).expect("found").lock = None;
    });
    shared.sent.notify_waiters();
    answer
}

/// "Renew-Lock for a Message" (POST on the lock URL): the lock lasts another lock duration
/// from now; 200, or 404.
pub(super) async fn renew(
    State(shared): State<Arc<Shared>>,
    Path(p): LockPath,
    headers: HeaderMap,
) -> Response {
    with_lock(&shared, &headers, &p, |sub, seq, duration| {
        let m = sub.messages.get_mut(&seq).expect("found");
        if let Some((_, until)) = &mut m.lock {
            *until = SystemTime::now() + duration;
        }
    })
}

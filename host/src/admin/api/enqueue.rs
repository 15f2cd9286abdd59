//! `POST /api/v1/queues/{queue}/messages`: enqueue one message through the host's enqueue
//! path, the same as `wharf enqueue` (limits, identity, the queue's broker); one that arrives
//! while the host starts waits (up to 30 s) for its brokers to open. A `traceparent`
//! header is the producer's trace context: with traces on, the message's `send` span is its
//! child.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::admin::AppState;
use crate::enqueue::{EnqueueError, Enqueuer as _};
use crate::queue::{EnqueueStatus, NewMessage, limits, now_ms};

/// How long an enqueue waits for a starting host to open its brokers.
const STARTING_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The body of an enqueue.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnqueueBody {
    /// The message: any JSON value.
    payload: serde_json::Value,
    /// Its MessageId.
    #[serde(default)]
    id: Option<String>,
    /// Higher runs first.
    #[serde(default)]
    priority: i32,
    /// Milliseconds before it may run.
    #[serde(default)]
    delay_ms: Option<u64>,
    /// Headers (a `traceparent` is the producer's trace context).
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Its session key, in a queue with sessions.
    #[serde(default)]
    session: Option<String>,
}

/// What an enqueue did.
#[derive(Debug, Serialize)]
pub struct Enqueued {
    /// The message's key in the SQL queue (0 when it went to the queue's broker).
    pub key: i64,
    /// `added`, `updated` or `discarded`.
    pub status: EnqueueStatus,
}

pub(super) async fn enqueue(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Json<EnqueueBody>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Enqueued>), ApiError> {
    let Json(body) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be {{\"payload\": …}} with optional id, priority, delay_ms, headers and session: {e}"
        ))
    })?;
    if body.session.is_some() && state.config.queues.get(&queue).is_some_and(|q| !q.sessions) {
        return Err(ApiError::bad_request(format!(
            "queue `{queue}` does not keep sessions: add `sessions = true` to [queues.{queue}] (or leave out session)"
        )));
    }
    // An enqueue that arrives while the host opens its brokers waits for them.
    let Ok(router) = tokio::time::timeout(STARTING_WAIT, state.router.wait()).await else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the host is still starting (its brokers not open after {} s): try again in a moment",
                STARTING_WAIT.as_secs()
            ),
        ));
    };
    let mut message = NewMessage {
        id: body.id,
        payload: body.payload.to_string(),
        priority: body.priority,
        process_at_ms: body.delay_ms.map(|ms| limits::due_after(now_ms(), ms)),
        headers: body.headers.into_iter().collect(),
        session: body.session,
        ..Default::default()
    };
    router.trace_send(&queue, &mut message);
    match router.enqueue(&queue, message).await {
        Ok(done) => Ok((
            StatusCode::CREATED,
            Json(Enqueued {
                key: done.key,
                status: done.status,
            }),
        )),
        Err(e @ EnqueueError::UnknownQueue { .. }) => Err(ApiError::not_found(e.to_string())),
        Err(e @ (EnqueueError::InvalidPayload { .. } | EnqueueError::Limit { .. })) => {
            Err(ApiError::bad_request(e.to_string()))
        }
        Err(e @ EnqueueError::External { .. }) => {
            Err(ApiError::new(StatusCode::BAD_GATEWAY, e.to_string()))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

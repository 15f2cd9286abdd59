//! The API's side of ordered sessions: blocked sessions with their blockers, and settling a
//! handed-off message as completed or failed (which unblocks and drains its session).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use super::commands::Changed;
use super::error::{ApiError, ApiResult, Key, Params};
use super::{MAX_PAGE, known_queue, stored};
use crate::admin::AppState;
use crate::queue::{BlockedSession, Status};

/// `GET /sessions` parameters.
#[derive(Debug, Deserialize)]
pub(super) struct SessionsQuery {
    queue: Option<String>,
    limit: Option<u32>,
}

pub(super) async fn blocked(
    State(state): State<AppState>,
    Params(query): Params<SessionsQuery>,
) -> ApiResult<Vec<BlockedSession>> {
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_PAGE}, not {limit}"
        )));
    }
    if let Some(queue) = &query.queue {
        known_queue(&state, queue)?;
    }
    let blocked = state
        .store
        .blocked_sessions(query.queue.as_deref(), limit)
        .await?;
    Ok(Json(blocked))
}

/// `POST /messages/{key}/fail` body (optional).
#[derive(Debug, Deserialize)]
pub(super) struct FailBody {
    error: Option<String>,
}

pub(super) async fn complete(State(state): State<AppState>, Key(key): Key) -> ApiResult<Changed> {
    settle(&state, key, None).await
}

pub(super) async fn fail(
    State(state): State<AppState>,
    Key(key): Key,
    body: axum::body::Bytes,
) -> ApiResult<Changed> {
    let given = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let body: FailBody = serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body must be empty or {{\"error\": \"…\"}}: {e}"
            ))
        })?;
        body.error
    };
    let error = given.unwrap_or_else(|| "the handoff failed".to_string());
    settle(&state, key, Some(&error)).await
}

async fn settle(state: &AppState, key: i64, failure: Option<&str>) -> ApiResult<Changed> {
    let message = stored(state, key).await?;
    if !state.store.settle_handoff(key, failure).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "message {key} is {}, not {}: only a handed-off message is settled this way",
                message.status,
                Status::HandedOff
            ),
        ));
    }
    crate::metrics::counts::want_fresh();
    Ok(Json(Changed { changed: 1 }))
}

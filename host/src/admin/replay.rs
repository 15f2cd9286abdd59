//! `POST /api/v1/replay`: run stored messages against a candidate component uploaded as the
//! request body — one message (`?key=K`) or the newest messages of a queue in a status
//! (`?queue=Q&status=failed&limit=N`) — without side effects, as `wharf replay` does.
//! Replays run one at a time, on a blocking thread (compiling a candidate takes seconds of
//! CPU), so an upload never stalls the host's message processing or the other endpoints.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;

use super::AppState;
use super::api::error::{ApiError, Params};
use crate::queue::Status;
use crate::replay::{ReplayError, ReplayReport, Selection, replay_selection};

/// The largest candidate accepted (interpreted-language components reach ~20 MB).
pub const MAX_CANDIDATE: usize = 64 * 1024 * 1024;

/// Most messages one queue replay runs.
pub const MAX_REPLAY: u32 = 100;

/// One replay at a time: each compiles a component, which is memory- and CPU-hungry.
static RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// `POST /replay` parameters.
#[derive(Debug, Deserialize)]
pub(super) struct ReplayQuery {
    key: Option<i64>,
    queue: Option<String>,
    status: Option<String>,
    limit: Option<u32>,
}

fn selection(query: ReplayQuery) -> Result<Selection, ApiError> {
    match (query.key, query.queue) {
        (Some(key), None) => Ok(Selection::One(key)),
        (None, Some(queue)) => {
            let limit = query.limit.unwrap_or(20);
            if limit == 0 || limit > MAX_REPLAY {
                return Err(ApiError::bad_request(format!(
                    "limit must be between 1 and {MAX_REPLAY}, not {limit}"
                )));
            }
            Ok(Selection::Queue {
                queue,
                status: Status::parse(query.status.as_deref().unwrap_or("failed")),
                limit,
            })
        }
        _ => Err(ApiError::bad_request(
            "give either `key` or `queue` (with optional `status`, default failed, and `limit`)"
                .to_string(),
        )),
    }
}

pub(super) async fn replay(
    State(state): State<AppState>,
    Params(query): Params<ReplayQuery>,
    headers: HeaderMap,
    candidate: Bytes,
) -> Result<Json<ReplayReport>, ApiError> {
    // Only `application/wasm`: a browser must then ask (CORS preflight) before another site's
    // page could post here, and this server never says yes.
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type != "application/wasm" {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("send the candidate as `Content-Type: application/wasm`, not `{content_type}`"),
        ));
    }
    let selection = selection(query)?;
    if candidate.is_empty() {
        return Err(ApiError::bad_request(
            "the request body must be the candidate component (a .wasm file)".to_string(),
        ));
    }
    // The turn is held by the blocking job itself: a client that hangs up does not free it
    // while the replay still runs.
    let turn = RUNNING.acquire().await.expect("never closed");
    let config = state.config.as_ref().clone();
    let store = Arc::clone(&state.store);
    let runtime = tokio::runtime::Handle::current();
    let report = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        runtime.block_on(replay_selection(
            config,
            &store,
            Vec::from(candidate),
            &selection,
        ))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the replay stopped: {e}")))?;
    report.map(Json).map_err(|e| match e {
        ReplayError::NoMessage(_) | ReplayError::NoQueue(_) | ReplayError::UnknownQueue { .. } => {
            ApiError::not_found(e.to_string())
        }
        ReplayError::Candidate { .. } | ReplayError::NoHandler(_) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        ReplayError::Store(store) => store.into(),
        ReplayError::Setup(_) => ApiError::internal(e.to_string()),
    })
}

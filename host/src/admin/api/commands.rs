//! The API's management calls: retry, move and delete one message, or every message of a
//! queue in a status (at most [`MAX_BULK`] per call).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult, Key, Params};
use super::{MAX_BULK, known_queue, stored};
use crate::admin::AppState;
use crate::queue::{MessageFilter, Selector, Status};

/// What a management call changed.
#[derive(Debug, Serialize, Deserialize)]
pub struct Changed {
    /// Messages changed.
    pub changed: u64,
}

pub(super) async fn retry(State(state): State<AppState>, Key(key): Key) -> ApiResult<Changed> {
    stored(&state, key).await?;
    let changed = state.store.retry(&Selector::Key(key)).await?;
    if changed == 0 {
        return Err(busy(key));
    }
    crate::metrics::counts::want_fresh();
    Ok(Json(Changed { changed }))
}

fn busy(key: i64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!("message {key} is being processed: try again when it settles"),
    )
}

/// `POST /messages/retry` parameters: every message of `queue` in `status`.
#[derive(Debug, Deserialize)]
pub(super) struct RetryAllQuery {
    queue: String,
    status: String,
}

pub(super) async fn retry_all(
    State(state): State<AppState>,
    Params(query): Params<RetryAllQuery>,
) -> ApiResult<Changed> {
    known_queue(&state, &query.queue)?;
    let selector = Selector::QueueStatus {
        queue: query.queue,
        status: Status::parse(&query.status),
    };
    let changed = state.store.retry(&selector).await?;
    crate::metrics::counts::want_fresh();
    Ok(Json(Changed { changed }))
}

/// `POST /messages/{key}/move` body.
#[derive(Debug, Deserialize)]
pub(super) struct MoveBody {
    status: String,
}

/// The status a move body names, if a message may be moved there by hand.
fn target_status(
    body: Result<Json<MoveBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Status, ApiError> {
    let Json(body) = body.map_err(|e| {
        ApiError::bad_request(format!("the body must be {{\"status\": \"…\"}}: {e}"))
    })?;
    let status = Status::parse(&body.status);
    if matches!(
        status,
        Status::Processing | Status::AwaitingRelease | Status::Parked | Status::HandedOff
    ) || !crate::config::is_valid_name(&body.status)
    {
        return Err(ApiError::bad_request(format!(
            "cannot move a message to `{}`: use pending, failed, sleeping, processed or a custom name",
            body.status
        )));
    }
    Ok(status)
}

pub(super) async fn move_to(
    State(state): State<AppState>,
    Key(key): Key,
    body: Result<Json<MoveBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Changed> {
    let status = target_status(body)?;
    stored(&state, key).await?;
    if !state.store.move_to(key, &status).await? {
        return Err(busy(key));
    }
    crate::metrics::counts::want_fresh();
    Ok(Json(Changed { changed: 1 }))
}

/// `POST /messages/move` and `DELETE /messages` parameters: up to `limit` messages of
/// `queue` in `status`, newest first.
#[derive(Debug, Deserialize)]
pub(super) struct BulkQuery {
    queue: String,
    status: String,
    limit: Option<u32>,
}

/// What a change by filter did.
#[derive(Debug, Serialize)]
pub struct BulkChanged {
    /// Messages changed.
    pub changed: u64,
    /// Messages skipped because they were being processed.
    pub skipped: u64,
}

/// The messages a bulk call selects.
async fn selected(state: &AppState, query: &BulkQuery) -> Result<Vec<i64>, ApiError> {
    known_queue(state, &query.queue)?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_BULK {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_BULK}, not {limit}"
        )));
    }
    let filter = MessageFilter {
        queue: Some(query.queue.clone()),
        status: Some(Status::parse(&query.status)),
        limit,
        ..Default::default()
    };
    Ok(state
        .store
        .list(&filter)
        .await?
        .iter()
        .map(|m| m.key)
        .collect())
}

pub(super) async fn move_all(
    State(state): State<AppState>,
    Params(query): Params<BulkQuery>,
    body: Result<Json<MoveBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<BulkChanged> {
    let target = target_status(body)?;
    let mut done = BulkChanged {
        changed: 0,
        skipped: 0,
    };
    for key in selected(&state, &query).await? {
        if state.store.move_to(key, &target).await? {
            done.changed += 1;
        } else {
            done.skipped += 1;
        }
    }
    crate::metrics::counts::want_fresh();
    Ok(Json(done))
}

pub(super) async fn delete_all(
    State(state): State<AppState>,
    Params(query): Params<BulkQuery>,
) -> ApiResult<BulkChanged> {
    let mut done = BulkChanged {
        changed: 0,
        skipped: 0,
    };
    for key in selected(&state, &query).await? {
        if state.store.delete(key).await? {
            done.changed += 1;
        } else {
            done.skipped += 1;
        }
    }
    crate::metrics::counts::want_fresh();
    Ok(Json(done))
}

pub(super) async fn delete(State(state): State<AppState>, Key(key): Key) -> ApiResult<Changed> {
    stored(&state, key).await?;
    if !state.store.delete(key).await? {
        return Err(busy(key));
    }
    crate::metrics::counts::want_fresh();
    Ok(Json(Changed { changed: 1 }))
}

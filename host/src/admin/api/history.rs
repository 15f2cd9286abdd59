//! `GET /queues/{queue}/history`: a queue's processed and failed messages per second and its
//! depth since the host started (at most the last hour), as the gauge sampler recorded them
//! ([`crate::metrics::history`]); the dashboard draws its charts from it.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult};
use super::known_queue;
use crate::admin::AppState;
use crate::metrics::{Point, history};

/// One queue's recent history.
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueHistory {
    /// Queue name.
    pub queue: String,
    /// How often the sampler takes a point (`host.metrics_interval`), in milliseconds.
    pub interval_ms: u64,
    /// How far back the history reaches at most, in seconds.
    pub span_s: u64,
    /// The points, oldest first.
    pub points: Vec<Point>,
}

pub(super) async fn queue_history(
    State(state): State<AppState>,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> ApiResult<QueueHistory> {
    let Path(queue) = path.map_err(ApiError::from)?;
    known_queue(&state, &queue)?;
    let interval = state.config.host.metrics_interval.max(history::MIN_SPACING);
    Ok(Json(QueueHistory {
        points: history::history(&queue),
        queue,
        interval_ms: interval.as_millis() as u64,
        span_s: history::SPAN.as_secs(),
    }))
}

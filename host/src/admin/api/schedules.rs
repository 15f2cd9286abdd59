//! The API's side of schedules and hosts: every configured schedule with its next and last
//! tick and the host that enqueued the last, and the hosts sharing the store.

use axum::Json;
use axum::extract::State;

use super::error::ApiResult;
use crate::admin::AppState;
use crate::clock::now_ms;
use crate::schedule::ScheduleView;
use crate::schedule::hosts::HostView;

/// `GET /schedules`.
pub(super) async fn list(State(state): State<AppState>) -> ApiResult<Vec<ScheduleView>> {
    let rows = state.store.schedules().await?;
    Ok(Json(crate::schedule::views(
        &state.config.schedules,
        &rows,
        now_ms(),
    )))
}

/// `GET /hosts`.
pub(super) async fn hosts(State(state): State<AppState>) -> ApiResult<Vec<HostView>> {
    let hosts = state.store.hosts().await?;
    Ok(Json(crate::schedule::hosts::views(hosts, now_ms())))
}

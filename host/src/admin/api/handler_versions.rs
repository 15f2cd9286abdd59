//! The API's side of handlers from the shared store: each handler's current version, its
//! stored versions, and the deploy log of which host served (or rejected) which version
//! since when.

use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use super::error::ApiResult;
use crate::admin::AppState;
use crate::queue::{CurrentVersion, HandlerVersion, ServedVersion};

/// `GET /handler-versions` query.
#[derive(Debug, Deserialize)]
pub(super) struct Filter {
    /// One handler only (and its stored versions).
    handler: Option<String>,
}

/// `GET /handler-versions` answer.
#[derive(Debug, Serialize)]
pub(super) struct HandlerVersions {
    current: Vec<CurrentVersion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    versions: Option<Vec<HandlerVersion>>,
    hosts: Vec<ServedVersion>,
}

/// `GET /handler-versions[?handler=NAME]`.
pub(super) async fn list(
    State(state): State<AppState>,
    Query(filter): Query<Filter>,
) -> ApiResult<HandlerVersions> {
    let name = filter.handler.as_deref();
    let mut current = state.store.handler_current().await?;
    current.retain(|c| name.is_none_or(|n| c.name == n));
    let versions = match name {
        Some(name) => Some(state.store.handler_versions(name).await?),
        None => None,
    };
    let hosts = state.store.handler_served(name).await?;
    Ok(Json(HandlerVersions {
        current,
        versions,
        hosts,
    }))
}

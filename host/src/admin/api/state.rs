//! The API's side of handlers' key-value state (`wasi:keyvalue`): the buckets, a bucket's
//! keys with their values, one key, and deleting one (an operator's change, outside any
//! message's outcome).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use super::MAX_PAGE;
use super::error::{ApiError, ApiResult, Params};
use crate::admin::AppState;

/// One key: its value as text (invalid UTF-8 replaced) and its revision.
#[derive(Debug, Serialize)]
pub(super) struct StateEntry {
    bucket: String,
    key: String,
    value: String,
    revision: i64,
}

/// A bucket: granted to handlers by the configuration, or holding keys (or both).
#[derive(Debug, Serialize)]
pub(super) struct BucketInfo {
    bucket: String,
    keys: u64,
    /// The handlers whose `keyvalue` grants it, in name order.
    granted_to: Vec<String>,
}

/// `GET /state/{bucket}` parameters.
#[derive(Debug, Deserialize)]
pub(super) struct KeysQuery {
    limit: Option<u32>,
    offset: Option<u64>,
}

/// `DELETE /state/{bucket}/{key}` answer.
#[derive(Debug, Serialize)]
pub(super) struct Deleted {
    deleted: bool,
}

fn entry(bucket: &str, key: String, (value, revision): (Vec<u8>, i64)) -> StateEntry {
    StateEntry {
        bucket: bucket.to_string(),
        key,
        value: String::from_utf8_lossy(&value).into_owned(),
        revision,
    }
}

pub(super) async fn list(
    State(state): State<AppState>,
    Path(bucket): Path<String>,
    Params(query): Params<KeysQuery>,
) -> ApiResult<Vec<StateEntry>> {
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_PAGE}, not {limit}"
        )));
    }
    let entries = state
        .store
        .state_entries(&bucket, query.offset.unwrap_or(0), limit)
        .await?;
    Ok(Json(
        entries
            .into_iter()
            .map(|(key, committed)| entry(&bucket, key, committed))
            .collect(),
    ))
}

pub(super) async fn buckets(State(state): State<AppState>) -> ApiResult<Vec<BucketInfo>> {
    let mut all: BTreeMap<String, BucketInfo> = BTreeMap::new();
    let info = |bucket: &str| BucketInfo {
        bucket: bucket.to_string(),
        keys: 0,
        granted_to: Vec::new(),
    };
    for (handler, config) in &state.config.handlers {
        for bucket in &config.keyvalue {
            all.entry(bucket.clone())
                .or_insert_with(|| info(bucket))
                .granted_to
                .push(handler.clone());
        }
    }
    for (bucket, keys) in state.store.state_buckets().await? {
        all.entry(bucket.clone())
            .or_insert_with(|| info(&bucket))
            .keys = keys;
    }
    Ok(Json(all.into_values().collect()))
}

pub(super) async fn get(
    State(state): State<AppState>,
    Path((bucket, key)): Path<(String, String)>,
) -> ApiResult<StateEntry> {
    match state.store.state_read(&bucket, &key).await? {
        Some(committed) => Ok(Json(entry(&bucket, key, committed))),
        None => Err(ApiError::not_found(format!(
            "no key `{key}` in bucket `{bucket}`"
        ))),
    }
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Path((bucket, key)): Path<(String, String)>,
) -> ApiResult<Deleted> {
    if !state.store.state_delete(&bucket, &key).await? {
        return Err(ApiError::not_found(format!(
            "no key `{key}` in bucket `{bucket}`: nothing deleted"
        )));
    }
    Ok(Json(Deleted { deleted: true }))
}

//! The message API under `/api/v1/`: queues with their counts by status and their last hour
//! of rates and depth, enqueueing a message, messages filtered by queue, status, MessageId and session with cursor
//! pagination, blocked sessions, one message with its history, retry / move / delete (one
//! message, or every message of a queue in a status), the deployed handlers and the deploy
//! log, schedules and hosts. Answers are JSON; errors are `{"error": "…"}` naming what was wrong.

use std::collections::BTreeMap;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

mod commands;
mod enqueue;
pub(crate) mod error;
mod handler_versions;
mod history;
mod schedules;
mod sessions;
mod state;

pub use self::commands::{BulkChanged, Changed};
use self::commands::{delete, delete_all, move_all, move_to, retry, retry_all};
pub use self::enqueue::Enqueued;
pub use self::error::ApiError;
pub(crate) use self::error::Params;
use self::error::{ApiResult, Key};
pub use self::history::QueueHistory;
use super::AppState;
use crate::queue::{HistoryEntry, MessageFilter, Status, StoredMessage};

/// Most messages one page lists.
pub const MAX_PAGE: u32 = 500;

/// Most messages one move or delete by filter changes (repeat the call for more).
pub const MAX_BULK: u32 = 1000;

/// The API's routes (mounted under `/api/v1`).
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/queues", get(queues))
        .route("/queues/{queue}/history", get(history::queue_history))
        .route("/queues/{queue}/messages", post(enqueue::enqueue))
        .route("/messages", get(messages).delete(delete_all))
        .route("/messages/retry", post(retry_all))
        .route("/messages/move", post(move_all))
        .route("/messages/{key}", get(message).delete(delete))
        .route("/messages/{key}/retry", post(retry))
        .route("/messages/{key}/move", post(move_to))
        .route("/messages/{key}/complete", post(sessions::complete))
        .route("/messages/{key}/fail", post(sessions::fail))
        .route("/sessions", get(sessions::blocked))
        .route("/schedules", get(schedules::list))
        .route("/hosts", get(schedules::hosts))
        .route("/state", get(state::buckets))
        .route("/state/{bucket}", get(state::list))
        .route(
            "/state/{bucket}/{key}",
            get(state::get).delete(state::delete),
        )
        .route("/handlers", get(super::handlers))
        .route("/deploys", get(deploys))
        .route("/handler-versions", get(handler_versions::list))
        .route(
            "/replay",
            post(super::replay::replay).layer(DefaultBodyLimit::max(super::replay::MAX_CANDIDATE)),
        )
        .route("/openapi.json", get(openapi))
        .fallback(|| async { ApiError::not_found("no such API endpoint".to_string()) })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method".to_string(),
            )
        })
}

/// One configured queue.
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueInfo {
    /// Queue name.
    pub name: String,
    /// The handler bound to it (`null` for a queue that only holds its messages).
    pub handler: Option<String>,
    /// Whether that handler is deployed now.
    pub handler_deployed: bool,
    /// `sql` or `external`.
    pub storage: String,
    /// The provider of an external queue.
    pub provider: Option<String>,
    /// Messages in the SQL queue by status, as last counted.
    pub counts: BTreeMap<String, u64>,
    /// When they were counted (ms since the epoch): counts are sampled, at most a few
    /// seconds old while someone is looking.
    pub counted_at_ms: i64,
    /// Processed and failed per second over the last minute.
    pub rates: crate::metrics::Rates,
    /// Messages processed and failed for good by this host since it started, whatever
    /// their source: the only count of an external queue's successes, which the broker
    /// does not keep.
    #[serde(default)]
    pub since_start: crate::metrics::Totals,
    /// For an external queue with handlers' follow-ups committed but not yet published into
    /// its broker: how many, since when, and the last publication error.
    #[serde(default)]
    pub outbox: Option<crate::queue::OutboxBacklog>,
    /// When counted: how long the oldest ready message of the queue had waited since it
    /// became ready (ms; `null` when none was ready) — an autoscaling signal. The SQL
    /// queue's, or for a Kafka queue the oldest record its processing group has not
    /// committed, when that is older.
    #[serde(default)]
    pub oldest_ready_age_ms: Option<i64>,
    /// When counted, for a Kafka queue: its processing group's lag (messages past the
    /// committed offsets); `null` for other queues.
    #[serde(default)]
    pub lag: Option<u64>,
}

async fn queues(State(state): State<AppState>) -> ApiResult<Vec<QueueInfo>> {
    let mut out = Vec::new();
    // Only external queues have an outbox: no query for a host without one.
    let any_external = state
        .config
        .queues
        .values()
        .any(|q| q.storage == crate::config::QueueStorage::External);
    let mut outbox = match any_external {
        true => state.store.outbox_backlog().await?,
        false => Vec::new(),
    };
    for (name, queue) in &state.config.queues {
        let snapshot = match crate::metrics::counts::latest(name) {
            Some(snapshot) => snapshot,
            // Not sampled yet (the host just started): count once now.
            None => {
                let counts = state.store.counts(name).await?;
                crate::metrics::counts::record(name, counts);
                crate::metrics::counts::latest(name).expect("just recorded")
            }
        };
        let counts = snapshot.counts;
        out.push(QueueInfo {
            name: name.clone(),
            handler: queue.handler.clone(),
            handler_deployed: queue
                .handler()
                .is_some_and(|handler| state.registry.get(handler).is_some()),
            storage: format!("{:?}", queue.storage).to_lowercase(),
            provider: queue.provider.clone(),
            counts: counts
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(s, n)| (s.as_str().to_string(), n))
                .collect(),
            counted_at_ms: snapshot.at_ms,
            rates: crate::metrics::rates(name),
            since_start: crate::metrics::totals(name),
            outbox: outbox
                .iter()
                .position(|b| &b.queue == name)
                .map(|at| outbox.swap_remove(at)),
            oldest_ready_age_ms: snapshot
                .oldest_ready_ms
                .map(|at| (snapshot.at_ms - at).max(0)),
            lag: snapshot.lag,
        });
    }
    Ok(Json(out))
}

/// `GET /messages` parameters.
#[derive(Debug, Deserialize)]
struct ListQuery {
    queue: Option<String>,
    status: Option<String>,
    id: Option<String>,
    session: Option<String>,
    /// The `next_cursor` of the previous page.
    cursor: Option<i64>,
    limit: Option<u32>,
}

/// One page of messages, newest first.
#[derive(Debug, Serialize)]
pub struct MessagePage {
    /// The messages.
    pub messages: Vec<StoredMessage>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<i64>,
}

async fn messages(
    State(state): State<AppState>,
    Params(query): Params<ListQuery>,
) -> ApiResult<MessagePage> {
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_PAGE}, not {limit}"
        )));
    }
    if let Some(queue) = &query.queue {
        known_queue(&state, queue)?;
    }
    let filter = MessageFilter {
        queue: query.queue,
        status: query.status.as_deref().map(Status::parse),
        id: query.id,
        session: query.session,
        before_key: query.cursor,
        limit: limit + 1,
    };
    let mut messages = state.store.list(&filter).await?;
    let next_cursor = if messages.len() > limit as usize {
        messages.truncate(limit as usize);
        messages.last().map(|m| m.key)
    } else {
        None
    };
    Ok(Json(MessagePage {
        messages,
        next_cursor,
    }))
}

fn known_queue(state: &AppState, queue: &str) -> Result<(), ApiError> {
    if state.config.queues.contains_key(queue) {
        return Ok(());
    }
    let known: Vec<&str> = state.config.queues.keys().map(String::as_str).collect();
    Err(ApiError::not_found(format!(
        "no queue `{queue}` is configured (known: {})",
        known.join(", ")
    )))
}

/// One message and the earlier versions of its MessageId.
#[derive(Debug, Serialize)]
pub struct MessageDetail {
    /// The message.
    pub message: StoredMessage,
    /// Earlier versions kept for its MessageId, oldest first (empty without an id).
    pub history: Vec<HistoryEntry>,
    /// The trace it belongs to, from its `traceparent` header.
    pub trace_id: Option<String>,
}

async fn stored(state: &AppState, key: i64) -> Result<StoredMessage, ApiError> {
    state
        .store
        .get(key)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no message with key {key}")))
}

async fn message(State(state): State<AppState>, Key(key): Key) -> ApiResult<MessageDetail> {
    let message = stored(&state, key).await?;
    let history = match &message.id {
        Some(id) => state.store.history(&message.queue, id).await?,
        None => Vec::new(),
    };
    let trace_id = crate::telemetry::trace_id_of(&message.headers);
    Ok(Json(MessageDetail {
        message,
        history,
        trace_id,
    }))
}

async fn deploys(State(state): State<AppState>) -> Json<Vec<crate::runtime::DeployEvent>> {
    Json(state.registry.deploys.recent())
}

/// The OpenAPI document of this API (kept in sync with the routes by a test).
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Every `.route("PATH", get(..).delete(..))` of [`super::routes`], as (method, path).
    fn routed() -> BTreeSet<(String, String)> {
        let source = include_str!("mod.rs");
        let body = &source[source.find("fn routes()").unwrap()..];
        let body = &body[..body.find(".fallback(").unwrap()];
        let mut out = BTreeSet::new();
        for call in body.split(".route(").skip(1) {
            let path = call.split('"').nth(1).unwrap().to_string();
            for method in ["get", "post", "delete", "put", "patch"] {
                if call.contains(&format!("{method}(")) {
                    out.insert((method.to_string(), path.replace(['{', '}'], "")));
                }
            }
        }
        out
    }

    #[test]
    fn the_openapi_document_lists_exactly_the_routes() {
        let doc: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        let mut documented = BTreeSet::new();
        for (path, operations) in doc["paths"].as_object().unwrap() {
            for method in operations.as_object().unwrap().keys() {
                documented.insert((method.clone(), path.replace(['{', '}'], "")));
            }
        }
        let routed = routed();
        assert!(routed.len() >= 10, "{routed:?}");
        assert_eq!(documented, routed, "openapi.json and routes() differ");
    }
}

//! The admin HTTP server: the dashboard at `/`, `/healthz` (liveness), `/readyz` (named health checks as JSON,
//! 503 when any fails), `/handlers` (the deployed handler versions), `/metrics`
//! (Prometheus text format) and the message API under `/api/v1/` (behind the admin token
//! when one is configured).

pub mod api;
mod auth;
mod dashboard;
mod replay;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use crate::health::{CheckReport, HealthCheck, HealthRegistry};
pub use auth::token_matches;

use crate::config::Config;
use crate::queue::QueueStore;
use crate::runtime::HandlerRegistry;

/// A deployed handler as `/handlers` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandlerInfo {
    /// Handler name.
    pub name: String,
    /// File it was loaded from (from the store: `store:NAME@VERSION`).
    pub file: String,
    /// Its version in the store (absent: loaded from a file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// SHA-256 of the file, hex.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
    /// When it was deployed, RFC 3339.
    pub loaded_at: String,
    /// Per-instance memory cap.
    pub memory_limit: String,
}

/// What the admin server's handlers reach.
#[derive(Clone)]
pub struct AppState {
    /// The health checks.
    pub health: Arc<HealthRegistry>,
    /// The deployed handlers.
    pub registry: Arc<HandlerRegistry>,
    /// The SQL queue store.
    pub store: Arc<dyn QueueStore>,
    /// The configuration (queues, admin token).
    pub config: Arc<Config>,
    /// The enqueue path, set once the host has opened its brokers (the admin server answers
    /// health checks before that; an enqueue waits for it).
    pub router: Arc<tokio::sync::SetOnce<Arc<crate::enqueue::QueueRouter>>>,
    /// Cancelled when the host is asked to stop: `/readyz` answers 503 `stopping` from then
    /// on, while the admin server keeps answering through the drain.
    pub stopping: CancellationToken,
}

/// Bind `addr` and serve until `shutdown` (the host cancels it after its drain, so probes,
/// metrics and the API answer while in-flight messages finish). Returns the bound address
/// (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let protected = api::routes().layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::require_token,
    ));
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/handlers", get(handlers))
        .route("/metrics", get(|| async { crate::metrics::render() }))
        .nest("/api/v1", protected)
        .merge(dashboard::routes())
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(e) = server.await {
            tracing::error!("admin server failed: {e}");
        }
    });
    Ok((bound, task))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.stopping.is_cancelled() {
        let body = serde_json::json!({ "status": "stopping", "checks": {} });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    let (healthy, checks) = state.health.report().await;
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({ "status": if healthy { "healthy" } else { "unhealthy" }, "checks": checks });
    (status, Json(body))
}

async fn handlers(State(state): State<AppState>) -> Json<Vec<HandlerInfo>> {
    Json(
        state
            .registry
            .list()
            .iter()
            .map(|h| handler_info(h))
            .collect(),
    )
}

/// The `/handlers` view of one loaded handler.
pub fn handler_info(h: &crate::runtime::LoadedHandler) -> HandlerInfo {
    HandlerInfo {
        name: h.name.to_string(),
        file: h.path.display().to_string(),
        version: h.version,
        sha256: h.hash.clone(),
        size: h.size,
        loaded_at: humantime::format_rfc3339_seconds(h.loaded_at).to_string(),
        memory_limit: h.memory_limit.to_string(),
    }
}

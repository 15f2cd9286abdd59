//! The API's errors (`{"error": "…"}` with a status) and the extractors that answer with
//! them: a path's message key and query parameters.

use axum::Json;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::queue::QueueError;

/// An API error: a status and a message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// An error with this status and message.
    pub(crate) fn new(status: StatusCode, message: String) -> Self {
        ApiError { status, message }
    }
    pub(crate) fn internal(message: String) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    pub(crate) fn bad_request(message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
    pub(crate) fn not_found(message: String) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message,
        }
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(e: axum::extract::rejection::QueryRejection) -> Self {
        ApiError::bad_request(format!("bad query parameters: {}", e.body_text()))
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(e: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(format!("bad path: {}", e.body_text()))
    }
}

/// A path's message key, or a JSON error.
pub(crate) struct Key(pub(crate) i64);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Path(key) = Path::<i64>::from_request_parts(parts, state).await?;
        Ok(Key(key))
    }
}

/// Query parameters, or a JSON error.
pub(crate) struct Params<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S>
    for Params<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Query(params) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(Params(params))
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the queue storage failed: {e}"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        (self.status, Json(body)).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<Json<T>, ApiError>;

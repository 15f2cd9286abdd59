//! The admin token: when `[admin] token` is set, every `/api/` request must carry
//! `Authorization: Bearer TOKEN`. The comparison takes the same time whatever the guess
//! (both sides hashed, then compared in constant time), and a refusal never echoes the token.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;

/// Whether `presented` is the configured token.
pub fn token_matches(expected: &str, presented: &str) -> bool {
    let a = Sha256::digest(expected.as_bytes());
    let b = Sha256::digest(presented.as_bytes());
    a.ct_eq(&b).into()
}

/// Middleware: let the request through when no token is configured or it carries the token.
pub(super) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.config.admin.token.as_ref() else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(token) if token_matches(expected.expose(), token) => next.run(request).await,
        Some(_) => refuse("the admin token is wrong"),
        None => refuse("this endpoint needs the admin token: `Authorization: Bearer TOKEN`"),
    }
}

fn refuse(reason: &str) -> Response {
    let body = serde_json::json!({ "error": reason });
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_matches() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cret", "s3cre"));
        assert!(!token_matches("s3cret", "s3cret "));
        assert!(!token_matches("s3cret", ""));
    }
}

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
        // No token means a loopback listener. A page elsewhere could still reach it through
        // a name that resolves to 127.0.0.1 (DNS rebinding): such a request names another
        // host, so only loopback names are answered.
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !loopback_name(host) {
            let body = serde_json::json!({ "error": format!(
                "this host answers the API without a token only under a loopback name (localhost, 127.0.0.1, [::1]), not `{host}`: set [admin] token to reach it by another name"
            ) });
            return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
        }
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

/// Whether a `Host` header value names this machine's loopback interface.
fn loopback_name(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        // `[::1]:9464`, `127.0.0.1:9464`, `localhost:9464`; a bare `::1` has colons too.
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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
    fn loopback_names_only() {
        for host in [
            "localhost",
            "localhost:9464",
            "127.0.0.1:9464",
            "127.0.0.2",
            "[::1]:9464",
            "[::1]",
            "LOCALHOST:1",
        ] {
            assert!(loopback_name(host), "{host}");
        }
        for host in [
            "evil.example:9464",
            "10.0.0.5:9464",
            "",
            "localhost.evil.example",
            "[::2]:80",
        ] {
            assert!(!loopback_name(host), "{host}");
        }
    }

    #[test]
    fn only_the_exact_token_matches() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cret", "s3cre"));
        assert!(!token_matches("s3cret", "s3cret "));
        assert!(!token_matches("s3cret", ""));
    }
}

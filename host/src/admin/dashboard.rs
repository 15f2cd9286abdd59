//! The web dashboard at `/`: one HTML page, a script and a style sheet, compiled into the
//! binary (no Node, no CDN). The page holds no data; it reads everything from the message
//! API and draws its charts itself (inline SVG), sending the admin token the user enters
//! (kept in the browser tab's session storage), so the token protects the dashboard exactly
//! as it protects the API. A strict Content Security Policy allows only these same-origin
//! files: no inline script, no framing.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::AppState;

const INDEX: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/app.css");

/// Allow only same-origin scripts, styles, images and API calls; no framing.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; \
    frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// The dashboard's routes: `/` and `/assets/…`.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/assets/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        for text in [INDEX, SCRIPT, STYLE] {
            // The SVG namespace URI names the charts' elements; nothing is fetched from it.
            let text = text.replace("\"http://www.w3.org/2000/svg\"", "");
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        assert!(INDEX.contains(r#"src="/assets/app.js""#));
        assert!(INDEX.contains(r#"href="/assets/app.css""#));
        assert!(
            !INDEX.contains("<script>"),
            "inline scripts are refused by the policy"
        );
    }
}

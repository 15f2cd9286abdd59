//! The HTTP client of the Service Bus provider, with `endpoint_override`: every URL is
//! built as `https://{namespace}.servicebus.windows.net/…`; with an override, each request
//! goes to the override's scheme, host and port instead (the path and query, and so the
//! signed resource, stay as they are).
//!
//! The client keeps connections open between requests. The SDK's default client
//! (`azure_core::new_http_client`) opens a new connection — and, against Azure, a new TLS
//! session — for every request, which costs more than the request itself; idle connections
//! are closed here after [`IDLE_CONNECTION`], well before the namespace's load balancer
//! drops them (about four minutes).

use std::sync::Arc;

use async_trait::async_trait;
use azure_core::{HttpClient, Request, Response, Url};

/// Sends requests to `base` instead of the namespace's address.
#[derive(Debug)]
pub struct Redirect {
    inner: Arc<dyn HttpClient>,
    base: Url,
}

impl Redirect {
    /// `inner` with every request redirected to `base` (`http://host:port`).
    pub fn new(inner: Arc<dyn HttpClient>, base: Url) -> Self {
        Redirect { inner, base }
    }
}

/// How long an unused connection stays open.
pub const IDLE_CONNECTION: std::time::Duration = std::time::Duration::from_secs(30);

/// The client to use, redirected when `endpoint_override` is set.
pub fn http_client(endpoint_override: Option<&str>) -> Result<Arc<dyn HttpClient>, String> {
    let pooled = reqwest::Client::builder()
        .pool_idle_timeout(IDLE_CONNECTION)
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| format!("the HTTP client: {e}"))?;
    let inner: Arc<dyn HttpClient> = Arc::new(pooled);
    match endpoint_override {
        None => Ok(inner),
        Some(url) => {
            let base = Url::parse(url).map_err(|e| format!("`{url}`: {e}"))?;
            Ok(Arc::new(Redirect::new(inner, base)))
        }
    }
}

#[async_trait]
impl HttpClient for Redirect {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        let mut request = request.clone();
        let url = request.url_mut();
        // Setting the parts of a `https` URL to `http` ones cannot fail for these schemes.
        let _ = url.set_scheme(self.base.scheme());
        let _ = url.set_host(self.base.host_str());
        let _ = url.set_port(self.base.port_or_known_default());
        self.inner.execute_request(&request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Echo;

    #[async_trait]
    impl HttpClient for Echo {
        async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
            Err(azure_core::Error::message(
                azure_core::error::ErrorKind::Other,
                request.url().to_string(),
            ))
        }
    }

    #[tokio::test]
    async fn requests_go_to_the_override_with_their_path() {
        let client = Redirect::new(Arc::new(Echo), Url::parse("http://127.0.0.1:4567").unwrap());
        let request = Request::new(
            Url::parse("https://shop.servicebus.windows.net/nexus.orders/messages?timeout=5")
                .unwrap(),
            azure_core::Method::Post,
        );
        let sent = client
            .execute_request(&request)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            sent.contains("http://127.0.0.1:4567/nexus.orders/messages?timeout=5"),
            "{sent}"
        );
    }
}

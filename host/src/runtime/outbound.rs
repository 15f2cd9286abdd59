//! Outbound HTTP for handlers: the `allowed_outbound_hosts` allow-list of a handler and the
//! `wasi:http/outgoing-handler` hooks that enforce it. A handler with an empty list (the
//! default) is not linked to `wasi:http` at all; one with a list may call exactly those
//! origins (scheme, host and port), and every other request is refused with
//! `HTTP-request-denied` and logged. A request never outlives the handler's timeout: its
//! connect and response timeouts are capped at the time the call has left; and a call has at
//! most [`MAX_REQUESTS_PER_CALL`] requests open at once.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::Uri;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

pub use crate::config::{BadOutboundHost, OutboundHost};

/// Most requests one handler call may have open at once: a guest cannot spend the host's
/// connections and file descriptors by firing requests without waiting for them.
pub const MAX_REQUESTS_PER_CALL: usize = 16;

/// The `wasi:http` hooks of one handler call: the allow-list check and a send bounded by
/// the call's deadline and by [`MAX_REQUESTS_PER_CALL`].
pub(crate) struct OutboundHooks {
    handler: Arc<str>,
    allowed: Arc<[OutboundHost]>,
    deadline: Instant,
    open: Arc<AtomicUsize>,
    /// The call's `handle` span: each request gets a client span under it, and its
    /// `traceparent`.
    trace: Option<super::invoke::CallTrace>,
}

impl OutboundHooks {
    pub(crate) fn new(
        handler: Arc<str>,
        allowed: Arc<[OutboundHost]>,
        deadline: Instant,
        trace: Option<super::invoke::CallTrace>,
    ) -> Self {
        OutboundHooks {
            handler,
            allowed,
            deadline,
            open: Arc::default(),
            trace,
        }
    }
}

/// One open request of a call, counted until its connection is done with.
struct OpenRequest(Arc<AtomicUsize>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `uri` without user information or query, for logs (either may carry secrets).
fn redacted(uri: &Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("?");
    let host = uri.authority().map_or("", |a| a.host());
    let port = uri
        .authority()
        .and_then(|a| a.port_u16())
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    format!("{scheme}://{host}{port}{}", uri.path())
}

/// The response future `WasiHttpHooks::send_request` returns.
type Sending = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Sending {
        let url = redacted(request.uri());
        let method = request.method().clone();
        let left = self.deadline.saturating_duration_since(Instant::now());
        if !self
            .allowed
            .iter()
            .any(|origin| origin.allows(request.uri()))
        {
            tracing::warn!(
                handler = %self.handler, %method, %url,
                "outbound HTTP request refused: its origin is not in [handlers.{}] allowed_outbound_hosts",
                self.handler
            );
            return refuse(request, left, HttpError::HttpRequestDenied);
        }
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_REQUESTS_PER_CALL {
            self.open.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                handler = %self.handler, %method, %url,
                "outbound HTTP request refused: the call already has {MAX_REQUESTS_PER_CALL} requests open"
            );
            return refuse(request, left, HttpError::ConnectionLimitReached);
        }
        let open = OpenRequest(self.open.clone());
        tracing::debug!(handler = %self.handler, %method, %url, "outbound HTTP request");
        let options = within(options, left);
        let span = self.trace.as_ref().and_then(|t| t.get()).and_then(|cx| {
            crate::telemetry::http_request(cx, &method, &url, request.headers_mut())
        });
        Box::new(async move {
            use http_body_util::BodyExt;
            let sent = wasmtime_wasi_http::default_send_request(request, Some(options)).await;
            if let Some(span) = &span {
                match &sent {
                    Ok((response, _)) => {
                        crate::telemetry::http_answered(span, response.status().as_u16())
                    }
                    Err(e) => crate::telemetry::http_failed(span, e),
                }
            }
            drop(span);
            let (response, io) = sent?;
            // The request counts as open until its connection is done with.
            let io = async move {
                let _open = open;
                io.await
            };
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

/// Answer `request` with `error` at once. What the guest writes to the body is still taken
/// in (for at most `left`): a body dropped unread makes its writes fail, which some guests
/// (SpiderMonkey's `fetch`) answer with a trap instead of seeing the refusal.
fn refuse(request: http::Request<WasiBody>, left: Duration, error: HttpError) -> Sending {
    let mut body = request.into_body();
    tokio::spawn(async move {
        use http_body_util::BodyExt;
        let _ = tokio::time::timeout(left, async {
            while let Some(Ok(_)) = body.frame().await {}
        })
        .await;
    });
    Box::new(async move { Err(error) })
}

/// `options` with every timeout capped at `left`.
fn within(options: Option<RequestOptions>, left: Duration) -> RequestOptions {
    let options = options.unwrap_or_default();
    let cap = |t: Option<Duration>| Some(t.map_or(left, |t| t.min(left)));
    RequestOptions {
        connect_timeout: cap(options.connect_timeout),
        first_byte_timeout: cap(options.first_byte_timeout),
        between_bytes_timeout: cap(options.between_bytes_timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> OutboundHost {
        s.parse().unwrap()
    }

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn an_origin_allows_its_scheme_host_and_port_only() {
        let api = host("https://API.example.com");
        assert!(api.allows(&uri("https://api.example.com/v1/orders?x=1")));
        assert!(api.allows(&uri("https://api.example.com:443/")));
        assert!(!api.allows(&uri("http://api.example.com/")));
        assert!(!api.allows(&uri("https://api.example.com:8443/")));
        assert!(!api.allows(&uri("https://api.example.com.evil.test/")));
        assert!(!api.allows(&uri("https://other.example.com/")));

        let local = host("http://127.0.0.1:8080");
        assert!(local.allows(&uri("http://127.0.0.1:8080/hook")));
        assert!(!local.allows(&uri("http://127.0.0.1:8081/hook")));
        assert!(!local.allows(&uri("http://127.0.0.1/hook")));
    }

    #[test]
    fn a_wildcard_allows_subdomains_but_not_the_domain_or_lookalikes() {
        let any = host("https://*.example.com");
        assert!(any.allows(&uri("https://a.example.com/")));
        assert!(any.allows(&uri("https://a.b.example.com/")));
        assert!(!any.allows(&uri("https://example.com/")));
        assert!(!any.allows(&uri("https://badexample.com/")));
        assert!(!any.allows(&uri("https://user@a.example.com/")));
        assert!(!host("https://api.example.com").allows(&uri("https://x@api.example.com/")));
    }

    #[test]
    fn entries_that_are_not_origins_are_rejected_with_the_reason() {
        for (entry, reason) in [
            ("api.example.com", "scheme is missing"),
            ("ftp://api.example.com", "http or https"),
            ("https://api.example.com/v1", "path is not allowed"),
            ("https://user@api.example.com", "user information"),
            ("https://a.*.example.com", "first label"),
            ("http://*.0.0.1", "IP address"),
        ] {
            let err = entry.parse::<OutboundHost>().unwrap_err().to_string();
            assert!(
                err.contains(entry) && err.contains(reason),
                "{entry}: {err}"
            );
        }
    }

    fn get(url: &str) -> http::Request<WasiBody> {
        use http_body_util::BodyExt;
        let body = http_body_util::Empty::<bytes::Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        http::Request::get(url).body(body).unwrap()
    }

    #[tokio::test]
    async fn a_call_has_at_most_sixteen_requests_open() {
        let mut hooks = OutboundHooks::new(
            Arc::from("caller"),
            vec![host("http://127.0.0.1:9")].into(),
            Instant::now() + Duration::from_secs(5),
            None,
        );
        let mut open = Vec::new();
        for _ in 0..MAX_REQUESTS_PER_CALL {
            let none = Box::new(async { Ok(()) });
            open.push(hooks.send_request(get("http://127.0.0.1:9/"), None, none));
        }
        let none = Box::new(async { Ok(()) });
        let over = hooks.send_request(get("http://127.0.0.1:9/"), None, none);
        assert!(matches!(
            Box::into_pin(over).await,
            Err(HttpError::ConnectionLimitReached)
        ));
        assert_eq!(hooks.open.load(Ordering::SeqCst), MAX_REQUESTS_PER_CALL);
        drop(open.pop());
        assert_eq!(
            hooks.open.load(Ordering::SeqCst),
            MAX_REQUESTS_PER_CALL - 1,
            "a dropped request no longer counts"
        );
        let none = Box::new(async { Ok(()) });
        let refused = hooks.send_request(get("http://127.0.0.1:10/"), None, none);
        assert!(matches!(
            Box::into_pin(refused).await,
            Err(HttpError::HttpRequestDenied)
        ));
    }

    #[test]
    fn request_timeouts_never_exceed_the_time_left() {
        let left = Duration::from_secs(2);
        let bounded = within(None, left);
        assert_eq!(bounded.connect_timeout, Some(left));
        assert_eq!(bounded.first_byte_timeout, Some(left));
        let shorter = within(
            Some(RequestOptions {
                connect_timeout: Some(Duration::from_millis(500)),
                first_byte_timeout: Some(Duration::from_secs(60)),
                between_bytes_timeout: None,
            }),
            left,
        );
        assert_eq!(shorter.connect_timeout, Some(Duration::from_millis(500)));
        assert_eq!(shorter.first_byte_timeout, Some(left));
        assert_eq!(shorter.between_bytes_timeout, Some(left));
    }
}

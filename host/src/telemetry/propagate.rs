//! W3C trace context in message headers: `traceparent` and `tracestate` carry the context of
//! the span that sent a message to the code that processes it. The headers are ordinary
//! message headers, so a handler sees them in `message.headers` and a producer can set its
//! own.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;

pub use crate::headers::{TRACEPARENT, TRACESTATE};

struct Read<'h>(&'h [(String, String)]);

impl Extractor for Read<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        crate::headers::value(self.0, key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }
}

struct Write<'h>(&'h mut Vec<(String, String)>);

impl Injector for Write<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.retain(|(k, _)| !k.eq_ignore_ascii_case(key));
        self.0.push((key.to_string(), value));
    }
}

/// The remote span context `headers` carry, if they carry a valid one.
pub fn extract(headers: &[(String, String)]) -> Option<SpanContext> {
    crate::headers::value(headers, TRACEPARENT)?;
    let cx = TraceContextPropagator::new().extract(&Read(headers));
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Write the context of `cx`'s span into `headers` (replacing a `traceparent` and
/// `tracestate` already there; a `tracestate` is removed when the span has none).
pub fn inject(cx: &Context, headers: &mut Vec<(String, String)>) {
    headers.retain(|(k, _)| !k.eq_ignore_ascii_case(TRACESTATE));
    TraceContextPropagator::new().inject_context(cx, &mut Write(headers));
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn a_context_written_is_read_back() {
        let span = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::from_key_value([("vendor", "x")]).unwrap(),
        );
        let mut headers = vec![
            ("Traceparent".to_string(), "00-old-old-00".to_string()),
            ("tracestate".to_string(), "stale=1".to_string()),
            ("tenant".to_string(), "a".to_string()),
        ];
        inject(
            &Context::new().with_remote_span_context(span.clone()),
            &mut headers,
        );
        assert_eq!(headers.len(), 3, "{headers:?}");
        assert!(headers.contains(&(
            TRACEPARENT.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string()
        )));
        assert!(headers.contains(&(TRACESTATE.to_string(), "vendor=x".to_string())));
        assert_eq!(extract(&headers), Some(span));
    }

    #[test]
    fn no_or_a_broken_traceparent_is_none() {
        assert_eq!(extract(&[]), None);
        let broken = vec![(TRACEPARENT.to_string(), "00-zz-01".to_string())];
        assert_eq!(extract(&broken), None);
    }
}

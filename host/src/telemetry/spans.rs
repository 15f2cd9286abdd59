//! The spans of the message path, per the OpenTelemetry messaging conventions: `send {queue}`
//! (a producer span for every enqueue: CLI, API, a handler's follow-up), `process {queue}`
//! (a consumer span for every delivery, the message's sending span as its parent) with
//! `instantiate`, `handle` and `settle {queue}` as children, and a client span per outbound
//! HTTP request of a handler. Each function does nothing when traces are off.

use std::borrow::Cow;

use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::propagate::{extract, inject};
use super::tracer;

/// Most names [`name`] keeps.
const MAX_NAMES: usize = 4096;

/// `PREFIX QUEUE` as a span name or attribute value, made once per queue and kept for the
/// process's life (queue names come from the configuration), so a span costs no allocation
/// for it; past [`MAX_NAMES`] names it is made each time.
pub fn name(prefix: &'static str, queue: &str) -> Cow<'static, str> {
    type Names =
        std::collections::HashMap<&'static str, std::collections::HashMap<String, &'static str>>;
    static NAMES: std::sync::LazyLock<std::sync::RwLock<Names>> =
        std::sync::LazyLock::new(Default::default);
    // Looked up by the borrowed name: a span costs no allocation once its name is kept.
    if let Some(name) = NAMES
        .read()
        .expect("span names")
        .get(prefix)
        .and_then(|n| n.get(queue))
    {
        return Cow::Borrowed(name);
    }
    let mut names = NAMES.write().expect("span names");
    if names.values().map(|n| n.len()).sum::<usize>() >= MAX_NAMES {
        return Cow::Owned(format!("{prefix}{queue}"));
    }
    let name: &'static str = Box::leak(format!("{prefix}{queue}").into_boxed_str());
    names
        .entry(prefix)
        .or_default()
        .insert(queue.to_string(), name);
    Cow::Borrowed(name)
}

/// The `messaging.system` of a message in the SQL queue.
pub const SQL_SYSTEM: &str = "wharf";

/// What a message's spans say about where it is.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    /// The queue.
    pub queue: &'a str,
    /// `messaging.system`: `wharf` for the SQL queue, else the broker (`rabbitmq`, `kafka`,
    /// `servicebus`, `redis`).
    pub system: &'static str,
}

impl Destination<'_> {
    fn attributes(&self, operation: &'static str, message_id: Option<&str>) -> Vec<KeyValue> {
        let mut attributes = vec![
            KeyValue::new("messaging.system", self.system),
            KeyValue::new("messaging.destination.name", name("", self.queue)),
            KeyValue::new("messaging.operation.type", operation),
        ];
        if let Some(id) = message_id {
            attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
        }
        attributes
    }
}

/// Record the sending of a message to `to` and write its context into `headers`. Its parent
/// is `parent` (a handler's follow-up: the call's `process` span) or else the `traceparent`
/// the producer put in `headers`; without either it starts a trace.
pub fn send(
    to: Destination<'_>,
    message_id: Option<&str>,
    parent: Option<&Context>,
    headers: &mut Vec<(String, String)>,
) {
    let Some(tracer) = tracer() else { return };
    let parent = match parent {
        Some(cx) => cx.clone(),
        None => remote(headers),
    };
    if starts_none(&parent) {
        // Sampled at 0, a new trace is never recorded: no span, no header.
        return;
    }
    if follows_unsampled(&parent) {
        // Not recorded: the message carries its parent's context, decision included.
        inject(&parent, headers);
        return;
    }
    let span = tracer
        .span_builder(name("send ", to.queue))
        .with_kind(SpanKind::Producer)
        .start_with_context(tracer, &parent);
    let cx = parent.with_span(span);
    if cx.span().is_recording() {
        cx.span().set_attributes(to.attributes("send", message_id));
    }
    inject(&cx, headers);
    cx.span().end();
}

/// Whether `parent` has no span (a new trace would start) and new traces are never
/// recorded (`sample_ratio = 0`).
fn starts_none(parent: &Context) -> bool {
    !parent.span().span_context().is_valid() && super::never_new()
}

/// Whether a span under `parent` is certainly not sampled: its parent was not, and the
/// sampler follows parents. Such spans are not made at all.
fn follows_unsampled(parent: &Context) -> bool {
    let span = parent.span();
    let parent = span.span_context();
    parent.is_valid() && !parent.is_sampled() && super::follows_parents()
}

/// The context of the remote parent `headers` carry, or an empty one.
fn remote(headers: &[(String, String)]) -> Context {
    match extract(headers) {
        Some(span) => Context::new().with_remote_span_context(span),
        None => Context::new(),
    }
}

/// What a delivery's `process` span records beyond its destination.
#[derive(Debug, Clone, Default)]
pub struct Delivery<'a> {
    /// `messaging.message.id`.
    pub message_id: Option<&'a str>,
    /// The message's headers (its sending span's context).
    pub headers: &'a [(String, String)],
    /// Wharf's attempt (1 on the first).
    pub attempt: u32,
    /// `messaging.consumer.group.name`, where the broker has consumer groups.
    pub group: Option<&'a str>,
}

/// The `process` span of one delivery, ended when dropped.
#[derive(Debug, Clone)]
pub struct Processing {
    cx: Context,
}

impl Processing {
    /// Start the `process {queue}` span of a delivery (`None` when traces are off, or when
    /// the message has no trace and new ones are never recorded).
    pub fn start(at: Destination<'_>, delivery: &Delivery<'_>) -> Option<Processing> {
        let tracer = tracer()?;
        let parent = remote(delivery.headers);
        if starts_none(&parent) {
            return None;
        }
        if follows_unsampled(&parent) {
            // Not recorded: its calls' follow-ups and requests carry the producer's context.
            return Some(Processing { cx: parent });
        }
        let span = tracer
            .span_builder(name("process ", at.queue))
            .with_kind(SpanKind::Consumer)
            .start_with_context(tracer, &parent);
        let cx = parent.with_span(span);
        let span = cx.span();
        if span.is_recording() {
            let mut attributes = at.attributes("process", delivery.message_id);
            attributes.push(KeyValue::new("wharf.attempt", i64::from(delivery.attempt)));
            if let Some(group) = delivery.group {
                let group = KeyValue::new("messaging.consumer.group.name", group.to_string());
                attributes.push(group);
            }
            span.set_attributes(attributes);
        }
        Some(Processing { cx })
    }

    /// Whether its span is recorded (sampled).
    pub fn recording(&self) -> bool {
        self.cx.span().is_recording()
    }

    /// The context children and follow-ups take as parent.
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// Record the outcome (`wharf.outcome`) and, for a failure, `error.type` and its text.
    pub fn outcome(&self, outcome: &str, error: Option<(&'static str, &str)>) {
        let span = self.cx.span();
        if !span.is_recording() {
            return;
        }
        span.set_attribute(KeyValue::new("wharf.outcome", outcome.to_string()));
        if let Some((kind, text)) = error {
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_status(Status::error(text.to_string()));
        }
    }

    /// End the span now (it also ends when the last clone is dropped).
    pub fn end(&self) {
        self.cx.span().end();
    }
}

/// A child span of `parent` (`instantiate`, `handle`, `settle {queue}`), ended when dropped;
/// `None` under a span that is not recorded.
pub fn child(parent: &Context, name: impl Into<Cow<'static, str>>) -> Option<Context> {
    let tracer = tracer()?;
    if !parent.span().is_recording() {
        return None;
    }
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .start_with_context(tracer, parent);
    Some(parent.with_span(span))
}

/// A line a guest logged, as an event of `parent`'s span.
pub fn log_event(parent: &Context, level: &'static str, text: &str) {
    if !parent.span().is_recording() {
        return;
    }
    parent.span().add_event(
        "log",
        vec![
            KeyValue::new("log.severity", level),
            KeyValue::new("log.message", text.to_string()),
        ],
    );
}

/// The client span of one outbound HTTP request (`GET`, …) under `parent`, its context
/// written into the request's `headers` as `traceparent`.
pub fn http_request(
    parent: &Context,
    method: &http::Method,
    url: &str,
    headers: &mut http::HeaderMap,
) -> Option<Context> {
    let tracer = tracer()?;
    if !parent.span().is_recording() {
        // Not recorded: the request carries the call's context, decision included.
        write_headers(parent, headers);
        return None;
    }
    let span = tracer
        .span_builder(method.as_str().to_string())
        .with_kind(SpanKind::Client)
        .with_attributes(vec![
            KeyValue::new("http.request.method", method.as_str().to_string()),
            KeyValue::new("url.full", url.to_string()),
        ])
        .start_with_context(tracer, parent);
    let cx = parent.with_span(span);
    write_headers(&cx, headers);
    Some(cx)
}

/// The context of `cx` as HTTP request headers.
fn write_headers(cx: &Context, headers: &mut http::HeaderMap) {
    let mut pairs = Vec::new();
    inject(cx, &mut pairs);
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
}

/// The trace id of a context's span, written only when a log line is (`trace_id` field).
pub struct TraceId<'a>(pub &'a Context);

impl std::fmt::Display for TraceId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.span().span_context().trace_id())
    }
}

/// The span id of a context's span, written only when a log line is (`span_id` field).
pub struct SpanId<'a>(pub &'a Context);

impl std::fmt::Display for SpanId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.span().span_context().span_id())
    }
}

/// Record an HTTP answer's status on a request span (4xx and 5xx are errors).
pub fn http_answered(request: &Context, status: u16) {
    let span = request.span();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 400 {
        span.set_attribute(KeyValue::new("error.type", status.to_string()));
        span.set_status(Status::error(""));
    }
}

/// Record a request that got no answer on its span.
pub fn http_failed(request: &Context, error: &impl std::fmt::Debug) {
    let span = request.span();
    span.set_attribute(KeyValue::new("error.type", "request-failed"));
    span.set_status(Status::error(format!("{error:?}")));
}

/// A span context as `TRACE_ID` (for the dashboard and logs).
pub fn trace_id_of(headers: &[(String, String)]) -> Option<String> {
    extract(headers).map(|span: SpanContext| span.trace_id().to_string())
}

//! Export of finished spans: a bounded queue between the code that ends a span and one task
//! that posts them in batches over OTLP/HTTP. Ending a span never waits: when the queue is
//! full (the collector is slow or down) the span is dropped and counted in
//! `wharf_trace_spans_dropped_total`, so processing goes on at full speed and memory stays
//! bounded by `[telemetry] max_queued_spans` and one batch in flight.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Spans per OTLP request at most.
const BATCH: usize = 2048;

/// How long a batch that is not full waits for more spans.
const LINGER: Duration = Duration::from_millis(200);

/// The processor the tracer provider calls when a span ends: it queues sampled spans.
#[derive(Debug)]
pub(super) struct QueueingProcessor {
    queue: mpsc::Sender<SpanData>,
}

impl SpanProcessor for QueueingProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.queue.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                crate::metrics::spans_dropped("queue-full", 1)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                crate::metrics::spans_dropped("shut-down", 1)
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The exporting task, stopped by [`Exporting::finish`].
pub(super) struct Exporting {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Exporting {
    /// Export what is queued (for at most `within`), then stop.
    pub(super) async fn finish(self, within: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(within, self.task).await.is_err() {
            tracing::warn!(
                "spans still queued after {} were not exported",
                humantime::format_duration(within)
            );
        }
    }
}

/// Start exporting through `exporter`, queueing up to `capacity` spans.
pub(super) fn start<E: SpanExporter + 'static>(
    exporter: E,
    capacity: usize,
    to: Target,
) -> (QueueingProcessor, Exporting) {
    let (queue, spans) = mpsc::channel(capacity);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(exporter, spans, stop.clone(), to));
    (QueueingProcessor { queue }, Exporting { stop, task })
}

/// Where spans go, and how long one export may take.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// The URL spans are posted to.
    pub url: String,
    /// How long one export may take.
    pub timeout: Duration,
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    stop: CancellationToken,
    to: Target,
) {
    let mut failing = false;
    loop {
        let mut batch = Vec::with_capacity(BATCH);
        tokio::select! {
            n = spans.recv_many(&mut batch, BATCH) => if n == 0 { break },
            () = stop.cancelled() => break,
        }
        let linger = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(linger, spans.recv_many(&mut batch, room)).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        export(&exporter, batch, &mut failing, &to).await;
    }
    // Stopping: what is queued goes out, in batches.
    spans.close();
    let mut rest = Vec::new();
    while let Ok(span) = spans.try_recv() {
        rest.push(span);
    }
    while !rest.is_empty() {
        let tail = rest.split_off(rest.len().saturating_sub(BATCH));
        export(&exporter, tail, &mut failing, &to).await;
    }
}

async fn export<E: SpanExporter>(
    exporter: &E,
    batch: Vec<SpanData>,
    failing: &mut bool,
    to: &Target,
) {
    let (n, url) = (batch.len(), to.url.as_str());
    let result = tokio::time::timeout(to.timeout, exporter.export(batch)).await;
    match result {
        Ok(Ok(())) => {
            crate::metrics::spans_exported(n);
            if std::mem::take(failing) {
                tracing::info!(url, "exporting spans works again");
            }
        }
        Ok(Err(e)) => failed(n, failing, url, &e.to_string()),
        Err(_) => {
            let reason = format!("no answer within {:?}", to.timeout);
            failed(n, failing, url, &reason)
        }
    }
}

/// Count a batch that was not exported; warn once per outage.
fn failed(n: usize, failing: &mut bool, url: &str, reason: &str) {
    crate::metrics::spans_dropped("export-failed", n);
    if !std::mem::replace(failing, true) {
        tracing::warn!(
            url,
            "exporting spans failed: {reason}; check [telemetry] endpoint and that the collector runs (spans are dropped and counted in wharf_trace_spans_dropped_total until it answers)"
        );
    }
}

/// The OTLP exporter's HTTP client: the host's `reqwest`, on the host's runtime.
#[derive(Debug, Clone)]
pub(super) struct Client(reqwest::Client);

impl Client {
    /// A client whose requests give up after `timeout`.
    pub(super) fn new(timeout: Duration) -> Self {
        Client(
            reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("an HTTP client with default TLS settings builds"),
        )
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut sent = self.0.request(parts.method, parts.uri.to_string());
        for (name, value) in &parts.headers {
            sent = sent.header(name, value);
        }
        let answer = sent.body(body).send().await?;
        let status = answer.status();
        let headers = answer.headers().clone();
        let body = answer.bytes().await?;
        let mut response = Response::builder().status(status).body(body)?;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

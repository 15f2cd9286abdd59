//! OpenTelemetry traces of the message path, exported over OTLP/HTTP when `[telemetry]`
//! (or `OTEL_TRACES_EXPORTER=otlp`) turns them on: [`spans`] says which spans there are,
//! [`propagate`] how their context travels in message headers, `export` how finished spans
//! leave the process without ever slowing it. Off, every span function returns at its first
//! check and headers are left as they are.

mod export;
mod propagate;
mod spans;

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

pub use propagate::{TRACEPARENT, TRACESTATE, extract, inject};
pub use spans::{
    Delivery, Destination, Processing, SQL_SYSTEM, SpanId, TraceId, child, http_answered,
    http_failed, http_request, log_event, name, send, trace_id_of,
};

use crate::config::Telemetry;

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether the sampler follows a remote parent's decision.
static FOLLOWS_PARENTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether the sampler follows a remote parent's decision (the `parentbased_*` samplers).
fn follows_parents() -> bool {
    FOLLOWS_PARENTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether new traces are never recorded (a ratio of 0).
static NEVER_NEW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether new traces are never recorded (a ratio of 0): a message without a trace then
/// gets neither spans nor a `traceparent`.
fn never_new() -> bool {
    NEVER_NEW.load(std::sync::atomic::Ordering::Relaxed)
}

/// The process's tracer, when traces are on.
fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// Whether traces are on in this process.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Why traces could not be turned on.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter refused its settings.
    #[error("[telemetry]: the OTLP exporter for {url} could not be built: {reason}")]
    Exporter {
        /// Where spans would go.
        url: String,
        /// The exporter's reason.
        reason: String,
    },
    /// [`start`] was called twice in one process.
    #[error("traces were already turned on in this process")]
    AlreadyOn,
}

/// Traces, on: hand to [`Tracing::finish`] before the process exits, so queued spans go out.
pub struct Tracing {
    provider: SdkTracerProvider,
    exporting: export::Exporting,
}

/// Turn traces on for this process (inside a Tokio runtime).
pub fn start(config: &Telemetry) -> Result<Tracing, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        // The client's own timeout only backs up the export's, a second later: the export
        // gives up first and says so.
        .with_http_client(export::Client::new(
            config.export_timeout + Duration::from_secs(1),
        ))
        .with_endpoint(config.traces_url.clone())
        .with_timeout(config.export_timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            url: config.traces_url.clone(),
            reason: e.to_string(),
        })?;
    let target = export::Target {
        url: config.traces_url.clone(),
        timeout: config.export_timeout,
    };
    let (processor, exporting) = export::start(exporter, config.max_queued_spans, target);
    let ratio = Sampler::TraceIdRatioBased(config.sampling.ratio);
    let sampler = if config.sampling.parent_based {
        Sampler::ParentBased(Box::new(ratio))
    } else {
        ratio
    };
    FOLLOWS_PARENTS.store(
        config.sampling.parent_based,
        std::sync::atomic::Ordering::Relaxed,
    );
    NEVER_NEW.store(
        config.sampling.ratio <= 0.0,
        std::sync::atomic::Ordering::Relaxed,
    );
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    TRACER
        .set(provider.tracer("wharf"))
        .map_err(|_| TelemetryError::AlreadyOn)?;
    tracing::info!(url = %config.traces_url, ratio = config.sampling.ratio, "exporting traces");
    Ok(Tracing {
        provider,
        exporting,
    })
}

/// Turn traces on when `config` says so; `None` when they stay off.
pub fn start_if(config: Option<&Telemetry>) -> Result<Option<Tracing>, TelemetryError> {
    config.map(start).transpose()
}

impl Tracing {
    /// Export the spans still queued (for at most 5 s) and stop.
    pub async fn finish(self) {
        self.exporting.finish(Duration::from_secs(5)).await;
        let _ = self.provider.shutdown();
    }
}

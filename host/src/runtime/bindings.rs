//! The generated bindings of the `handler` world and the per-instance host state that
//! implements its imports (`host.enqueue`, `host.log`), WASI and (in `keyvalue.rs`)
//! `wasi:keyvalue`.

use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, StoreLimits};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::outbound::OutboundHooks;

use super::Enqueuer;
use crate::queue::{EnqueueStatus as StoredStatus, NewMessage, now_ms};

/// Code generated from `wit/handler.wit`; the WIT file documents every type.
#[allow(missing_docs)]
mod generated {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        imports: { default: async },
        exports: { default: async },
    });
}

pub use generated::*;

pub use wharf::handler::types::{EnqueueOptions, EnqueueStatus, Level};

/// Everything one handler instance can reach; lives in the instance's `Store`.
pub struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) http: WasiHttpCtx,
    /// Decides the outbound HTTP requests of a handler linked to `wasi:http`.
    pub(crate) outbound: OutboundHooks,
    pub(crate) limiter: MemoryLimiter,
    /// Set by the epoch callback when the call ran past its timeout.
    pub(crate) timed_out: bool,
    pub(crate) handler: Arc<str>,
    pub(crate) queue: Arc<str>,
    pub(crate) enqueuer: Arc<dyn Enqueuer>,
    /// The call's key-value state (`wasi:keyvalue`), when it has one.
    pub(crate) state: Option<Arc<super::state::StateCall>>,
    /// The call's `handle` span, when traces are on.
    pub(crate) trace: Option<super::invoke::CallTrace>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outbound,
        }
    }
}

/// Caps an instance's linear memory and remembers whether the cap was hit, so a guest that
/// aborts after a failed allocation is reported as over its memory limit, not as a crash.
pub struct MemoryLimiter {
    inner: StoreLimits,
    limit: usize,
    pub(crate) exceeded: bool,
}

impl MemoryLimiter {
    pub(crate) fn new(limit: usize) -> Self {
        MemoryLimiter {
            inner: wasmtime::StoreLimitsBuilder::new()
                .memory_size(limit)
                .table_elements(1_000_000)
                .instances(64)
                .tables(64)
                .memories(8)
                .build(),
            limit,
            exceeded: false,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = desired <= self.limit && maximum.is_none_or(|m| desired <= m);
        if !allowed {
            self.exceeded = true;
            return Ok(false);
        }
        self.inner.memory_growing(current, desired, maximum)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }
    fn tables(&self) -> usize {
        self.inner.tables()
    }
    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// Add WASI p2, `wasi:keyvalue` and the `host` interface to a linker, and `wasi:http`
/// (outgoing requests) when `http` is set.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>, http: bool) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    if http {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    }
    super::keyvalue::add_to_linker(linker)?;
    Handler::add_to_linker::<_, HasSelf<HostState>>(linker, |state| state)?;
    Ok(())
}

pub use crate::headers::SESSION as SESSION_HEADER;

/// The message a guest's `host.enqueue(queue, payload, options)` asks for at `now` (Unix
/// ms). Any delay is accepted: one beyond year 9999 means the latest date
/// ([`crate::queue::limits::LATEST_DATE_MS`]). A [`SESSION_HEADER`] header sets the session
/// key (and stays a header, for the next handler to read).
pub fn guest_message(payload: String, options: EnqueueOptions, now: i64) -> NewMessage {
    let session = options
        .headers
        .iter()
        .find(|(name, _)| name == SESSION_HEADER)
        .map(|(_, value)| value.clone());
    NewMessage {
        session,
        id: options.id,
        payload,
        priority: options.priority.unwrap_or(0),
        process_at_ms: options
            .delay_ms
            .map(|d| crate::queue::limits::due_after(now, d)),
        headers: options.headers,
        status: None,
        last_error: None,
        source_delivery_id: None,
        attempts: 0,
    }
}

impl wharf::handler::types::Host for HostState {}

impl wharf::handler::host::Host for HostState {
    async fn enqueue(
        &mut self,
        queue: String,
        payload: String,
        options: EnqueueOptions,
    ) -> Result<EnqueueStatus, String> {
        let mut message = guest_message(payload, options, now_ms());
        if let Some(cx) = self.trace.as_ref().and_then(|t| t.get()) {
            let to = crate::telemetry::Destination {
                queue: &queue,
                system: self.enqueuer.system(&queue),
            };
            crate::telemetry::send(to, message.id.as_deref(), Some(cx), &mut message.headers);
        }
        match self.enqueuer.enqueue(&queue, message).await {
            Ok(done) => {
                tracing::debug!(handler = %self.handler, from = %self.queue, to = %queue, key = done.key, "handler enqueued a message");
                Ok(match done.status {
                    StoredStatus::Added => EnqueueStatus::Added,
                    StoredStatus::Updated => EnqueueStatus::Updated,
                    StoredStatus::Discarded => EnqueueStatus::Discarded,
                })
            }
            Err(e) => {
                tracing::warn!(handler = %self.handler, from = %self.queue, to = %queue, "handler enqueue failed: {e}");
                Err(e.to_string())
            }
        }
    }

    async fn log(&mut self, level: Level, message: String) {
        let (handler, queue) = (&*self.handler, &*self.queue);
        let cx = self.trace.as_ref().and_then(|t| t.get());
        if let Some(cx) = cx {
            let severity = match level {
                Level::Trace => "TRACE",
                Level::Debug => "DEBUG",
                Level::Info => "INFO",
                Level::Warn => "WARN",
                Level::Error => "ERROR",
            };
            crate::telemetry::log_event(cx, severity, &message);
        }
        // Written only for a line that is logged.
        let trace_id = cx.map(|cx| tracing::field::display(crate::telemetry::TraceId(cx)));
        let span_id = cx.map(|cx| tracing::field::display(crate::telemetry::SpanId(cx)));
        match level {
            Level::Trace => {
                tracing::trace!(target: "wharf::guest", handler, queue, trace_id, span_id, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "wharf::guest", handler, queue, trace_id, span_id, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "wharf::guest", handler, queue, trace_id, span_id, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "wharf::guest", handler, queue, trace_id, span_id, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "wharf::guest", handler, queue, trace_id, span_id, "{message}")
            }
        }
    }
}

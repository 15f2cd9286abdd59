//! One delivery: a fresh instance from the handler's `InstancePre`, a `handle` call under the
//! queue's timeout and the handler's memory cap, and a classified result. A trap, a timeout
//! or a memory-cap hit is an [`InvokeError`]; it never escapes as a panic. A full instance
//! pool is waited out ([`super::instances`]), never blamed on the handler.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

use super::Enqueuer;
use super::bindings::{HandlerError, HostState, MemoryLimiter, Message, Outcome};
use super::instances::{InstanceReturns, PooledStore};
use super::outbound::OutboundHooks;
use super::output::{Channel, LogStream};
use super::registry::LoadedHandler;
use super::state::StateCall;

/// Why a call did not return a handler result.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum InvokeError {
    /// The guest trapped (panic, unreachable, out-of-bounds access, …).
    #[error("handler trapped: {0}")]
    Trap(String),
    /// The call ran longer than the queue's timeout and was interrupted.
    #[error("handler timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The guest tried to grow its memory past its cap (and then failed).
    #[error("handler exceeded its memory limit of {0}")]
    MemoryLimit(bytesize::ByteSize),
    /// The instance could not be created.
    #[error("handler could not be instantiated: {0}")]
    Instantiate(String),
    /// Every pooled instance stayed in use for as long as the message could wait: the
    /// handler never ran, and the message goes back uncounted.
    #[error("no free handler instance after waiting {} (every one of host.max_instances was in use)", humantime::format_duration(*.0))]
    NoInstance(Duration),
}

/// What a call produced.
pub type InvokeResult = Result<Result<Outcome, HandlerError>, InvokeError>;

/// Where a call's effects go: its follow-ups (`host.enqueue`) and its key-value state.
#[derive(Clone)]
pub struct CallEffects {
    /// Takes the call's follow-ups.
    pub enqueuer: Arc<dyn Enqueuer>,
    /// The call's key-value state; without it, opening a bucket fails.
    pub state: Option<Arc<StateCall>>,
    /// The delivery's `process` span when traces are on: `instantiate` and `handle` become
    /// its children, and the handler's log lines, follow-ups and HTTP requests the
    /// `handle` span's.
    pub trace: Option<opentelemetry::Context>,
}

/// The `handle` span of a call, set once its instance exists (the store and its log
/// streams are made before).
pub type CallTrace = Arc<std::sync::OnceLock<opentelemetry::Context>>;

impl From<Arc<dyn Enqueuer>> for CallEffects {
    fn from(enqueuer: Arc<dyn Enqueuer>) -> Self {
        CallEffects {
            enqueuer,
            state: None,
            trace: None,
        }
    }
}

/// Call `handle` on a fresh instance of `handler`, waiting up to `timeout` for an instance
/// when the pool is full.
pub async fn invoke(
    handler: &LoadedHandler,
    message: Message,
    timeout: Duration,
    effects: impl Into<CallEffects>,
) -> InvokeResult {
    invoke_starting_by(handler, message, timeout, Instant::now() + timeout, effects).await
}

/// Call `handle` on a fresh instance of `handler`. When the pool is full, wait for an
/// instance until `start_by`, then give up with [`InvokeError::NoInstance`] (the handler
/// never ran).
pub async fn invoke_starting_by(
    handler: &LoadedHandler,
    message: Message,
    timeout: Duration,
    start_by: Instant,
    effects: impl Into<CallEffects>,
) -> InvokeResult {
    let mut effects = effects.into();
    let queue: Arc<str> = Arc::from(message.queue.as_str());
    let mut waiting_since: Option<Instant> = None;
    let process = effects.trace.take();
    let instantiating = process
        .as_ref()
        .and_then(|cx| crate::telemetry::child(cx, "instantiate"));
    // The `handle` span starts once the instance exists; the store holds its slot from now.
    let call_trace: Option<CallTrace> = process.as_ref().map(|_| CallTrace::default());
    let (mut store, instance) = loop {
        let mut store = new_store(
            handler,
            queue.clone(),
            timeout,
            effects.clone(),
            call_trace.clone(),
        )?;
        let started = Instant::now();
        match handler.pre.instantiate_async(store.get()).await {
            Ok(instance) => {
                crate::metrics::instantiated(&handler.name, started.elapsed());
                if let Some(since) = waiting_since {
                    crate::metrics::instance_waited(&handler.name, since.elapsed());
                }
                break (store, instance);
            }
            Err(e) if InstanceReturns::is_pool_full(&e) => {
                drop(store);
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if !handler.returns.wait(start_by.into()).await {
                    crate::metrics::instance_waited(&handler.name, since.elapsed());
                    return Err(InvokeError::NoInstance(since.elapsed()));
                }
            }
            Err(e) => return Err(InvokeError::Instantiate(format!("{e:#}"))),
        }
    };
    drop(instantiating);
    if let (Some(cx), Some(slot)) = (&process, &call_trace) {
        // Not recorded: the call still carries the delivery's context to its follow-ups and
        // requests.
        let handle = crate::telemetry::child(cx, "handle").unwrap_or_else(|| cx.clone());
        let _ = slot.set(handle);
    }
    let call = async {
        instance
            .call_handle(store.get(), &message)
            .await
            .map_err(|e| {
                let state = store.get().data();
                if state.timed_out {
                    InvokeError::Timeout(timeout)
                } else if state.limiter.exceeded {
                    InvokeError::MemoryLimit(handler.memory_limit)
                } else {
                    InvokeError::Trap(describe(&e))
                }
            })
    };
    // The epoch deadline interrupts guest code; this outer limit also bounds time spent in
    // host calls (a slow enqueue) on behalf of the guest.
    match tokio::time::timeout(timeout + Duration::from_millis(250), call).await {
        Ok(result) => result,
        Err(_) => Err(InvokeError::Timeout(timeout)),
    }
}

/// A store for one call of `handler`, its deadline `timeout` from now.
fn new_store(
    handler: &LoadedHandler,
    queue: Arc<str>,
    timeout: Duration,
    effects: CallEffects,
    trace: Option<CallTrace>,
) -> Result<PooledStore<HostState>, InvokeError> {
    let wasi =
        build_wasi(handler, trace.as_ref()).map_err(|e| InvokeError::Instantiate(e.to_string()))?;
    let deadline = Instant::now() + timeout;
    let state = HostState {
        wasi,
        table: ResourceTable::new(),
        http: WasiHttpCtx::new(),
        outbound: OutboundHooks::new(
            handler.name.clone(),
            handler.grants.outbound.clone(),
            deadline,
            trace.clone(),
        ),
        limiter: MemoryLimiter::new(handler.memory_limit.as_u64() as usize),
        timed_out: false,
        handler: handler.name.clone(),
        queue,
        enqueuer: effects.enqueuer,
        state: effects.state,
        trace,
    };
    let mut store = Store::new(handler.pre.engine(), state);
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut ctx| {
        if Instant::now() >= deadline {
            ctx.data_mut().timed_out = true;
            Ok(UpdateDeadline::Interrupt)
        } else {
            // Hand the thread back to other tasks every tick while the guest runs.
            Ok(UpdateDeadline::Yield(1))
        }
    });
    Ok(PooledStore::new(store, handler.returns.clone()))
}

fn describe(error: &wasmtime::Error) -> String {
    let mut text = error.to_string();
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        text = format!("{trap}");
    }
    let root = error.root_cause().to_string();
    if !text.contains(&root) {
        text = format!("{text}: {root}");
    }
    text
}

fn build_wasi(handler: &LoadedHandler, trace: Option<&CallTrace>) -> wasmtime::Result<WasiCtx> {
    let grants = &handler.grants;
    let mut builder = WasiCtxBuilder::new();
    if grants.inherit_stdio {
        builder.inherit_stdout().inherit_stderr();
    } else {
        builder
            .stdout(LogStream::new(
                handler.name.clone(),
                Channel::Stdout,
                trace.cloned(),
            ))
            .stderr(LogStream::new(
                handler.name.clone(),
                Channel::Stderr,
                trace.cloned(),
            ));
    }
    if !grants.env.is_empty() {
        builder.envs(&grants.env);
    }
    for preopen in &grants.preopens {
        let perms = if preopen.read_only {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        builder.preopened_dir(&preopen.host, &preopen.guest, perms)?;
    }
    if grants.network {
        builder.inherit_network().allow_ip_name_lookup(true);
    }
    Ok(builder.build())
}

//! The WebAssembly runtime: the engine and its limits, the handler registry with hot
//! deploy and a compiled-component cache, the host imports (`wharf:handler/host`, WASI,
//! `wasi:keyvalue` with its per-call staged state), and one-call invocation.

mod bindings;
mod cache;
pub mod deploy;
mod deploy_log;
mod engine;
mod enqueuer;
mod instances;
mod invoke;
mod keyvalue;
mod memory;
mod outbound;
mod output;
mod registry;
mod state;
pub mod store_deploy;

pub use bindings::{
    EnqueueOptions, EnqueueStatus, HandlerError, Level, Message, Outcome, SESSION_HEADER,
    guest_message,
};
pub use deploy_log::{DeployEvent, DeployLog, DeployResult};
pub use engine::EPOCH_TICK;
pub use enqueuer::{EnqueueError, Enqueuer, Staged};
pub use invoke::{CallEffects, InvokeError, InvokeResult, invoke, invoke_starting_by};
pub use outbound::{BadOutboundHost, OutboundHost};
pub use registry::{DeployError, Grants, HandlerRegistry, LoadOutcome, LoadedHandler, Origin};
pub use state::{
    MAX_STATE_KEY_BYTES, MAX_STATE_VALUE_BYTES, MAX_STATE_WRITES, StateCall, StateError, StateRead,
};

//! Wharf: a host that runs message handlers compiled to WebAssembly components.
//!
//! The host owns every queue, lease, retry and deployment concern; a handler is a component
//! exporting `handle` from the `wharf:handler/handler` world (see `wit/handler.wit`).

pub mod admin;
pub mod allocator;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dispatch;
pub mod enqueue;
pub mod external;
pub mod headers;
pub mod health;
pub mod host;
pub mod inbox;
pub mod metrics;
pub mod queue;
pub mod rate_limit;
#[cfg(feature = "redis")]
pub mod redis_client;
pub mod replay;
pub mod runtime;
pub mod schedule;
pub mod schema_lock;
pub mod sql;
pub mod telemetry;
pub mod ticks;

pub use config::Config;
pub use host::{RunningHost, StartOptions, start, start_with};

//! Logging through the host: lines land in the host's `tracing` output, tagged with the
//! handler name. Plain `println!`/`eprintln!` also work (as info / warn lines).

use crate::bindings::wharf::handler::{host, types::Level};

/// Log at trace level.
pub fn trace(message: &str) {
    host::log(Level::Trace, message);
}
/// Log at debug level.
pub fn debug(message: &str) {
    host::log(Level::Debug, message);
}
/// Log at info level.
pub fn info(message: &str) {
    host::log(Level::Info, message);
}
/// Log at warn level.
pub fn warn(message: &str) {
    host::log(Level::Warn, message);
}
/// Log at error level.
pub fn error(message: &str) {
    host::log(Level::Error, message);
}

//! Write [Wharf](https://example.invalid) message handlers in Rust.
//!
//! Implement [`Handler`] for a type, name the payload type it expects, and export it with
//! [`export_handler!`]. The payload JSON is deserialized with serde before your code runs; a
//! payload that does not match is a permanent failure naming the type and the reason.
//!
//! ```rust,ignore
//! use serde::Deserialize;
//! use wharf_guest::{export_handler, Handler, HandlerError, Message, Outcome};
//!
//! #[derive(Deserialize)]
//! struct Order { id: String }
//!
//! struct ExportOrder;
//!
//! impl Handler for ExportOrder {
//!     type Payload = Order;
//!     fn handle(message: Message<Order>) -> Result<Outcome, HandlerError> {
//!         wharf_guest::log::info(&format!("exporting order {}", message.payload.id));
//!         Ok(Outcome::Completed)
//!     }
//! }
//!
//! export_handler!(ExportOrder);
//! ```

pub mod log;
mod message;
mod outbox;
pub mod state;

pub use message::Message;
pub use outbox::{EnqueueOptions, EnqueueStatus, enqueue, enqueue_json, enqueue_with};

/// The generated WIT bindings. Handler code rarely needs them directly.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "handler-with-state",
        pub_export_macro: true,
        export_macro_name: "__export_handler_world",
        default_bindings_module: "wharf_guest::bindings",
        generate_all,
    });
}

/// What the handler did with the message.
pub type Outcome = bindings::wharf::handler::types::Outcome;

/// Why the handler could not process the message.
pub type HandlerError = bindings::wharf::handler::types::HandlerError;

impl HandlerError {
    /// A temporary problem: the message is retried with backoff.
    pub fn transient(reason: impl std::fmt::Display) -> Self {
        HandlerError::Transient(reason.to_string())
    }

    /// The message can never succeed: it moves to the failed status with this reason.
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        HandlerError::Permanent(reason.to_string())
    }
}

/// A message handler. Implement it once per handler component.
pub trait Handler {
    /// The type the payload JSON is deserialized into. Use `serde_json::Value` to take any
    /// JSON, or `String`-bearing structs for strict schemas.
    type Payload: serde::de::DeserializeOwned;

    /// Process one message.
    fn handle(message: Message<Self::Payload>) -> Result<Outcome, HandlerError>;
}

/// Glue between the generated bindings and a [`Handler`]; used by [`export_handler!`].
#[doc(hidden)]
pub fn __dispatch<H: Handler>(
    raw: bindings::wharf::handler::types::Message,
) -> Result<Outcome, HandlerError> {
    let message = Message::<H::Payload>::decode(raw)?;
    H::handle(message)
}

/// Export a [`Handler`] implementation as the component's `handle` function.
///
/// Use it once, at the crate root of a `cdylib` built for `wasm32-wasip2`.
#[macro_export]
macro_rules! export_handler {
    ($handler:ty) => {
        #[doc(hidden)]
        struct __WharfExport;

        impl $crate::bindings::Guest for __WharfExport {
            fn handle(
                message: $crate::bindings::wharf::handler::types::Message,
            ) -> ::core::result::Result<$crate::Outcome, $crate::HandlerError> {
                $crate::__dispatch::<$handler>(message)
            }
        }

        $crate::bindings::__export_handler_world!(__WharfExport with_types_in $crate::bindings);
    };
}

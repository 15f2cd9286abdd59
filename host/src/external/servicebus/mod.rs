//! The Azure Service Bus provider, being built: its settings (the SAS connection string,
//! topics and subscriptions) and the HTTP client with the endpoint override. The provider is
//! not registered as a `type` until its consumer, publisher and readiness bridge exist.

mod endpoint;
mod settings;

pub use endpoint::{Redirect, http_client};
pub use settings::{Connection, ServiceBusSettings};

//! Connections to the Redis server: a reconnecting connection manager, opened on first use
//! so that a server that is down at start-up does not stop the host.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::error;
use crate::external::ProviderError;

/// Open a reconnecting connection to `url`.
pub(crate) async fn connect(
    url: &str,
    response_timeout: Duration,
) -> Result<ConnectionManager, ProviderError> {
    let client = redis::Client::open(url).map_err(error)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(error)
}

/// A connection opened on first use (so a server that is down at start-up does not stop the
/// host), then kept and reconnected by the connection manager.
#[derive(Clone)]
pub(crate) struct Lazy(Arc<LazyInner>);

struct LazyInner {
    url: String,
    response_timeout: Duration,
    cell: tokio::sync::OnceCell<ConnectionManager>,
}

impl Lazy {
    pub(crate) fn new(url: &str, response_timeout: Duration) -> Self {
        Lazy(Arc::new(LazyInner {
            url: url.to_string(),
            response_timeout,
            cell: tokio::sync::OnceCell::new(),
        }))
    }

    /// The connection, opening it first when needed.
    pub(crate) async fn get(&self) -> Result<ConnectionManager, ProviderError> {
        self.0
            .cell
            .get_or_try_init(|| connect(&self.0.url, self.0.response_timeout))
            .await
            .cloned()
    }
}

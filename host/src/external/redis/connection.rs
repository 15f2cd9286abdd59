//! The provider's connections to Redis (one server or a cluster, see
//! [`crate::redis_client`]), opened on first use so that a server that is down at start-up
//! does not stop the host.

use std::sync::Arc;
use std::time::Duration;

use super::error;
use crate::external::ProviderError;
use crate::redis_client::{RedisConnection, RedisTarget};

/// A connection opened on first use (so a server that is down at start-up does not stop the
/// host), then kept and reconnected by itself.
#[derive(Clone)]
pub(crate) struct Lazy(Arc<LazyInner>);

struct LazyInner {
    target: RedisTarget,
    response_timeout: Duration,
    cell: tokio::sync::OnceCell<RedisConnection>,
}

impl Lazy {
    pub(crate) fn new(target: RedisTarget, response_timeout: Duration) -> Self {
        Lazy(Arc::new(LazyInner {
            target,
            response_timeout,
            cell: tokio::sync::OnceCell::new(),
        }))
    }

    /// The connection, opening it first when needed.
    pub(crate) async fn get(&self) -> Result<RedisConnection, ProviderError> {
        self.0
            .cell
            .get_or_try_init(|| async {
                self.0
                    .target
                    .connect(self.0.response_timeout)
                    .await
                    .map_err(error)
            })
            .await
            .cloned()
    }
}

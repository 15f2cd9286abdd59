//! The configured providers (`[providers.NAME]`), opened once each: the storage the router
//! and processors use. Readiness bridges are opened separately, and only for providers that
//! serve at least one queue ([`open_bridge`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::redis::{RedisReadiness, RedisStorage};
use super::{ExternalError, ExternalPendingStorage, ReadinessBridge};
use crate::config::{Config, ExternalConfig, ProviderConfig};

/// One opened provider.
#[derive(Clone)]
pub struct Provider {
    /// The provider type (`redis`).
    pub kind: &'static str,
    /// Its pending-message storage.
    pub storage: Arc<dyn ExternalPendingStorage>,
}

/// Every configured provider by name.
#[derive(Clone, Default)]
pub struct Providers {
    by_name: BTreeMap<String, Provider>,
}

impl Providers {
    /// Open every `[providers.NAME]` of `config`.
    pub async fn open(config: &Config) -> Result<Self, (String, ExternalError)> {
        let mut by_name = BTreeMap::new();
        for (name, provider) in &config.providers {
            let opened = match provider {
                ProviderConfig::Redis(redis) => {
                    let storage = RedisStorage::open(redis)
                        .await
                        .map_err(|e| (name.clone(), e))?;
                    Provider {
                        kind: provider.kind(),
                        storage: Arc::new(storage),
                    }
                }
            };
            by_name.insert(name.clone(), opened);
        }
        Ok(Providers { by_name })
    }

    /// The provider called `name`.
    pub fn get(&self, name: &str) -> Option<&Provider> {
        self.by_name.get(name)
    }

    /// Every provider with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Provider)> {
        self.by_name.iter()
    }
}

/// Open the readiness bridge of `provider` (its own connection: reads block on it).
pub async fn open_bridge(
    provider: &ProviderConfig,
    external: &ExternalConfig,
) -> Result<Arc<dyn ReadinessBridge>, ExternalError> {
    match provider {
        ProviderConfig::Redis(redis) => Ok(Arc::new(
            RedisReadiness::open(redis, external.claim_after).await?,
        )),
    }
}

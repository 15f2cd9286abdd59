//! The configured providers (`[providers.NAME]`) of a host, each opened once by its provider
//! module: the producers the router uses and the consumers processors open.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Provider, ProviderError, registry};
use crate::config::Config;

/// Every opened provider by name.
#[derive(Clone, Default)]
pub struct Providers {
    by_name: BTreeMap<String, Arc<dyn Provider>>,
}

impl Providers {
    /// Open every `[providers.NAME]` of `config`. Fails with the provider's name.
    pub async fn open(config: &Config) -> Result<Self, (String, ProviderError)> {
        let mut by_name = BTreeMap::new();
        for (name, section) in &config.providers {
            let kind = registry::find(&section.kind).ok_or_else(|| {
                (
                    name.clone(),
                    ProviderError::new(
                        "config",
                        super::ErrorKind::Protocol,
                        format!("unknown provider type `{}`", section.kind),
                    ),
                )
            })?;
            let provider = kind
                .open(name, &section.settings)
                .await
                .map_err(|e| (name.clone(), e))?;
            by_name.insert(name.clone(), provider);
        }
        Ok(Providers { by_name })
    }

    /// A set made of already opened providers (tests, embedding).
    pub fn from_opened(by_name: BTreeMap<String, Arc<dyn Provider>>) -> Self {
        Providers { by_name }
    }

    /// The provider called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.by_name.get(name)
    }

    /// Close every provider's own connections.
    pub async fn close(&self) {
        for provider in self.by_name.values() {
            provider.close().await;
        }
    }

    /// Every provider with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<dyn Provider>)> {
        self.by_name.iter()
    }
}

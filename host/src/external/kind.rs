//! What a provider type is ([`ProviderKind`]): the `type` that selects it, how it checks its
//! `[providers.NAME]` settings (naming the key that is wrong) and how it opens a provider.

use std::sync::Arc;

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use super::{Capabilities, Provider, ProviderError};

/// A key of a `[providers.NAME]` section that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// The key inside the section (e.g. `url`); empty for the section itself (a missing key).
    pub key: String,
    /// What is wrong and what was expected.
    pub reason: String,
}

impl SettingsError {
    /// `key` is wrong for `reason`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        SettingsError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// One provider type.
#[async_trait]
pub trait ProviderKind: Send + Sync + 'static {
    /// The `type` that selects it.
    fn name(&self) -> &'static str;

    /// Check the section's settings without connecting, and tell what a provider with them
    /// can do.
    fn check(&self, settings: &toml::Table) -> Result<Capabilities, SettingsError>;

    /// Open provider `name` with its settings (already checked).
    async fn open(
        &self,
        name: &str,
        settings: &toml::Table,
    ) -> Result<Arc<dyn Provider>, ProviderError>;
}

/// Read a provider's settings struct from its section, naming the key that is wrong.
pub fn parse_settings<T: DeserializeOwned>(settings: &toml::Table) -> Result<T, SettingsError> {
    serde_path_to_error::deserialize(toml::Value::Table(settings.clone())).map_err(|e| {
        let key = e.path().to_string();
        let key = if key == "." { String::new() } else { key };
        // The parser's first line says what is wrong; the rest repeats the location.
        let reason = e.inner().to_string();
        let reason = reason.lines().next().unwrap_or_default().to_string();
        SettingsError::new(key, reason)
    })
}

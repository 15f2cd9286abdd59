//! The `servicebus` provider type's `[providers.NAME]` settings, checked without connecting:
//! the SAS connection string (parsed, never logged), the topic and subscription names of
//! each queue, lock renewal and the endpoint override the tests use.

use std::fmt;

use serde::Deserialize;

use crate::external::kind::SettingsError;
use crate::external::{Capabilities, CountKind};

/// `[providers.NAME]` with `type = "servicebus"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceBusSettings {
    /// `Endpoint=sb://{namespace}.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…`.
    pub connection_string: String,
    /// Prefix of each queue's topic.
    #[serde(default = "ServiceBusSettings::default_prefix")]
    pub queue_prefix: String,
    /// The subscription of each topic the processing consumer receives from.
    #[serde(default = "ServiceBusSettings::default_processing")]
    pub processing_subscription: String,
    /// The subscription of each topic the readiness bridge receives from.
    #[serde(default = "ServiceBusSettings::default_readiness")]
    pub readiness_subscription: String,
    /// Renew the lock of a message whose handler runs longer than the lock duration.
    #[serde(default = "ServiceBusSettings::default_lock_renewal")]
    pub lock_renewal: bool,
    /// `http://host:port` that replaces `https://{namespace}.servicebus.windows.net` (for
    /// tests against a local server).
    #[serde(default)]
    pub endpoint_override: Option<String>,
}

/// Never shows the connection string (it holds the key).
impl fmt::Debug for ServiceBusSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceBusSettings")
            .field("connection_string", &"<secret>")
            .field("queue_prefix", &self.queue_prefix)
            .field("processing_subscription", &self.processing_subscription)
            .field("readiness_subscription", &self.readiness_subscription)
            .field("lock_renewal", &self.lock_renewal)
            .field("endpoint_override", &self.endpoint_override)
            .finish()
    }
}

/// What a connection string names.
#[derive(Clone, PartialEq, Eq)]
pub struct Connection {
    /// The namespace (`{namespace}.servicebus.windows.net`).
    pub namespace: String,
    /// `SharedAccessKeyName`.
    pub key_name: String,
    /// `SharedAccessKey`.
    pub key: String,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("namespace", &self.namespace)
            .field("key_name", &self.key_name)
            .field("key", &"<secret>")
            .finish()
    }
}

impl ServiceBusSettings {
    fn default_prefix() -> String {
        "nexus.".to_string()
    }
    fn default_processing() -> String {
        "processing".to_string()
    }
    fn default_readiness() -> String {
        "readiness".to_string()
    }
    fn default_lock_renewal() -> bool {
        true
    }

    /// The topic of `queue`.
    pub fn topic(&self, queue: &str) -> String {
        format!("{}{queue}", self.queue_prefix)
    }

    /// The namespace and key of the connection string.
    pub fn connection(&self) -> Result<Connection, SettingsError> {
        let bad = |why: &str| {
            SettingsError::new(
                "connection_string",
                format!(
                    "{why} (expected Endpoint=sb://NAMESPACE.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…)"
                ),
            )
        };
        let mut endpoint = None;
        let mut key_name = None;
        let mut key = None;
        for part in self
            .connection_string
            .split(';')
            .filter(|p| !p.trim().is_empty())
        {
            let Some((name, value)) = part.split_once('=') else {
                return Err(bad("a part without `=`"));
            };
            match name.trim() {
                "Endpoint" => endpoint = Some(value.trim().to_string()),
                "SharedAccessKeyName" => key_name = Some(value.trim().to_string()),
                "SharedAccessKey" => key = Some(value.trim().to_string()),
                _ => {}
            }
        }
        let endpoint = endpoint.ok_or_else(|| bad("no Endpoint"))?;
        let host = endpoint
            .strip_prefix("sb://")
            .ok_or_else(|| bad("the Endpoint is not an sb:// address"))?
            .trim_end_matches('/');
        let namespace = host
            .strip_suffix(".servicebus.windows.net")
            .unwrap_or(host)
            .to_string();
        if namespace.is_empty() {
            return Err(bad("the Endpoint names no namespace"));
        }
        Ok(Connection {
            namespace,
            key_name: key_name
                .filter(|k| !k.is_empty())
                .ok_or_else(|| bad("no SharedAccessKeyName"))?,
            key: key
                .filter(|k| !k.is_empty())
                .ok_or_else(|| bad("no SharedAccessKey"))?,
        })
    }

    /// Check every setting; what a provider with them can do.
    pub fn check(&self) -> Result<Capabilities, SettingsError> {
        self.connection()?;
        for (key, name) in [
            ("processing_subscription", &self.processing_subscription),
            ("readiness_subscription", &self.readiness_subscription),
        ] {
            if name.trim().is_empty() {
                return Err(SettingsError::new(key, "must not be empty"));
            }
        }
        if self.processing_subscription == self.readiness_subscription {
            return Err(SettingsError::new(
                "readiness_subscription",
                format!(
                    "must differ from processing_subscription (both are `{}`): each receives its own copy of every message",
                    self.readiness_subscription
                ),
            ));
        }
        if let Some(url) = &self.endpoint_override
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(SettingsError::new(
                "endpoint_override",
                format!("`{url}` is not an http:// or https:// address"),
            ));
        }
        Ok(Capabilities {
            delay: true,
            delivery_count: CountKind::Exact,
            ..Capabilities::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::kind::parse_settings;

    fn settings(text: &str) -> ServiceBusSettings {
        parse_settings(&toml::from_str(text).unwrap()).unwrap()
    }

    const GOOD: &str = "connection_string = \"Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=c2VjcmV0\"";

    #[test]
    fn a_connection_string_names_namespace_and_key() {
        let s = settings(GOOD);
        let c = s.connection().unwrap();
        assert_eq!(
            (c.namespace.as_str(), c.key_name.as_str(), c.key.as_str()),
            ("shop", "Root", "c2VjcmV0")
        );
        assert_eq!(s.topic("orders"), "nexus.orders");
        let caps = s.check().unwrap();
        assert!(caps.delay && caps.delivery_count == CountKind::Exact);
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let s = settings(GOOD);
        let shown = format!("{s:?} {:?}", s.connection().unwrap());
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
    }

    #[test]
    fn bad_settings_name_their_key() {
        let e = settings("connection_string = \"Endpoint=sb://x/\"")
            .check()
            .unwrap_err();
        assert_eq!(e.key, "connection_string");
        assert!(e.reason.contains("SharedAccessKeyName"), "{e:?}");
        let e = settings(&format!("{GOOD}\nreadiness_subscription = \"processing\""))
            .check()
            .unwrap_err();
        assert_eq!(e.key, "readiness_subscription");
        let e = settings(&format!("{GOOD}\nendpoint_override = \"127.0.0.1:1\""))
            .check()
            .unwrap_err();
        assert_eq!(e.key, "endpoint_override");
    }
}

//! Shared access signatures as the "Generate SAS token" procedure of the Service Bus
//! documentation defines them: the URL-encoded resource URI and an expiry, signed with
//! HMAC-SHA256 under the key. One token covers the whole namespace and is reused until
//! close to its expiry.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::settings::Connection;
use crate::external::{ErrorKind, ProviderError};

const KIND: &str = "servicebus";

/// How long a signature is valid; a new one is made when less than a tenth is left.
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// Signs requests to one namespace.
pub struct Signer {
    resource: String,
    connection: Connection,
    token: Mutex<Option<(String, SystemTime)>>,
}

impl Signer {
    /// Tokens for `resource` (the namespace's URI) with the key of `connection`.
    pub fn new(resource: String, connection: Connection) -> Self {
        Signer {
            resource,
            connection,
            token: Mutex::new(None),
        }
    }

    /// A signature for the whole namespace ("Generate SAS token": the URL-encoded resource
    /// URI and expiry, HMAC-SHA256 with the key), reused until close to its expiry.
    pub fn token(&self) -> Result<String, ProviderError> {
        let now = SystemTime::now();
        let mut cached = self.token.lock().expect("token");
        if let Some((token, expires)) = &*cached
            && *expires > now + TOKEN_LIFETIME / 10
        {
            return Ok(token.clone());
        }
        let expires = now + TOKEN_LIFETIME;
        let se = expires
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let sr = url_encode(&self.resource);
        let key = azure_core::base64::encode(self.connection.key.as_bytes());
        let sig = azure_core::hmac::hmac_sha256(&format!("{sr}\n{se}"), &key.into())
            .map_err(|e| ProviderError::with_source(KIND, ErrorKind::Denied, e))?;
        let token = format!(
            "SharedAccessSignature sr={sr}&sig={}&se={se}&skn={}",
            url_encode(&sig),
            url_encode(&self.connection.key_name)
        );
        *cached = Some((token.clone(), expires));
        Ok(token)
    }
}

/// Percent-encode everything but unreserved characters (RFC 3986).
fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3 / 2);
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_keeps_only_unreserved_characters() {
        assert_eq!(
            url_encode("https://a.b/c?d=e f"),
            "https%3A%2F%2Fa.b%2Fc%3Fd%3De%20f"
        );
    }

    #[test]
    fn a_token_names_resource_expiry_and_key_name() {
        let signer = Signer::new(
            "https://shop.servicebus.windows.net/".to_string(),
            Connection {
                namespace: "shop".to_string(),
                key_name: "Root".to_string(),
                key: "c2VjcmV0".to_string(),
            },
        );
        let token = signer.token().unwrap();
        assert!(
            token.starts_with(
                "SharedAccessSignature sr=https%3A%2F%2Fshop.servicebus.windows.net%2F&sig="
            ),
            "{token}"
        );
        assert!(token.ends_with("&skn=Root"), "{token}");
        assert_eq!(signer.token().unwrap(), token, "reused");
    }
}

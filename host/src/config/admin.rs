//! `[admin]`: protection of the admin API and dashboard. The token never appears in logs,
//! `Debug` output, `config check` or any API answer.

use std::net::SocketAddr;

use serde::Deserialize;

use super::Secret;

/// The environment variable read when `[admin] token` is not set.
pub const TOKEN_ENV: &str = "WHARF_ADMIN_TOKEN";

/// `[admin]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token required by `/api/` and the dashboard (default: `WHARF_ADMIN_TOKEN`).
    pub token: Option<Secret>,
}

impl AdminConfig {
    /// Fill the token from `WHARF_ADMIN_TOKEN` when the file does not set one; an empty
    /// value counts as unset.
    pub(crate) fn resolve(&mut self, env: Option<String>) {
        if self.token.as_ref().is_some_and(|t| t.expose().is_empty()) {
            self.token = None;
        }
        if self.token.is_none() {
            self.token = env.filter(|v| !v.is_empty()).map(Secret::new);
        }
    }

    /// Why serving the admin API on `listen` is refused, if it is: any address other than
    /// loopback needs a token.
    pub fn refusal(&self, listen: SocketAddr) -> Option<String> {
        if self.token.is_some() || listen.ip().is_loopback() {
            return None;
        }
        Some(format!(
            "host.admin_listen {listen} is not a loopback address: set [admin] token (or {TOKEN_ENV}) so the admin API and dashboard are protected"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_loopback_address_needs_a_token() {
        let open: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9464".parse().unwrap();
        let mut admin = AdminConfig::default();
        assert!(admin.refusal(local).is_none());
        let reason = admin.refusal(open).unwrap();
        assert!(
            reason.contains("0.0.0.0:9464") && reason.contains(TOKEN_ENV),
            "{reason}"
        );
        admin.resolve(Some("from-env".into()));
        assert_eq!(admin.token.as_ref().unwrap().expose(), "from-env");
        assert!(admin.refusal(open).is_none());
        assert_eq!(
            format!("{admin:?}"),
            "AdminConfig { token: Some(Secret(***)) }"
        );
    }

    #[test]
    fn an_empty_token_is_unset() {
        let mut admin = AdminConfig {
            token: Some(Secret::new("")),
        };
        admin.resolve(None);
        assert!(admin.token.is_none());
    }
}

//! A small client of the running host's admin server for the CLI: the address from
//! `host.admin_listen` (a wildcard address is reached on loopback), the admin token when one
//! is configured, and errors that say which host did not answer and why.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;

use crate::config::Config;

/// The admin server of the host running `config`.
pub struct AdminClient {
    base: String,
    token: Option<String>,
}

impl AdminClient {
    /// A client for the host that `config` describes.
    pub fn new(config: &Config) -> Self {
        let mut addr: SocketAddr = config.host.admin_listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        AdminClient {
            base: format!("http://{addr}"),
            token: config.admin.token.as_ref().map(|t| t.expose().to_string()),
        }
    }

    /// `GET path` as JSON. Any answer but 200 is an error carrying the host's message.
    pub async fn get<T: DeserializeOwned + Send + 'static>(&self, path: &str) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base);
        let token = self.token.clone();
        let (status, body) = tokio::task::spawn_blocking({
            let url = url.clone();
            move || -> Result<(u16, String), ureq::Error> {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let mut request = agent.get(&url);
                if let Some(token) = token {
                    request = request.header("Authorization", format!("Bearer {token}"));
                }
                let mut response = request.call()?;
                let status = response.status().as_u16();
                Ok((status, response.body_mut().read_to_string()?))
            }
        })
        .await?
        .with_context(|| {
            format!("no Wharf host answers at {url} (is `wharf run` running with this config?)")
        })?;
        // `/readyz` answers 503 with its report when a check fails: still an answer.
        if status != 200 && !(status == 503 && path == "/readyz") {
            let reason = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(body);
            bail!("{url} answered {status}: {reason}");
        }
        serde_json::from_str(&body).with_context(|| format!("unexpected answer from {url}"))
    }
}

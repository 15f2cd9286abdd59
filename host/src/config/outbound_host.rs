//! The entries of a handler's `allowed_outbound_hosts` ([`OutboundHost`]): parsed and checked
//! with the configuration, matched against each request by the runtime.

use std::fmt;
use std::str::FromStr;

use http::Uri;
use http::uri::Scheme;
use serde::Deserialize;

/// One entry of `allowed_outbound_hosts`: `https://api.example.com`,
/// `http://127.0.0.1:8080`, or `https://*.example.com` for every subdomain. Without a port
/// the scheme's default (443, 80) is meant.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct OutboundHost {
    https: bool,
    host: String,
    port: u16,
}

/// Why an `allowed_outbound_hosts` entry is not an origin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{entry}` is not an allowed host: {reason} (expected `https://HOST[:PORT]` or `http://HOST[:PORT]`)"
)]
pub struct BadOutboundHost {
    entry: String,
    reason: &'static str,
}

impl FromStr for OutboundHost {
    type Err = BadOutboundHost;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let bad = |reason| BadOutboundHost {
            entry: entry.to_string(),
            reason,
        };
        let uri: Uri = entry.parse().map_err(|_| bad("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(_) => return Err(bad("the scheme must be http or https")),
            None => return Err(bad("the scheme is missing")),
        };
        let authority = uri.authority().ok_or_else(|| bad("the host is missing"))?;
        if authority.as_str().contains('@') {
            return Err(bad("user information is not allowed"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(bad("a path is not allowed: the whole origin is granted"));
        }
        let host = authority.host().to_ascii_lowercase();
        let wildcard_body = host.strip_prefix("*.").unwrap_or(&host);
        if wildcard_body.is_empty() || wildcard_body.contains('*') {
            return Err(bad(
                "`*` is allowed only as the first label (`*.example.com`)",
            ));
        }
        if host.starts_with("*.")
            && wildcard_body
                .split('.')
                .all(|label| label.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(bad(
                "a wildcard needs a domain name, not part of an IP address",
            ));
        }
        Ok(OutboundHost {
            https,
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            host,
        })
    }
}

impl TryFrom<String> for OutboundHost {
    type Error = BadOutboundHost;

    fn try_from(entry: String) -> Result<Self, Self::Error> {
        entry.parse()
    }
}

impl fmt::Display for OutboundHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

impl OutboundHost {
    /// Whether a request to `uri` goes to this origin.
    pub fn allows(&self, uri: &Uri) -> bool {
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        if https != self.https || (!https && uri.scheme() != Some(&Scheme::HTTP)) {
            return false;
        }
        let Some(authority) = uri.authority() else {
            return false;
        };
        if authority.as_str().contains('@') {
            return false; // user information: never sent on, never allowed
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let host = authority.host().to_ascii_lowercase();
        let host_matches = match self.host.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == self.host,
        };
        host_matches && port == self.port
    }
}

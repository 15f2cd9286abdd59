//! The Service Bus REST operations the provider uses, each as the REST reference documents
//! it, over the SDK's HTTP client and signed with a shared access signature:
//!
//! - "Send Message Batch" — POST `{topic}/messages`, `application/vnd.microsoft.servicebus.json`;
//! - "Peek-Lock Message (Non-Destructive Read)" — POST `{topic}/subscriptions/{sub}/messages/head`;
//! - "Receive and Delete Message (Destructive Read)" — DELETE on the same URL;
//! - "Delete Message" (complete), "Unlock Message", "Renew-Lock for a Message" — DELETE, PUT
//!   and POST on the lock URL a peek-lock answers with in `Location`.
//!
//! These are called here rather than through `azure_messaging_servicebus` 0.21's clients,
//! which have no batch send, fail a peek-lock whose body is not UTF-8 (its lock is then
//! lost to the caller, so the message could never be moved into SQL as failed), read
//! `EnqueuedSequenceNumber` as 32 bits, and offer lock operations only on a response object
//! that cannot be shared with a lock-renewing task.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use azure_core::headers::{HeaderName, Headers};
use azure_core::{HttpClient, Method, Request, StatusCode, Url};
use azure_messaging_servicebus::service_bus::SettableBrokerProperties;
use bytes::Bytes;
use serde::Deserialize;

use super::sas::Signer;
use super::settings::Connection;
use crate::external::{ErrorKind, ProviderError};

const KIND: &str = "servicebus";

/// Longest any request may take beyond the receive timeout it asks for.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The content type of "Send Message Batch".
const BATCH_CONTENT_TYPE: &str = "application/vnd.microsoft.servicebus.json";

/// One message to send.
pub struct Outgoing {
    /// The body (the envelope).
    pub body: String,
    /// `MessageId`, `ScheduledEnqueueTimeUtc`, …
    pub broker: SettableBrokerProperties,
    /// Application properties (the trace context).
    pub properties: Vec<(String, String)>,
}

/// The broker properties of a received message (the documented `BrokerProperties` header).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Received {
    /// Deliveries so far, this one included.
    pub delivery_count: u32,
    /// The MessageId the sender set (or the broker made).
    #[serde(default)]
    pub message_id: Option<String>,
    /// The broker's sequence number of the message in its entity.
    #[serde(default)]
    pub sequence_number: Option<i64>,
    /// When the message was enqueued (RFC 1123).
    #[serde(default)]
    pub enqueued_time_utc: Option<String>,
    /// Until when the lock holds (RFC 1123).
    #[serde(default)]
    pub locked_until_utc: Option<String>,
}

/// A peek-locked message.
pub struct Locked {
    /// The body, as bytes (a direct producer may send anything).
    pub body: Bytes,
    /// Its broker properties.
    pub broker: Received,
    /// Custom properties (the other headers of the answer), unquoted.
    pub properties: Vec<(String, String)>,
    /// The lock's URL (complete, unlock and renew act on it).
    pub lock_url: String,
    /// How long the lock holds from the moment it was received.
    pub lock_for: Duration,
}

/// A namespace reached through `http` with a shared access key.
pub struct Rest {
    http: Arc<dyn HttpClient>,
    base: String,
    signer: Signer,
}

impl Rest {
    /// The namespace of `connection`, reached through `http`.
    pub fn new(http: Arc<dyn HttpClient>, connection: Connection) -> Self {
        let base = format!("https://{}.servicebus.windows.net", connection.namespace);
        Rest {
            signer: Signer::new(format!("{base}/"), connection),
            base,
            http,
        }
    }

    /// Send `request` (signed), waiting at most `wait` beyond [`REQUEST_TIMEOUT`].
    async fn call(
        &self,
        method: Method,
        url: &str,
        content: Option<(&str, String)>,
        wait: Duration,
    ) -> Result<Answer, ProviderError> {
        let parsed = Url::parse(url)
            .map_err(|e| ProviderError::new(KIND, ErrorKind::Protocol, format!("`{url}`: {e}")))?;
        let mut request = Request::new(parsed, method);
        request.insert_header(azure_core::headers::AUTHORIZATION, self.signer.token()?);
        match content {
            Some((content_type, body)) => {
                request.insert_header(azure_core::headers::CONTENT_TYPE, content_type.to_string());
                request.set_body(body);
            }
            None => {
                request.insert_header(azure_core::headers::CONTENT_LENGTH, "0");
                request.set_body(azure_core::EMPTY_BODY);
            }
        }
        let limit = REQUEST_TIMEOUT + wait;
        let exchange = async {
            let response = self.http.execute_request(&request).await?;
            let (status, headers, body) = response.deconstruct();
            Ok::<_, azure_core::Error>(Answer {
                status,
                headers,
                body: body.collect().await?,
            })
        };
        match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(ProviderError::with_source(KIND, ErrorKind::Unavailable, e)),
            Err(_) => Err(ProviderError::new(
                KIND,
                ErrorKind::Timeout,
                format!("no answer from {} within {limit:?}", self.base),
            )),
        }
    }

    /// "Send Message Batch" of `messages` to `topic` (one request).
    pub async fn send(&self, topic: &str, messages: &[Outgoing]) -> Result<(), ProviderError> {
        let items: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| {
                let properties: serde_json::Map<String, serde_json::Value> = m
                    .properties
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
                    .collect();
                serde_json::json!({
                    "Body": m.body,
                    "BrokerProperties": m.broker,
                    "UserProperties": properties,
                })
            })
            .collect();
        let body = serde_json::to_string(&items)
            .map_err(|e| ProviderError::new(KIND, ErrorKind::Protocol, format!("a batch: {e}")))?;
        let url = format!("{}/{topic}/messages", self.base);
        let answer = self
            .call(
                Method::Post,
                &url,
                Some((BATCH_CONTENT_TYPE, body)),
                Duration::ZERO,
            )
            .await?;
        answer.expect(
            &format!("sending to topic `{topic}`"),
            &[StatusCode::Created],
        )
    }

    /// Whether the namespace answers: a GET of `topic`'s description. Any answer but a
    /// server error counts (a key without Manage rights is refused the description, and that
    /// refusal is an answer).
    pub async fn reach(&self, topic: &str) -> Result<(), ProviderError> {
        let url = format!("{}/{topic}", self.base);
        let answer = self.call(Method::Get, &url, None, Duration::ZERO).await?;
        if answer.status.is_server_error() {
            return Err(ProviderError::new(
                KIND,
                ErrorKind::Unavailable,
                format!("the namespace answered {}", answer.status),
            ));
        }
        Ok(())
    }

    fn head_url(&self, topic: &str, subscription: &str, timeout: Duration) -> String {
        format!(
            "{}/{topic}/subscriptions/{subscription}/messages/head?timeout={}",
            self.base,
            timeout.as_secs()
        )
    }

    /// "Peek-Lock Message": the first available message of `topic/subscription`, locked,
    /// waiting up to `timeout` (whole seconds) for one; `None` when none came.
    pub async fn peek_lock(
        &self,
        topic: &str,
        subscription: &str,
        timeout: Duration,
    ) -> Result<Option<Locked>, ProviderError> {
        let url = self.head_url(topic, subscription, timeout);
        let answer = self.call(Method::Post, &url, None, timeout).await?;
        let received_at = SystemTime::now();
        let what = format!("receiving from subscription `{topic}/{subscription}`");
        if answer.status == StatusCode::NoContent {
            return Ok(None);
        }
        answer.expect(&what, &[StatusCode::Created, StatusCode::Ok])?;
        let header = |name: &'static str| {
            answer
                .headers
                .get_optional_str(&HeaderName::from_static(name))
        };
        let broker: Received = header("brokerproperties")
            .and_then(|text| serde_json::from_str(text).ok())
            .ok_or_else(|| {
                ProviderError::new(
                    KIND,
                    ErrorKind::Protocol,
                    format!("{what}: the answer has no readable BrokerProperties"),
                )
            })?;
        let lock_url = header("location").map(str::to_string).ok_or_else(|| {
            ProviderError::new(KIND, ErrorKind::Protocol, format!("{what}: no Location"))
        })?;
        // The lock's length as the broker states it (its clock), else one minute.
        let lock_for = match (
            broker.locked_until_utc.as_deref().and_then(parse_date),
            header("date").and_then(parse_date).unwrap_or(received_at),
        ) {
            (Some(until), now) => until.duration_since(now).unwrap_or(Duration::from_secs(1)),
            (None, _) => Duration::from_secs(60),
        };
        Ok(Some(Locked {
            properties: custom_properties(&answer.headers),
            body: answer.body,
            broker,
            lock_url,
            lock_for,
        }))
    }

    /// "Receive and Delete Message": delete the first available message of
    /// `topic/subscription` without waiting; whether there was one.
    pub async fn receive_and_delete(
        &self,
        topic: &str,
        subscription: &str,
    ) -> Result<bool, ProviderError> {
        let url = self.head_url(topic, subscription, Duration::ZERO);
        let answer = self
            .call(Method::Delete, &url, None, Duration::ZERO)
            .await?;
        if answer.status == StatusCode::NoContent {
            return Ok(false);
        }
        answer.expect(
            &format!("receiving from subscription `{topic}/{subscription}`"),
            &[StatusCode::Ok],
        )?;
        Ok(true)
    }

    /// Act on a lock: "Delete Message" (complete), "Unlock Message" or "Renew-Lock". Returns
    /// whether the lock was still held (404 / 410: it expired or the message is gone).
    pub async fn on_lock(&self, lock_url: &str, action: LockAction) -> Result<bool, ProviderError> {
        let method = match action {
            LockAction::Complete => Method::Delete,
            LockAction::Unlock => Method::Put,
            LockAction::Renew => Method::Post,
        };
        // The lock URL names the namespace's address; requests go through the same client.
        let answer = self.call(method, lock_url, None, Duration::ZERO).await?;
        if matches!(answer.status, StatusCode::NotFound | StatusCode::Gone) {
            return Ok(false);
        }
        answer.expect(&format!("{action:?} of a message lock"), &[StatusCode::Ok])?;
        Ok(true)
    }
}

/// An operation on a message lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockAction {
    /// Remove the message for good.
    Complete,
    /// Make it available again (its delivery stays counted).
    Unlock,
    /// Hold the lock another lock duration.
    Renew,
}

struct Answer {
    status: StatusCode,
    headers: Headers,
    body: Bytes,
}

impl Answer {
    /// Ok when the status is one of `ok`; otherwise the error, sorted by status.
    fn expect(&self, what: &str, ok: &[StatusCode]) -> Result<(), ProviderError> {
        if ok.contains(&self.status) {
            return Ok(());
        }
        let code = u16::from(self.status);
        let kind = match code {
            401 | 403 => ErrorKind::Denied,
            408 => ErrorKind::Timeout,
            429 | 500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Protocol,
        };
        let said = String::from_utf8_lossy(&self.body);
        let said = said.trim();
        let hint = match code {
            404 | 410 => " (the topic or subscription does not exist: create it first)",
            _ => "",
        };
        Err(ProviderError::new(
            KIND,
            kind,
            format!(
                "{what}: HTTP {code} {}{hint}{}{said}",
                self.status.canonical_reason(),
                if said.is_empty() { "" } else { ": " }
            ),
        ))
    }
}

/// The custom properties of a received message: every header that is not part of the
/// protocol, with the quotes the REST API puts around string values removed.
fn custom_properties(headers: &Headers) -> Vec<(String, String)> {
    const PROTOCOL: &[&str] = &[
        "brokerproperties",
        "location",
        "content-type",
        "content-length",
        "date",
        "server",
        "transfer-encoding",
        "strict-transport-security",
        "connection",
        "keep-alive",
    ];
    headers
        .iter()
        .filter(|(k, _)| !PROTOCOL.contains(&k.as_str()))
        .map(|(k, v)| {
            let v = v.as_str();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.as_str().to_string(), v.to_string())
        })
        .collect()
}

/// An RFC 1123 date as the REST API writes them.
pub fn parse_date(text: &str) -> Option<SystemTime> {
    let parsed =
        time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc2822)
            .ok()?;
    let secs = u64::try_from(parsed.unix_timestamp()).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_parse_in_both_forms() {
        let a = parse_date("Mon, 30 Nov 2026 10:30:41 GMT").unwrap();
        let b = parse_date("Mon, 30 Nov 2026 10:30:41 +0000").unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_796_034_641
        );
    }
}

//! A direct producer: "Send Message" as a plain HTTP POST with a SAS token, the way any
//! client outside Wharf sends to a topic.

use super::sas::sas_token;

/// POST `body` to `{endpoint}/{topic}/messages` (signed for namespace `namespace` with
/// `key`) with extra `headers` (`BrokerProperties` as JSON, custom properties as other
/// headers). Returns the HTTP status.
pub async fn send_direct(
    endpoint: &str,
    namespace: &str,
    (key_name, key): (&str, &str),
    topic: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> u16 {
    let resource = format!("https://{namespace}.servicebus.windows.net/{topic}");
    let expiry = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let token = sas_token(&resource, key_name, key, expiry);
    let url = format!("{endpoint}/{topic}/messages");
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let body = body.to_vec();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.post(&url).header("Authorization", &token).header(
            "Content-Type",
            "application/atom+xml;type=entry;charset=utf-8",
        );
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        request
            .send(&body[..])
            .expect("the server answers")
            .status()
            .as_u16()
    })
    .await
    .unwrap()
}

//! Shared access signatures, as the "Generate SAS token" procedure of the Service Bus
//! documentation defines them: `SharedAccessSignature sr={url-encoded resource URI}&sig=
//! {url-encoded base64 HMAC-SHA256 of "{sr}\n{expiry}" with the key's bytes}&se={expiry}&skn=
//! {key name}`; a missing, malformed, wrongly signed or expired token is 401.

use std::collections::HashMap;
use std::time::SystemTime;

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Refusal, Shared};

/// A SAS token for `uri` signed with `key` (the "Generate SAS token" procedure): the
/// URL-encoded resource URI and the expiry, HMAC-SHA256 with the key's bytes, base64.
pub fn sas_token(uri: &str, key_name: &str, key: &str, expiry_unix: u64) -> String {
    let sr: String = url_encode(uri);
    let signature = sign(key, &format!("{sr}\n{expiry_unix}"));
    format!(
        "SharedAccessSignature sr={sr}&sig={}&se={expiry_unix}&skn={key_name}",
        url_encode(&signature)
    )
}

fn sign(key: &str, text: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(text.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

fn url_encode(text: &str) -> String {
    let mut out = String::new();
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

fn url_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Check the `Authorization` header ("Generate SAS token"; a missing, malformed, wrongly
/// signed or expired token is 401 Unauthorized).
pub(super) fn authorize(shared: &Shared, headers: &HeaderMap, path: &str) -> Result<(), Refusal> {
    let refuse = |why: &str| Err(Refusal(StatusCode::UNAUTHORIZED, why.to_string()));
    let Some(token) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("SharedAccessSignature "))
    else {
        return refuse("missing SharedAccessSignature");
    };
    let fields: HashMap<&str, &str> = token.split('&').filter_map(|p| p.split_once('=')).collect();
    let (Some(sr), Some(sig), Some(se), Some(skn)) = (
        fields.get("sr"),
        fields.get("sig"),
        fields.get("se"),
        fields.get("skn"),
    ) else {
        return refuse("malformed token");
    };
    if *skn != shared.key_name {
        return refuse("unknown key name");
    }
    let expiry: u64 = se.parse().unwrap_or(0);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if expiry <= now {
        return refuse("token expired");
    }
    let key = shared.key.lock().unwrap().clone();
    if url_decode(sig) != sign(&key, &format!("{sr}\n{se}")) {
        return refuse("invalid signature");
    }
    // The token's resource must cover the request's path (scheme and host are the
    // namespace's; the test server is reached under another one).
    let resource = url_decode(sr);
    let resource_path = resource
        .split_once("://")
        .map_or(resource.as_str(), |(_, rest)| rest)
        .split_once('/')
        .map_or("", |(_, p)| p);
    let resource_path = resource_path.split('?').next().unwrap_or_default();
    if !path.trim_start_matches('/').starts_with(resource_path) {
        return refuse("token not valid for this resource");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_round_trips() {
        let s = "https://ns.servicebus.windows.net/t/messages?timeout=5";
        assert_eq!(url_decode(&url_encode(s)), s);
    }
}

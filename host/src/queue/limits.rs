//! The limits every enqueue path enforces, whatever the store: the length of a MessageId
//! (one limit for the CLI, the JSON Lines import, guests and broker envelopes) and the size
//! of a payload (each queue's `max_payload`). Ids longer than the consumer inbox's 512
//! characters are still accepted: the inbox is bypassed for them, as its rules say. No id or
//! header may hold a NUL character, which PostgreSQL cannot store in text: every store refuses
//! it alike, before anything is written.

/// The longest MessageId, in characters.
pub const MAX_ID_CHARS: usize = 1024;

/// The default `max_payload` of a queue: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: u64 = 1024 * 1024;

/// The latest processing date a message can have: the last millisecond of year 9999, which
/// every store and broker can represent. A longer delay means this date.
pub const LATEST_DATE_MS: i64 = 253_402_300_799_999;

/// The processing date `delay_ms` after `now_ms`, at most [`LATEST_DATE_MS`].
pub fn due_after(now_ms: i64, delay_ms: u64) -> i64 {
    now_ms
        .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX))
        .min(LATEST_DATE_MS)
}

/// A message beyond a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The MessageId is too long.
    #[error("the message id is {chars} characters long: ids are limited to {MAX_ID_CHARS}")]
    IdTooLong {
        /// Its length.
        chars: usize,
    },
    /// The payload is larger than the queue takes.
    #[error(
        "the payload is {bytes} bytes: queue `{queue}` takes at most {limit} bytes (`queues.{queue}.max_payload`)"
    )]
    PayloadTooLarge {
        /// The queue.
        queue: String,
        /// The payload's size.
        bytes: usize,
        /// The queue's `max_payload`.
        limit: u64,
    },
    /// A NUL character (U+0000) in a text the stores keep.
    #[error("the {field} contains a NUL character (U+0000), which no store accepts")]
    Nul {
        /// What holds it (`message id`, or ``header `NAME` ``).
        field: String,
    },
}

/// Check a message for `queue` (whose `max_payload` is `max_payload` bytes).
pub fn check(
    queue: &str,
    id: Option<&str>,
    payload: &str,
    max_payload: u64,
) -> Result<(), LimitError> {
    if let Some(id) = id {
        let chars = id.chars().count();
        if chars > MAX_ID_CHARS {
            return Err(LimitError::IdTooLong { chars });
        }
        if id.contains('\0') {
            return Err(LimitError::Nul {
                field: "message id".to_string(),
            });
        }
    }
    if payload.len() as u64 > max_payload {
        return Err(LimitError::PayloadTooLarge {
            queue: queue.to_string(),
            bytes: payload.len(),
            limit: max_payload,
        });
    }
    Ok(())
}

/// Check a message's headers: names and values without NUL characters.
pub fn check_headers(headers: &[(String, String)]) -> Result<(), LimitError> {
    match headers
        .iter()
        .find(|(name, value)| name.contains('\0') || value.contains('\0'))
    {
        Some((name, _)) => Err(LimitError::Nul {
            field: format!("header `{}`", name.escape_default()),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_counted_in_characters_and_payloads_in_bytes() {
        let longest = "€".repeat(MAX_ID_CHARS);
        assert_eq!(check("q", Some(&longest), "{}", 10), Ok(()));
        let over = "a".repeat(MAX_ID_CHARS + 1);
        assert_eq!(
            check("q", Some(&over), "{}", 10),
            Err(LimitError::IdTooLong {
                chars: MAX_ID_CHARS + 1
            })
        );
        assert_eq!(check("q", None, "1234567890", 10), Ok(()));
        let err = check("orders", None, "12345678901", 10).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the payload is 11 bytes: queue `orders` takes at most 10 bytes (`queues.orders.max_payload`)"
        );
        assert_eq!(
            check("q", Some("a\0b"), "{}", 10).unwrap_err().to_string(),
            "the message id contains a NUL character (U+0000), which no store accepts"
        );
        let headers = [
            ("ok".to_string(), "v".to_string()),
            ("t\0".to_string(), "v".to_string()),
        ];
        assert_eq!(
            check_headers(&headers).unwrap_err().to_string(),
            "the header `t\\u{0}` contains a NUL character (U+0000), which no store accepts"
        );
        assert_eq!(check_headers(&headers[..1]), Ok(()));
    }
}

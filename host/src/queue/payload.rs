//! Message values compared as JSON values, not bytes: the canonical hash of a payload is the
//! SHA-256 of its JSON re-serialized with sorted object keys and no insignificant whitespace,
//! so `{"a":1, "b":2}` and `{"b":2,"a":1}` are equal. Used by idempotent queues.

use sha2::{Digest, Sha256};

/// The canonical hash of a JSON payload (hex). Text that is not JSON hashes as raw bytes, so
/// it only equals itself.
pub fn canonical_hash(payload: &str) -> String {
    let canonical = match serde_json::from_str::<serde_json::Value>(payload) {
        // serde_json's map is ordered by key, so serializing sorts every object.
        Ok(value) => value.to_string(),
        Err(_) => format!("raw:{payload}"),
    };
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_hash_equal() {
        assert_eq!(
            canonical_hash(r#"{"a":1,"b":[1,2]}"#),
            canonical_hash("{ \"b\": [1, 2],\n \"a\": 1 }")
        );
        assert_eq!(
            canonical_hash(r#"{"s":"\u0041"}"#),
            canonical_hash(r#"{"s":"A"}"#)
        );
    }

    #[test]
    fn different_values_hash_different() {
        assert_ne!(canonical_hash(r#"{"a":1}"#), canonical_hash(r#"{"a":2}"#));
        assert_ne!(canonical_hash(r#"{"a":1}"#), canonical_hash(r#"{"a":"1"}"#));
        assert_ne!(canonical_hash(r#"[1,2]"#), canonical_hash(r#"[2,1]"#));
    }
}

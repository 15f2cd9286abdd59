//! The canonical hash of idempotent queues: two payloads hash alike exactly when they are the
//! same JSON value — whatever the key order, whitespace, escapes or number notation — and
//! any difference (one digit of a 40-digit integer included) changes the hash.

use proptest::prelude::*;
use wharf_host::queue::canonical_hash;

use super::json::{Json, compact, json, number, spelling, write};

proptest! {
    #![proptest_config(super::runner(256))]

    #[test]
    fn every_spelling_of_a_value_hashes_alike(value in json(false), a in spelling(), b in spelling()) {
        let (first, second) = (write(&value, &a), write(&value, &b));
        prop_assert!(serde_json::from_str::<serde_json::Value>(&first).is_ok(), "not JSON: {first}");
        prop_assert_eq!(canonical_hash(&first), canonical_hash(&second), "{} vs {}", first, second);
        prop_assert_eq!(canonical_hash(&first), canonical_hash(&compact(&value)));
    }

    #[test]
    fn different_values_hash_differently(a in json(true), b in json(true), sa in spelling(), sb in spelling()) {
        let equal = canonical_hash(&write(&a, &sa)) == canonical_hash(&write(&b, &sb));
        prop_assert_eq!(equal, a == b, "{} vs {}", compact(&a), compact(&b));
    }

    #[test]
    fn numbers_hash_alike_exactly_when_equal(a in number(), b in number(), sa in spelling(), sb in spelling()) {
        let (a, b) = (Json::Number(a), Json::Number(b));
        let equal = canonical_hash(&write(&a, &sa)) == canonical_hash(&write(&b, &sb));
        prop_assert_eq!(equal, a == b, "{} vs {}", write(&a, &sa), write(&b, &sb));
    }

    #[test]
    fn any_text_hashes_without_panicking(text in any::<String>()) {
        let hash = canonical_hash(&text);
        prop_assert_eq!(hash.len(), 64);
        // Text that is not JSON only equals itself.
        if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_err() {
            prop_assert_ne!(hash, canonical_hash(&format!("{text} ")));
        }
    }
}

#[test]
fn numbers_keep_every_digit() {
    let big = Json::Number(super::json::Number {
        negative: false,
        digits: "18446744073709551617".into(),
        exponent: 0,
    });
    assert_ne!(
        canonical_hash(&compact(&big)),
        canonical_hash("18446744073709551616")
    );
}

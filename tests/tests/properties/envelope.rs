//! The broker envelope parser: any body is either an envelope whose `MessageJson` is JSON or
//! an error that says why — never a panic — and every envelope survives its own wire format.

use proptest::prelude::*;
use wharf_host::external::{Envelope, EnvelopeError};

use super::json::{compact, json, spelling, write};

/// Bodies shaped like envelopes, with fields missing, extra, or of the wrong type.
fn envelope_like() -> impl Strategy<Value = String> {
    let field_value = prop_oneof![
        json(false).prop_map(|v| compact(&v)),
        json(false).prop_map(|v| serde_json::to_string(&compact(&v)).unwrap()),
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("null".to_string()),
    ];
    let name = prop_oneof![
        Just("MessageJson".to_string()),
        Just("MessageId".to_string()),
        Just("Priority".to_string()),
        "\\PC{0,10}",
    ];
    prop::collection::vec((name, field_value), 0..5).prop_map(|fields| {
        let members: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).unwrap()))
            .collect();
        format!("{{{}}}", members.join(","))
    })
}

proptest! {
    #![proptest_config(super::runner(256))]

    #[test]
    fn any_body_parses_or_says_why(body in prop_oneof![any::<String>(), envelope_like()]) {
        match Envelope::parse(&body) {
            Ok(envelope) => {
                prop_assert!(serde_json::from_str::<serde_json::Value>(&envelope.message_json).is_ok());
            }
            Err(EnvelopeError::Shape(reason)) | Err(EnvelopeError::MessageJson(reason)) => {
                prop_assert!(!reason.is_empty());
            }
        }
    }

    #[test]
    fn envelopes_survive_their_wire_format(
        message in json(false),
        written in spelling(),
        id in proptest::option::of(any::<String>()),
        priority in any::<i32>(),
    ) {
        let envelope = Envelope::new(write(&message, &written), id, priority);
        let body = envelope.to_json();
        prop_assert_eq!(Envelope::parse(&body).unwrap(), envelope);
    }

    #[test]
    fn a_message_json_that_is_not_json_is_named(text in any::<String>()) {
        prop_assume!(serde_json::from_str::<serde::de::IgnoredAny>(&text).is_err());
        let body = Envelope::new(text, None, 0).to_json();
        prop_assert!(matches!(Envelope::parse(&body), Err(EnvelopeError::MessageJson(_))));
    }
}

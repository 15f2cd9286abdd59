//! The external-pending envelope, the body every broker message carries:
//! `{"MessageJson": "<message JSON as a string>", "MessageId": "123" or null, "Priority": 0}`.
//! `MessageJson` is the serialized message, not a nested object.

use serde::{Deserialize, Serialize};

/// One message as stored in a broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The message JSON, serialized.
    #[serde(rename = "MessageJson")]
    pub message_json: String,
    /// The message id (identity and inbox MessageId), if any.
    #[serde(rename = "MessageId", default)]
    pub message_id: Option<String>,
    /// Higher runs first.
    #[serde(rename = "Priority", default)]
    pub priority: i32,
    /// The session key, carried by the broker's own ordering key (never in the body), in a
    /// queue with sessions.
    #[serde(skip)]
    pub session: Option<String>,
    /// The message's trace context (`traceparent`, `tracestate`), carried by the broker's own
    /// headers (RabbitMQ headers, Kafka record headers, Service Bus application properties),
    /// never in the body; Redis has no room for it.
    #[serde(skip)]
    pub trace: Vec<(String, String)>,
}

/// Why a broker body is not a valid envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Not the envelope object.
    #[error(
        "the body is not an external-pending envelope, which is the JSON object {{\"MessageJson\": \"<the message as JSON text>\", \"MessageId\": \"<id>\" or null, \"Priority\": <integer>}}: {0}"
    )]
    Shape(String),
    /// `MessageJson` is not JSON.
    #[error("the envelope's MessageJson is not valid JSON: {0}")]
    MessageJson(String),
}

impl Envelope {
    /// An envelope for `message_json`.
    pub fn new(message_json: impl Into<String>, message_id: Option<String>, priority: i32) -> Self {
        Envelope {
            message_json: message_json.into(),
            message_id,
            priority,
            session: None,
            trace: Vec::new(),
        }
    }

    /// This envelope carrying the trace context among `headers`.
    pub fn traced(self, headers: &[(String, String)]) -> Self {
        Envelope {
            trace: crate::headers::trace_context(headers),
            ..self
        }
    }

    /// Parse a broker body.
    pub fn parse(body: &str) -> Result<Envelope, EnvelopeError> {
        let envelope: Envelope =
            serde_json::from_str(body).map_err(|e| EnvelopeError::Shape(e.to_string()))?;
        serde_json::from_str::<serde::de::IgnoredAny>(&envelope.message_json)
            .map_err(|e| EnvelopeError::MessageJson(e.to_string()))?;
        Ok(envelope)
    }

    /// The body to store in a broker.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an envelope always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_exact() {
        let e = Envelope::new(r#"{"OrderId":"123"}"#, Some("123".into()), 0);
        assert_eq!(
            e.to_json(),
            r#"{"MessageJson":"{\"OrderId\":\"123\"}","MessageId":"123","Priority":0}"#
        );
        let none = Envelope::new("{}", None, -2);
        assert_eq!(
            none.to_json(),
            r#"{"MessageJson":"{}","MessageId":null,"Priority":-2}"#
        );
        assert_eq!(Envelope::parse(&e.to_json()).unwrap(), e);
    }

    #[test]
    fn invalid_bodies_say_why() {
        let error = Envelope::parse("not json").unwrap_err();
        assert!(matches!(error, EnvelopeError::Shape(_)));
        // The expected shape first, the parser's detail after it.
        assert!(
            error.to_string().starts_with(
                r#"the body is not an external-pending envelope, which is the JSON object {"MessageJson": "<the message as JSON text>", "MessageId": "<id>" or null, "Priority": <integer>}: expected ident"#
            ),
            "{error}"
        );
        // A nested object instead of the serialized string.
        assert!(matches!(
            Envelope::parse(r#"{"MessageJson":{"OrderId":"1"},"MessageId":null,"Priority":0}"#),
            Err(EnvelopeError::Shape(_))
        ));
        assert!(matches!(
            Envelope::parse(r#"{"MessageJson":"{oops","MessageId":null,"Priority":0}"#),
            Err(EnvelopeError::MessageJson(_))
        ));
    }
}

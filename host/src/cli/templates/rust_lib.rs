//! {{name}}: a Wharf message handler. `handle` runs once per message, on a fresh instance.
//! It uses the `wharf-guest` SDK, copied into `wharf-guest/` with the WIT contract in `wit/`.

use serde::Deserialize;
use wharf_guest::{Handler, HandlerError, Message, Outcome, export_handler, log};

/// The message this handler expects (its payload is JSON).
#[derive(Deserialize)]
struct Greeting {
    #[serde(default)]
    name: Option<String>,
}

struct Greeter;

impl Handler for Greeter {
    // Any JSON: the handler checks it itself. Name a type (`type Payload = Greeting;`) to have
    // the SDK deserialize it and fail a payload that does not match, permanently.
    type Payload = serde_json::Value;

    fn handle(message: Message<serde_json::Value>) -> Result<Outcome, HandlerError> {
        // Bad data never succeeds: a permanent error fails the message at once, kept for
        // inspection with this text.
        let bad = |why: String| HandlerError::permanent(format!("not the expected payload: {why}"));
        if !message.payload.is_object() {
            return Err(bad("expected a JSON object".to_string()));
        }
        let greeting: Greeting =
            serde_json::from_value(message.payload.clone()).map_err(|e| bad(e.to_string()))?;
        let name = greeting.name.unwrap_or_else(|| "world".to_string());
        log::info(&format!("hello, {name} (attempt {})", message.attempt));
        // Follow-up messages go to other queues; a refused enqueue is worth another attempt.
        if let Some(queue) = message.header("reply-to") {
            let reply = serde_json::json!({ "greeting": format!("hello, {name}") });
            wharf_guest::enqueue(queue, &reply).map_err(HandlerError::transient)?;
        }
        Ok(Outcome::Completed)
    }
}

export_handler!(Greeter);

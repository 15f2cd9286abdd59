//! {{name}}: a Wharf message handler. `handle` runs once per message, on a fresh instance.

wit_bindgen::generate!({ path: "wit", world: "handler" });

use serde::Deserialize;
use wharf::handler::host::{enqueue, log};
use wharf::handler::types::{EnqueueOptions, Level};
// `Message`, `Outcome` and `HandlerError` come with the world (`use types.{…}` in the WIT).

/// The message this handler expects (its payload is JSON).
#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    name: Option<String>,
}

struct Handler;

impl Guest for Handler {
    fn handle(message: Message) -> Result<Outcome, HandlerError> {
        // Bad data never succeeds: a permanent error fails the message at once, kept for
        // inspection with this text.
        let bad = |why: String| HandlerError::Permanent(format!("not the expected payload: {why}"));
        let value: serde_json::Value =
            serde_json::from_str(&message.payload).map_err(|e| bad(e.to_string()))?;
        if !value.is_object() {
            return Err(bad("expected a JSON object".to_string()));
        }
        let payload: Payload = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        let name = payload.name.unwrap_or_else(|| "world".to_string());
        log(Level::Info, &format!("hello, {name} (attempt {})", message.attempt));
        // Follow-up messages go to other queues; a refused enqueue is worth another attempt.
        if let Some(queue) = message.headers.iter().find(|(k, _)| k == "reply-to").map(|(_, v)| v) {
            let options = EnqueueOptions { id: None, priority: None, delay_ms: None, headers: vec![] };
            let reply = serde_json::json!({ "greeting": format!("hello, {name}") }).to_string();
            enqueue(queue, &reply, &options).map_err(HandlerError::Transient)?;
        }
        Ok(Outcome::Completed)
    }
}

export!(Handler);

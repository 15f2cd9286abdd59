//! The header names Wharf reserves, and the W3C trace-context headers it carries, in one
//! place. Message headers (SQL queue rows, guest
//! `enqueue` options) use dotted `wharf.` names; RabbitMQ's own headers use `wharf-` names,
//! which direct producers set too, so they are part of that provider's wire format.

/// The reserved header through which a guest gives a message's session key (the WIT
/// contract stays at 0.1.0, so guests built against it keep working).
pub const SESSION: &str = "wharf.session";

/// The reserved header a guest sets (any value) on a follow-up that must go out at once,
/// even if the handler then fails (a progress event): written or published when `enqueue` is
/// called, outside the guarantee that follow-ups exist only for a successful attempt. The host
/// removes it before storing the message.
pub const SEND_NOW: &str = "wharf.send-now";

/// The header a message moved in from an external provider carries (the provider name).
pub const MOVED_FROM: &str = "wharf.provider";

/// The header of a message kept in the SQL queue only until it is due, then published into
/// the queue's provider (the provider name).
pub const DEFERRED_PUBLISH: &str = "wharf.publish-to";

/// RabbitMQ: the header carrying the identity Wharf publishes every message with (unique
/// per message, the same on redeliveries): the host counts redeliveries under it.
pub const RABBITMQ_IDENTITY: &str = "wharf-message-key";

/// RabbitMQ: the header that carries a message's session key (a direct producer sets it
/// too).
pub const RABBITMQ_SESSION: &str = "wharf-session";

/// The W3C header that carries a message's trace id, its sending span and the sampled flag.
pub const TRACEPARENT: &str = "traceparent";

/// The W3C header that carries vendor-specific trace state beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// The value of header `name` (any case) in `headers`.
pub fn value<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The trace-context headers among `headers` (`traceparent`, `tracestate`; names in any
/// case), as a broker carries them beside the envelope.
pub fn trace_context(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(TRACEPARENT) || k.eq_ignore_ascii_case(TRACESTATE))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect()
}

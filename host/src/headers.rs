//! The header names Wharf reserves, in one place. Message headers (SQL queue rows, guest
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

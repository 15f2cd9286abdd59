//! What an enqueue does to an existing message with the same id: discard it (idempotent
//! queue, equal values), defer it (the message is leased: AwaitingRelease), or replace it.
//! Shared by every store so the rules live in one place.

use super::Status;

/// The existing message, as far as the decision needs it.
#[derive(Debug, Clone)]
pub struct Existing {
    /// Its status.
    pub status: Status,
    /// Canonical hash of its payload.
    pub payload_hash: String,
    /// Canonical hash of the version waiting for release, if any.
    pub next_payload_hash: Option<String>,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Identical to the latest version in an idempotent queue: change nothing.
    Discard,
    /// Leased: keep the lease and the running version; store this one for after release.
    Defer,
    /// Not leased: record the old version in history and overwrite it.
    Replace,
}

/// Decide what enqueueing a payload with `incoming_hash` does to `existing`.
pub fn plan(existing: &Existing, incoming_hash: &str, idempotent: bool) -> Plan {
    let latest = existing
        .next_payload_hash
        .as_deref()
        .unwrap_or(&existing.payload_hash);
    if idempotent && latest == incoming_hash {
        return Plan::Discard;
    }
    match existing.status {
        Status::Processing | Status::AwaitingRelease => Plan::Defer,
        _ => Plan::Replace,
    }
}

/// The status a new version takes: its custom destination, else sleeping when its
/// processing date is in the future, else pending.
pub fn destination(custom: Option<&Status>, process_at_ms: i64, now_ms: i64) -> Status {
    match custom {
        Some(status) => status.clone(),
        None if process_at_ms > now_ms => Status::Sleeping,
        None => Status::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn existing(status: Status, hash: &str, next: Option<&str>) -> Existing {
        Existing {
            status,
            payload_hash: hash.into(),
            next_payload_hash: next.map(Into::into),
        }
    }

    #[test]
    fn idempotent_discards_only_equal_latest_values() {
        assert_eq!(
            plan(&existing(Status::Processed, "h1", None), "h1", true),
            Plan::Discard
        );
        assert_eq!(
            plan(&existing(Status::Processed, "h1", None), "h1", false),
            Plan::Replace
        );
        assert_eq!(
            plan(&existing(Status::Processed, "h1", None), "h2", true),
            Plan::Replace
        );
        // While awaiting release the latest version is the deferred one.
        assert_eq!(
            plan(
                &existing(Status::AwaitingRelease, "h1", Some("h2")),
                "h2",
                true
            ),
            Plan::Discard
        );
        assert_eq!(
            plan(
                &existing(Status::AwaitingRelease, "h1", Some("h2")),
                "h1",
                true
            ),
            Plan::Defer
        );
    }

    #[test]
    fn leased_messages_defer_everything_else_replaces() {
        for s in [Status::Processing, Status::AwaitingRelease] {
            assert_eq!(plan(&existing(s, "a", None), "b", false), Plan::Defer);
        }
        for s in [
            Status::Pending,
            Status::Sleeping,
            Status::Failed,
            Status::Processed,
            Status::Custom("on-hold".into()),
        ] {
            assert_eq!(plan(&existing(s, "a", None), "b", false), Plan::Replace);
        }
    }

    #[test]
    fn destinations() {
        assert_eq!(destination(None, 100, 200), Status::Pending);
        assert_eq!(destination(None, 300, 200), Status::Sleeping);
        let parked = Status::Custom("on-hold".into());
        assert_eq!(destination(Some(&parked), 300, 200), parked);
    }
}

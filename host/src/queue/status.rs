//! Message statuses and their stored names.

use std::fmt;

/// Where a message is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Ready to be leased (its processing date has come).
    Pending,
    /// Leased by a processor.
    Processing,
    /// Handled successfully; kept as history.
    Processed,
    /// Gave up: a permanent error or no attempts left. Kept with its last error.
    Failed,
    /// Scheduled for later (a delayed message or a retry waiting for its backoff).
    Sleeping,
    /// Re-enqueued while leased: the new version waits for the current processor.
    AwaitingRelease,
    /// A message of a blocked session, waiting behind the message that blocks it; drained
    /// in order once that message is resolved.
    Parked,
    /// A session message whose handler returned a pending handoff: it blocks its session
    /// until an operator settles it (`wharf messages complete|fail`).
    HandedOff,
    /// A status named by an operator; kept and not processed until moved.
    Custom(String),
}

impl Status {
    /// The name stored in the database and shown to users.
    pub fn as_str(&self) -> &str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Processed => "processed",
            Status::Failed => "failed",
            Status::Sleeping => "sleeping",
            Status::AwaitingRelease => "awaiting-release",
            Status::Parked => "parked",
            Status::HandedOff => "handed-off",
            Status::Custom(name) => name,
        }
    }

    /// Read a stored or user-given name; any unknown name is a custom status.
    pub fn parse(name: &str) -> Status {
        match name {
            "pending" => Status::Pending,
            "processing" => Status::Processing,
            "processed" => Status::Processed,
            "failed" => Status::Failed,
            "sleeping" => Status::Sleeping,
            "awaiting-release" => Status::AwaitingRelease,
            "parked" => Status::Parked,
            "handed-off" => Status::HandedOff,
            other => Status::Custom(other.to_string()),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in [
            Status::Pending,
            Status::Processing,
            Status::Processed,
            Status::Failed,
            Status::Sleeping,
            Status::AwaitingRelease,
            Status::Parked,
            Status::HandedOff,
            Status::Custom("on-hold".into()),
        ] {
            assert_eq!(Status::parse(s.as_str()), s);
        }
    }
}

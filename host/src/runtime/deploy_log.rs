//! The deploy log: the most recent handler files the host accepted, rejected (with the
//! reason) or saw removed, newest first, for the admin API.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;

/// Most events kept.
pub const KEPT: usize = 200;

/// What happened to a handler file.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeployResult {
    /// A new version is serving.
    Deployed,
    /// The file was rejected; the previous version (if any) keeps serving.
    Rejected,
    /// The file was removed; the handler no longer serves.
    Removed,
}

/// One entry of the deploy log.
#[derive(Debug, Clone, Serialize)]
pub struct DeployEvent {
    /// When, RFC 3339.
    pub at: String,
    /// Handler name.
    pub handler: String,
    /// The file.
    pub file: String,
    /// What happened.
    pub result: DeployResult,
    /// SHA-256 of a deployed file.
    pub sha256: Option<String>,
    /// Why a file was rejected.
    pub reason: Option<String>,
}

/// The recent deploy events.
#[derive(Default)]
pub struct DeployLog {
    events: Mutex<VecDeque<DeployEvent>>,
}

impl DeployLog {
    /// Add an event (the oldest is dropped past [`KEPT`]).
    pub fn record(
        &self,
        handler: &str,
        file: &std::path::Path,
        result: DeployResult,
        sha256: Option<String>,
        reason: Option<String>,
    ) {
        let event = DeployEvent {
            at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            handler: handler.to_string(),
            file: file.display().to_string(),
            result,
            sha256,
            reason,
        };
        let mut events = self.events.lock().expect("deploy log");
        events.push_front(event);
        events.truncate(KEPT);
    }

    /// The kept events, newest first.
    pub fn recent(&self) -> Vec<DeployEvent> {
        self.events
            .lock()
            .expect("deploy log")
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_events_first() {
        let log = DeployLog::default();
        for n in 0..KEPT + 5 {
            log.record(
                &format!("h{n}"),
                std::path::Path::new("x.wasm"),
                DeployResult::Deployed,
                None,
                None,
            );
        }
        let recent = log.recent();
        assert_eq!(recent.len(), KEPT);
        assert_eq!(recent[0].handler, format!("h{}", KEPT + 4));
    }
}

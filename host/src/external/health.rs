//! The readiness health of one provider (`external_queue_readiness_{provider}` on
//! `/readyz`): unhealthy until its readiness consumer started, and while any part of it — the
//! readiness bridge, a queue's processing consumer, its acknowledgements — is failing;
//! healthy again once every failing part succeeded again. A provider without external queues
//! is healthy and opens no consumer. Each change is logged once.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::admin::HealthCheck;

#[derive(Debug)]
struct State {
    started: bool,
    detail: String,
    /// Failing parts and why.
    failing: BTreeMap<String, String>,
}

/// The readiness state of one provider.
#[derive(Debug)]
pub struct ProviderHealth {
    provider: String,
    state: Mutex<State>,
}

/// The part of a provider the readiness bridge reports as.
pub const BRIDGE: &str = "readiness consumer";

impl ProviderHealth {
    /// A provider whose consumer has not started yet.
    pub fn not_started(provider: &str) -> Self {
        ProviderHealth {
            provider: provider.to_string(),
            state: Mutex::new(State {
                started: false,
                detail: String::new(),
                failing: BTreeMap::new(),
            }),
        }
    }

    /// A provider no queue uses: healthy without a consumer.
    pub fn idle(provider: &str) -> Self {
        ProviderHealth {
            provider: provider.to_string(),
            state: Mutex::new(State {
                started: true,
                detail: "no external queues use this provider; no consumer opened".into(),
                failing: BTreeMap::new(),
            }),
        }
    }

    /// The readiness bridge works (`detail` says how).
    pub fn succeeded(&self, detail: &str) {
        let mut state = self.state.lock().expect("health state");
        state.started = true;
        state.detail = detail.to_string();
        drop(state);
        self.part_succeeded(BRIDGE);
    }

    /// The readiness bridge failed (logged once per change of reason).
    pub fn failed(&self, reason: String) {
        self.part_failed(BRIDGE, reason);
    }

    /// `part` (e.g. `queue export_order`) works (again).
    pub fn part_succeeded(&self, part: &str) {
        let mut state = self.state.lock().expect("health state");
        if let Some(reason) = state.failing.remove(part) {
            tracing::info!(provider = %self.provider, "{part} works again (was failing: {reason})");
        }
    }

    /// `part` failed (logged once per change of reason).
    pub fn part_failed(&self, part: &str, reason: String) {
        let mut state = self.state.lock().expect("health state");
        if state.failing.get(part) != Some(&reason) {
            tracing::error!(provider = %self.provider, "{part} failing: {reason}");
        }
        state.failing.insert(part.to_string(), reason);
    }

    /// `part` failed, where the caller logs the outage itself.
    pub fn part_failed_quietly(&self, part: &str, reason: String) {
        let mut state = self.state.lock().expect("health state");
        state.failing.insert(part.to_string(), reason);
    }
}

#[async_trait]
impl HealthCheck for ProviderHealth {
    async fn check(&self) -> Result<String, String> {
        let state = self.state.lock().expect("health state");
        if !state.failing.is_empty() {
            let reasons: Vec<String> = state
                .failing
                .iter()
                .map(|(part, reason)| format!("{part}: {reason}"))
                .collect();
            return Err(reasons.join("; "));
        }
        if !state.started {
            return Err("the readiness consumer has not started".into());
        }
        Ok(state.detail.clone())
    }
}

//! The readiness health of one provider (`external_queue_readiness_{provider}` on
//! `/readyz`): unhealthy until its consumer started and while a connection, notification or
//! acknowledgement operation fails; healthy again after the consumer succeeds again. A
//! provider without external queues is healthy and opens no consumer.

use std::sync::Mutex;

use async_trait::async_trait;

use crate::admin::HealthCheck;

#[derive(Debug, Clone)]
enum State {
    NotStarted,
    Healthy(String),
    Failing(String),
}

/// The readiness state of one provider.
#[derive(Debug)]
pub struct ProviderHealth {
    provider: String,
    state: Mutex<State>,
}

impl ProviderHealth {
    /// A provider whose consumer has not started yet.
    pub fn not_started(provider: &str) -> Self {
        ProviderHealth {
            provider: provider.to_string(),
            state: Mutex::new(State::NotStarted),
        }
    }

    /// A provider no queue uses: healthy without a consumer.
    pub fn idle(provider: &str) -> Self {
        ProviderHealth {
            provider: provider.to_string(),
            state: Mutex::new(State::Healthy(
                "no external queues use this provider; no consumer opened".into(),
            )),
        }
    }

    /// The consumer succeeded.
    pub fn succeeded(&self, detail: &str) {
        let mut state = self.state.lock().expect("health state");
        if let State::Failing(reason) = &*state {
            tracing::info!(provider = %self.provider, "readiness consumer works again (was failing: {reason})");
        }
        *state = State::Healthy(detail.to_string());
    }

    /// An operation failed (logged once per change of reason).
    pub fn failed(&self, reason: String) {
        let mut state = self.state.lock().expect("health state");
        if !matches!(&*state, State::Failing(r) if *r == reason) {
            tracing::error!(provider = %self.provider, "readiness consumer failing: {reason}");
        }
        *state = State::Failing(reason);
    }
}

#[async_trait]
impl HealthCheck for ProviderHealth {
    async fn check(&self) -> Result<String, String> {
        match &*self.state.lock().expect("health state") {
            State::NotStarted => Err("the readiness consumer has not started".into()),
            State::Healthy(detail) => Ok(detail.clone()),
            State::Failing(reason) => Err(reason.clone()),
        }
    }
}

//! The readiness health of one provider (`external_queue_readiness_{provider}` on
//! `/readyz`): unhealthy until its readiness consumer started, and while any part of it — the
//! readiness bridge, a queue's processing consumer, its acknowledgements — is failing;
//! healthy again once every failing part succeeded again. A provider without external queues
//! is healthy and opens no consumer. Each change is logged once. [`run_probe`] adds the
//! broker probe as one more part, for brokers whose connections cannot tell a silent network
//! cut by themselves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::Provider;
use crate::health::HealthCheck;

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

/// The part of a provider the broker probe reports as.
pub const PROBE: &str = "broker probe";

/// Probe `provider` about `queues` every `interval` until `shutdown`: a probe that fails, or
/// gets no answer within `interval`, marks the provider unhealthy until one succeeds.
pub async fn run_probe(
    provider: Arc<dyn Provider>,
    queues: Vec<String>,
    health: Arc<ProviderHealth>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let probe = tokio::time::timeout(interval, provider.probe(&queues, interval));
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            outcome = probe => outcome,
        };
        match outcome {
            Ok(Ok(())) => health.part_succeeded(PROBE),
            Ok(Err(e)) => health.part_failed(PROBE, e.to_string()),
            Err(_) => health.part_failed(PROBE, format!("no answer within {interval:?}")),
        }
    }
}

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

    /// A provider whose queues all have no handler: published to, never consumed here.
    pub fn holding(provider: &str) -> Self {
        let health = Self::idle(provider);
        health.state.lock().expect("health state").detail =
            "its queues have no handler: they are published to and never consumed here".into();
        health
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

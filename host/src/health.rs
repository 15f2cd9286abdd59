//! Named health checks, reported together on `/readyz` (and counted in the metrics). The SQL
//! store and each external provider register theirs; the admin server only reads them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// One named check.
#[async_trait]
pub trait HealthCheck: Send + Sync + 'static {
    /// `Ok(detail)` when healthy, `Err(reason)` when not.
    async fn check(&self) -> Result<String, String>;
}

/// The result of one check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    /// Whether it passed.
    pub healthy: bool,
    /// Detail or failure reason.
    pub detail: String,
}

/// All registered checks.
#[derive(Default)]
pub struct HealthRegistry {
    checks: RwLock<BTreeMap<String, Arc<dyn HealthCheck>>>,
}

impl HealthRegistry {
    /// Add (or replace) a check under `name`.
    pub fn register(&self, name: impl Into<String>, check: Arc<dyn HealthCheck>) {
        self.checks
            .write()
            .expect("health registry")
            .insert(name.into(), check);
    }

    /// Run every check; the first value is true when all passed.
    pub async fn report(&self) -> (bool, BTreeMap<String, CheckReport>) {
        let checks: Vec<_> = self
            .checks
            .read()
            .expect("health registry")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut all = true;
        let mut out = BTreeMap::new();
        for (name, check) in checks {
            let (healthy, detail) = match check.check().await {
                Ok(d) => (true, d),
                Err(e) => (false, e),
            };
            all &= healthy;
            out.insert(name, CheckReport { healthy, detail });
        }
        (all, out)
    }
}

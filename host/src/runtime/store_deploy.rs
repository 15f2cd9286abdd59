//! Handlers from the shared store (`[host] handlers_source = "store"`): at start a host serves
//! the current version of every handler in the queue's SQL store, then follows changes — the
//! `NOTIFY` of a deploy or rollback (PostgreSQL) and a poll every [`POLL`] — compiling a new
//! current version off the async threads (or reading it from the compiled cache) and swapping
//! it in; in-flight calls finish on the version that started them. Each version a host serves
//! or rejects goes to the store's deploy log with the host's id and the moment; a rejected
//! version is not tried again until the current version changes, and the previous one keeps
//! serving. The handlers directory is not read or watched in this mode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::deploy_log::DeployResult;
use super::registry::{HandlerRegistry, LoadOutcome};
use crate::queue::{CurrentVersion, QueueStore, ServedVersion};

/// How often a host looks for a changed current version besides the notifications.
pub const POLL: Duration = Duration::from_secs(2);

/// A host's follower of the store's current handler versions.
pub struct StoreDeploys {
    registry: Arc<HandlerRegistry>,
    store: Arc<dyn QueueStore>,
    host: String,
    /// The version of each handler this host served or rejected and recorded so.
    done: Mutex<HashMap<String, i64>>,
}

impl StoreDeploys {
    /// Follow the store for `registry`, recording as host `host`.
    pub fn new(registry: Arc<HandlerRegistry>, store: Arc<dyn QueueStore>, host: String) -> Self {
        StoreDeploys {
            registry,
            store,
            host,
            done: Mutex::default(),
        }
    }

    /// Bring every handler to its current version in the store; returns how many serve.
    pub async fn sync(&self) -> usize {
        use futures_util::StreamExt;
        let current = match self.store.handler_current().await {
            Ok(current) => current,
            Err(e) => {
                tracing::error!(
                    "reading the handlers' current versions from the store failed (trying again in {}s): {e}",
                    POLL.as_secs()
                );
                return self.registry.list().len();
            }
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        futures_util::stream::iter(current)
            .map(|c| self.apply(c))
            .buffer_unordered(cores)
            .count()
            .await;
        self.registry.list().len()
    }

    /// Serve `current` unless this host already served or rejected it.
    async fn apply(&self, current: CurrentVersion) {
        let name = current.name.clone();
        if self.done.lock().expect("done").get(&name) == Some(&current.version) {
            return;
        }
        let bytes = match self.store.handler_component(&name, current.version).await {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!(handler = %name, version = current.version, "reading the handler's component from the store failed (trying again): {e}");
                return;
            }
        };
        let registry = self.registry.clone();
        let (n, version) = (name.clone(), current.version);
        let outcome =
            tokio::task::spawn_blocking(move || registry.load_stored(&n, version, &bytes)).await;
        let path = std::path::PathBuf::from(format!("store:{name}@{version}"));
        let record = match outcome {
            Ok(Ok(outcome)) => {
                let serving = self.registry.get(&name).expect("just deployed");
                if let LoadOutcome::Deployed { hash, millis, .. } = &outcome {
                    crate::metrics::deploy(&name, "deployed");
                    self.registry.deploys.record(
                        &name,
                        &path,
                        DeployResult::Deployed,
                        Some(hash.clone()),
                        None,
                    );
                    tracing::info!(handler = %name, version, sha256 = &hash[..16], millis, "handler version from the store deployed");
                }
                ServedVersion {
                    host: self.host.clone(),
                    name: name.clone(),
                    version,
                    since_ms: ms(serving.loaded_at),
                    result: "serving".into(),
                    error: None,
                }
            }
            Ok(Err(e)) => {
                crate::metrics::deploy(&name, "rejected");
                self.registry.deploys.record(
                    &name,
                    &path,
                    DeployResult::Rejected,
                    None,
                    Some(e.to_string()),
                );
                match self.registry.get(&name) {
                    Some(old) => {
                        tracing::error!(handler = %name, version, "rejected the store's current version: {e}; the previous version ({}) keeps serving", old.path.display())
                    }
                    None => {
                        tracing::error!(handler = %name, version, "rejected the store's current version: {e}; no version of this handler is serving")
                    }
                }
                ServedVersion {
                    host: self.host.clone(),
                    name: name.clone(),
                    version,
                    since_ms: crate::clock::now_ms(),
                    result: "rejected".into(),
                    error: Some(e.to_string()),
                }
            }
            Err(join) => {
                tracing::error!(handler = %name, version, "loading the handler panicked: {join}");
                return;
            }
        };
        match self.store.handler_record(&record).await {
            Ok(()) => {
                self.done.lock().expect("done").insert(name, version);
            }
            Err(e) => {
                tracing::error!(handler = %name, version, "recording the deploy in the store failed (trying again): {e}")
            }
        }
    }

    /// Follow the store until `shutdown`: sync on every notification and every [`POLL`].
    pub fn follow(self: Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let changed = Arc::new(tokio::sync::Notify::new());
        let wake = changed.clone();
        let listener = self.store.listen_handlers(
            Arc::new(move |_: Option<&str>| wake.notify_one()),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = changed.notified() => {}
                    _ = tokio::time::sleep(POLL) => {}
                }
                self.sync().await;
            }
            if let Some(listener) = listener {
                let _ = listener.await;
            }
        })
    }
}

fn ms(at: std::time::SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

//! Hot deploy: load every `NAME.wasm` in the handlers directory at start, then watch it.
//! A changed file is compiled off the async threads after a quiet period (debounce) and
//! swapped in, several files at once (one per core); a file that fails is logged with its reason while the previous version keeps
//! serving; a removed file stops new dispatch to that handler (its messages stay pending).
//!
//! Deploy atomically by writing elsewhere and renaming: `cp new.wasm handlers/.x.tmp &&
//! mv handlers/.x.tmp handlers/NAME.wasm`. Only names ending in `.wasm` are loaded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio_util::sync::CancellationToken;

use super::deploy_log::DeployResult;
use super::registry::{HandlerRegistry, LoadOutcome, Origin};

/// The handler files in `dir` (creating `dir` if missing), for [`load`].
pub fn handler_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| HandlerRegistry::name_of(p).is_some())
        .collect();
    files.sort();
    Ok(files)
}

/// Load `files` (a few at a time, one compile per core, so a handler that compiles in a
/// fraction of a second does not wait behind one that takes many). Failures are logged;
/// returns how many serve.
pub async fn load(registry: &Arc<HandlerRegistry>, files: Vec<PathBuf>) -> usize {
    apply_all(registry, files).await
}

async fn apply_all(
    registry: &Arc<HandlerRegistry>,
    paths: impl IntoIterator<Item = PathBuf>,
) -> usize {
    use futures_util::StreamExt;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    futures_util::stream::iter(paths)
        .map(|path| apply(registry, path))
        .buffer_unordered(cores)
        .filter(|serving| std::future::ready(*serving))
        .count()
        .await
}

/// Whether a watch event can mean the file's content or presence changed. Opening and
/// reading a file are events too (inotify reports them): the host reads a file to deploy it,
/// so reacting to reads would redeploy — and re-reject a broken file — forever.
fn may_change(kind: &EventKind) -> bool {
    !matches!(
        kind,
        EventKind::Access(
            AccessKind::Open(_) | AccessKind::Read | AccessKind::Close(AccessMode::Read)
        )
    )
}

/// What the watcher passes on: a handler file that may have changed, or "look at every
/// file again" (the kernel's event queue overflowed, so some events were lost).
enum Change {
    File(PathBuf),
    Rescan,
}

/// Watch `dir` until `shutdown`, deploying and removing handlers as files change. Changed
/// handler files are gathered until no event about them arrived for `debounce` (or for at
/// most ten times that from the first one, so a busy directory cannot hold deploys back
/// forever), then applied together.
pub fn watch(
    registry: Arc<HandlerRegistry>,
    dir: PathBuf,
    debounce: Duration,
    shutdown: CancellationToken,
) -> notify::Result<tokio::task::JoinHandle<()>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Change>();
    let mut watcher =
        notify::recommended_watcher(move |result: notify::Result<notify::Event>| match result {
            Ok(event) if event.need_rescan() => {
                let _ = tx.send(Change::Rescan);
            }
            Ok(event) if may_change(&event.kind) => {
                for path in event.paths {
                    if HandlerRegistry::name_of(&path).is_some() {
                        let _ = tx.send(Change::File(path));
                    }
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!("watching the handlers directory failed: {e}"),
        })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    tracing::info!(dir = %dir.display(), "watching for handler deployments");
    Ok(tokio::spawn(async move {
        let _watcher = watcher;
        let mut changed = BTreeSet::new();
        let mut first_at = tokio::time::Instant::now();
        loop {
            let quiet = tokio::time::sleep(debounce);
            let longest = tokio::time::sleep_until(first_at + debounce * 10);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                change = rx.recv() => {
                    if changed.is_empty() {
                        first_at = tokio::time::Instant::now();
                    }
                    match change {
                        Some(Change::File(path)) => { changed.insert(path); }
                        Some(Change::Rescan) => {
                            tracing::warn!(dir = %dir.display(), "file events were lost: checking every handler file again");
                            changed.extend(every_handler_path(&registry, &dir));
                        }
                        None => break,
                    }
                }
                _ = async { tokio::select! { _ = quiet => {}, _ = longest => {} } }, if !changed.is_empty() => {
                    apply_all(&registry, std::mem::take(&mut changed)).await;
                }
            }
        }
    }))
}

/// Every handler file in `dir` and every deployed handler's file (which may be gone).
fn every_handler_path(registry: &HandlerRegistry, dir: &Path) -> BTreeSet<PathBuf> {
    let mut paths: BTreeSet<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| HandlerRegistry::name_of(p).is_some())
        .collect();
    paths.extend(registry.list().iter().map(|h| h.path.clone()));
    paths
}

/// Bring one file's state into the registry: deploy it if present, remove it if gone.
/// Returns whether a version of it is serving afterwards.
async fn apply(registry: &Arc<HandlerRegistry>, path: PathBuf) -> bool {
    let Some(name) = HandlerRegistry::name_of(&path) else {
        return false;
    };
    if !path.exists() {
        if registry.remove(&name) {
            crate::metrics::deploy(&name, "removed");
            registry
                .deploys
                .record(&name, &path, DeployResult::Removed, None, None);
            tracing::warn!(handler = %name, file = %path.display(), "handler file removed: no new messages are dispatched to it; its messages stay pending");
        }
        return false;
    }
    let reg = registry.clone();
    let file = path.clone();
    let outcome = tokio::task::spawn_blocking(move || reg.load_file(&file)).await;
    match outcome {
        Ok(Ok(LoadOutcome::Deployed {
            name,
            hash,
            origin,
            millis,
        })) => {
            let source = match origin {
                Origin::Compiled => "compiled",
                Origin::Cached => "cache",
                Origin::Shared => "shared with an identical handler",
            };
            crate::metrics::deploy(&name, "deployed");
            registry.deploys.record(
                &name,
                &path,
                DeployResult::Deployed,
                Some(hash.clone()),
                None,
            );
            tracing::info!(
                handler = %name, file = %path.display(), sha256 = &hash[..16],
                source, millis,
                "handler deployed"
            );
            if !registry.serves_a_queue(&name) {
                tracing::warn!(handler = %name, file = %path.display(), "handler `{name}` is deployed but no queue uses it: set handler = \"{name}\" in a [queues.NAME] table of {}", registry.config_file().display());
            }
            true
        }
        Ok(Ok(LoadOutcome::Unchanged { .. })) => true,
        Ok(Err(e)) => {
            crate::metrics::deploy(&name, "rejected");
            registry.deploys.record(
                &name,
                &path,
                DeployResult::Rejected,
                None,
                Some(e.to_string()),
            );
            let serving = registry.get(&name);
            match &serving {
                Some(old) => {
                    tracing::error!(handler = %name, "rejected handler file {e}; the previous version (sha256 {}) keeps serving", &old.hash[..16])
                }
                None => {
                    tracing::error!(handler = %name, "rejected handler file {e}; no version of this handler is serving")
                }
            }
            serving.is_some()
        }
        Err(join) => {
            tracing::error!(handler = %name, file = %path.display(), "loading the handler panicked: {join}");
            registry.get(&name).is_some()
        }
    }
}
